"""Reading and writing draft folders in the SGLang / SpecForge layout, plus our `eaglekit` block.

config.json: architectures ["LlamaForCausalLMEagle3"], model_type llama, the usual Llama fields with
num_hidden_layers 1, draft_vocab_size, optional target_hidden_size, and
eagle_config.eagle_aux_hidden_state_layer_ids (SGLang's "output of layer" ids, the same numbers as our
after_layers). The `eaglekit` block records the capture in our convention and the target's fingerprint;
a folder without it (written by SpecForge or others) loads as is, its ids read in SGLang's meaning.
model.safetensors: fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t (offsets), t2d, optional
embed_tokens.weight.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from .. import __version__
from ..capture import CaptureSpec
from ..errors import ContractError, InputError
from ..io import atomic_write_json, save_tensors
from ..models.config import _rope_from, rope_json
from ..models.layers import Rotary
from ..models.weights import load_state_dict_into
from .model import DraftConfig, Eagle3Draft

def config_from_json(raw: dict, where: str, fc_in: int | None = None, capture: CaptureSpec | None = None
                     ) -> DraftConfig:
    """A DraftConfig from a config in the SGLang layout; `capture` comes converted to after_layers by the
    format reader (eaglekit.interop.formats), which knows the convention the folder's ids were written in."""
    try:
        H = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        vocab = int(raw["vocab_size"])
    except KeyError as e:
        raise InputError(f"{where} lacks the field {e.args[0]!r}", fix="re-export the draft", code="E102") from None
    t_hidden = raw.get("target_hidden_size")
    block = raw.get("eaglekit") or {}
    num_captures = capture.num_captures if capture else 3
    if capture is None and fc_in is not None:
        th = int(t_hidden or H)
        if fc_in % th == 0:
            num_captures = fc_in // th
    target = block.get("target") or {}
    return DraftConfig(
        hidden_size=H,
        intermediate_size=int(raw.get("intermediate_size", 4 * H)),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw["head_dim"]) if raw.get("head_dim") else None,
        vocab_size=vocab,
        draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
        target_hidden_size=int(t_hidden) if t_hidden and int(t_hidden) != H else None,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=_rope_from(raw),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        capture=capture,
        num_captures=num_captures,
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        norm_before_fc=bool(raw.get("norm_before_fc", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        fc_bias=bool(raw.get("bias", False)),  # SGLang's `bias` is the fc's
        target_fingerprint=target.get("fingerprint"),
        target_vocab_size=target.get("vocab_size"),
        target_num_layers=target.get("num_layers"),
        target_tokenizer=target.get("tokenizer"),
        vocab_map_sha=block.get("vocab_map_sha256"),
        features=block.get("features"),
    )


def config_to_json(c: DraftConfig, dtype: str = "bfloat16") -> dict:
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        **rope_json(c.rope),
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }
    if c.target_hidden_size and c.target_hidden_size != c.hidden_size:
        out["target_hidden_size"] = c.target_hidden_size
    if c.norm_before_residual:
        out["norm_before_residual"] = True
    if c.norm_before_fc:
        out["norm_before_fc"] = True
    if c.attention_bias:
        out["attention_bias"] = True
    if c.fc_bias:
        out["bias"] = True
    if c.capture is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(c.capture.after_layers),
                               "use_aux_hidden_state": True}
        block = {"version": __version__, "capture": c.capture.to_dict()}
        if c.target_fingerprint:
            block["target"] = {"fingerprint": c.target_fingerprint, "vocab_size": c.target_vocab_size,
                               "num_layers": c.target_num_layers}
            if c.target_tokenizer:
                block["target"]["tokenizer"] = c.target_tokenizer
        if c.vocab_map_sha:
            block["vocab_map_sha256"] = c.vocab_map_sha
        if c.features:  # the feature fingerprint (eaglekit.train.fingerprint): which layer each slot was trained on
            block["features"] = c.features
        out["eaglekit"] = block
    return out


def vocab_map_sha(d2t: torch.Tensor) -> str:
    """A hash of the draft vocabulary mapping, recorded when a draft is saved: a mapping changed after
    training (regenerated at fine-tuning, say) points the lm_head's rows at the wrong tokens."""
    return hashlib.sha256(d2t.detach().to("cpu", torch.int64).numpy().tobytes()).hexdigest()[:16]


_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64"}


def save_draft(draft: Eagle3Draft, folder: str | Path, dtype: torch.dtype = torch.bfloat16,
               with_embedding: bool = False) -> Path:
    """Write config.json + model.safetensors atomically (weights first, config last)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight" or with_embedding}
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    state["t2d"] = t2d_from_d2t(state["d2t"], draft.config.vocab_size)  # derived from d2t, never stale
    draft.config.vocab_map_sha = vocab_map_sha(state["d2t"])
    save_tensors(folder / "model.safetensors", state, metadata={"format": "pt"})
    atomic_write_json(folder / "config.json", config_to_json(draft.config, _DTYPES.get(dtype, "bfloat16")))
    return folder


def load_draft(folder: str | Path, device="cpu", dtype=torch.float32, embed_weight: torch.Tensor | None = None
               ) -> Eagle3Draft:
    """Load a draft folder. The embedding comes from the folder if stored, else `embed_weight` (the target's)."""
    from ..interop.formats import normalize

    folder = Path(folder)
    raw, tensors, fmt = normalize(folder)  # any ecosystem format -> SGLang layout, our tensor names
    fc = tensors.get("fc.weight")
    cfg = config_from_json(raw, str(folder / "config.json"), fc_in=fc.shape[1] if fc is not None else None,
                           capture=fmt.capture)
    if "d2t" not in tensors:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise ContractError(
                f"draft in {folder} has a reduced vocabulary ({cfg.draft_vocab_size} of {cfg.vocab_size} target "
                f"tokens) but no d2t tensor: draft id i would be read as target id i",
                fix="add the d2t offsets the draft was trained with (eaglekit train writes them)", code="E210")
        tensors["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    tensors["d2t"] = tensors["d2t"].long()  # some writers store it as int32 or float
    if "t2d" not in tensors:
        tensors["t2d"] = t2d_from_d2t(tensors["d2t"], cfg.vocab_size)
    tensors["t2d"] = tensors["t2d"].bool()
    if "embed_tokens.weight" not in tensors:
        if embed_weight is None:
            raise InputError(f"draft in {folder} stores no embed_tokens.weight and no target embedding was given",
                             fix="load the draft together with its target", code="E111")
        if tuple(embed_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ContractError(
                f"the draft's hidden size {cfg.hidden_size} and vocabulary {cfg.vocab_size} do not fit the target "
                f"embedding {tuple(embed_weight.shape)}; the draft reuses the target's token embedding",
                fix="use a draft made for this target, or one that stores its own embed_tokens.weight", code="E203")
        tensors["embed_tokens.weight"] = embed_weight
    lm = tensors.get("lm_head.weight")
    if lm is not None and lm.shape[0] != cfg.draft_vocab_size:
        raise ContractError(
            f"lm_head.weight in {folder} has {lm.shape[0]} rows but config.json declares draft_vocab_size "
            f"{cfg.draft_vocab_size}", fix="set draft_vocab_size to the lm_head's row count (and check d2t)",
            code="E214")
    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    extra = sorted(set(tensors) - set(draft.state_dict()))
    if extra:
        hint = ""
        if "fc_norm.weight" in extra:
            hint = " (fc_norm.weight means the draft normalises its features before fc: norm_before_fc)"
        raise ContractError(
            f"the checkpoint in {folder} holds tensors this config does not use: {extra[:5]}{hint}; a loader that "
            f"ignores them computes something other than what was trained",
            fix="declare the options the draft was trained with in config.json (norm_before_fc, "
            "norm_before_residual, attention_bias)", code="E218")
    load_state_dict_into(draft, tensors, folder, dtype=dtype, device=device)
    draft.rotary = Rotary(cfg.head_dim, cfg.rope).to(device)  # non-persistent buffer: rebuilt, not loaded
    draft.embed_tokens.weight.requires_grad_(False)
    draft.source_format = fmt
    return draft


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    ids = torch.arange(d2t.numel()) + d2t.cpu()
    ok = (ids >= 0) & (ids < vocab_size)
    t2d[ids[ok]] = True
    return t2d
