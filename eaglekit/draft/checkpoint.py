"""Draft folders: every layout the engines write, read into one DraftConfig; ours written in the SGLang layout.

Layouts read (`read_folder` says which, and in which convention the folder wrote its capture ids):
    eaglekit    SGLang layout + an `eaglekit` block (capture in after_layers, target fingerprint)
    sglang      SGLang / SpecForge: architectures [LlamaForCausalLMEagle3], Llama fields with
                num_hidden_layers 1, eagle_config.eagle_aux_hidden_state_layer_ids meaning "output of layer
                i" (= after_layers); weights midlayer.*
    vllm        speculators (Eagle3Speculator / Eagle3DraftModel.save_pretrained): transformer_layer_config,
                speculators_config, top-level draft options and eagle_aux_hidden_state_layer_ids meaning
                "input of layer i"; weights layers.0.*
    eagle       the SafeAILab EAGLE reference: a one-layer LlamaForCausalLM config, no ids (its target code
                captures the inputs of layers [2, n//2, n-3]: the default after_layers)

Draft options, spelled the same in every layout (speculators: top level; SGLang layout: top level, vLLM also
reads norm_before_fc inside eagle_config), with the weights each adds:
    norm_before_residual   the residual is hidden_norm(h), not h        (speculators' default when absent: True,
                           as vLLM reads it; elsewhere False)
    norm_before_fc         input_norm.weight [C*H_t]: one RMSNorm over the whole fc input (eaglekit < 0.2
                           called it fc_norm.weight: still read)
    fc_norm                fc_norm.{i}.weight [H_t]: one RMSNorm per captured layer, each on its H_t slice
    norm_output            EAGLE 3.1: the next draft step gets norm(h), not h. (SpecForge's model class
                           reads a field of that name as "apply the final norm", default true; its configs do
                           not write it, and we read it as vLLM and speculators do.)
    layer_types + sliding_window   ["sliding_attention"] gives the draft layer that window (vLLM reads
                           only layer_types; a bare sliding_window is ignored there, and here)
    bias                   a bias on fc (SGLang's spelling)
Tensors outside the config's options are refused (E218): a loader that dropped them would compute
another function than the one trained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..capture import CaptureSpec
from ..errors import ContractError, InputError
from ..io import atomic_write_json, save_tensors
from ..models.config import read_json, rope_from, rope_json
from ..models.layers import Rotary
from ..models.weights import load_state_dict_into, read_folder_tensors
from .model import DraftConfig, Eagle3Draft

FORMATS = {
    "eaglekit": "eaglekit (SGLang layout + eaglekit block)",
    "sglang": "SGLang / SpecForge",
    "vllm": "vLLM speculators",
    "eagle": "EAGLE reference (SafeAILab)",
}
CONVENTIONS = {
    "after_layers": "after_layers (output of layer i)",
    "output_of": "output of layer i (SGLang config ids)",
    "input_of": "input of layer i (vLLM, EAGLE reference)",
    None: "no ids recorded (engine default)",
}
OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# weights a speculators training checkpoint may carry that belong to the verifier, not to the draft
VERIFIER_COPIES = ("verifier_norm.weight", "verifier_lm_head.weight")


@dataclass(frozen=True)
class FolderFormat:
    name: str
    ids_convention: str | None
    ids: tuple[int, ...] | None
    capture: CaptureSpec | None
    weights: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        return f"{FORMATS[self.name]}; ids: {CONVENTIONS[self.ids_convention]}"


# --- config -------------------------------------------------------------------------------------------
def sliding_window_of(raw: dict) -> int | None:
    types = raw.get("layer_types") or []
    if types and types[0] == "sliding_attention" and raw.get("sliding_window"):
        return int(raw["sliding_window"])
    return None


def config_from_json(
    raw: dict, where: str, fc_in: int | None = None, capture: CaptureSpec | None = None
) -> DraftConfig:
    """A DraftConfig from a config in the SGLang layout; `capture` comes converted to after_layers by
    `read_folder`, which knows the convention the folder's ids were written in."""
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
    eagle = raw.get("eagle_config") or {}
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
        rope=rope_from(raw),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        capture=capture,
        num_captures=num_captures,
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        norm_before_fc=bool(eagle.get("norm_before_fc", raw.get("norm_before_fc", False))),  # vLLM's precedence
        fc_norm=bool(raw.get("fc_norm", False)),
        norm_output=bool(raw.get("norm_output", False)),
        sliding_window=sliding_window_of(raw),
        attention_bias=bool(raw.get("attention_bias", False)),
        fc_bias=bool(raw.get("bias", False)),  # SGLang's `bias` is the fc's
        target_fingerprint=target.get("fingerprint"),
        target_vocab_size=target.get("vocab_size"),
        target_num_layers=target.get("num_layers"),
        target_tokenizer=target.get("tokenizer"),
        target_weights=target.get("weights"),
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
    out.update({k: True for k in OPTIONS if getattr(c, k)})
    if c.sliding_window is not None:
        out.update(sliding_window=c.sliding_window, layer_types=["sliding_attention"])
    if c.attention_bias:
        out["attention_bias"] = True
    if c.fc_bias:
        out["bias"] = True
    if c.capture is not None:
        out["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": list(c.capture.after_layers),
            "use_aux_hidden_state": True,
        }
        block: dict[str, Any] = {"version": __version__, "capture": c.capture.to_dict()}
        if c.target_fingerprint:
            block["target"] = {
                "fingerprint": c.target_fingerprint,
                "vocab_size": c.target_vocab_size,
                "num_layers": c.target_num_layers,
            }
            if c.target_tokenizer:
                block["target"]["tokenizer"] = c.target_tokenizer
            if c.target_weights:  # which weights, not only which shapes (a fine-tune shares the config)
                block["target"]["weights"] = c.target_weights
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


def saved_config(draft: Eagle3Draft, capture: CaptureSpec | None = None) -> DraftConfig:
    """The config as written to disk: the draft's own, with the d2t hash and (if it records none) `capture`
    filled in on a copy; saving never changes the draft in memory."""
    c = draft.config
    return dataclasses.replace(c, capture=c.capture or capture, vocab_map_sha=vocab_map_sha(draft.d2t))


# --- reading any layout -------------------------------------------------------------------------------
def _read_tensors(folder: Path) -> tuple[dict, str]:
    bin_file = folder / "pytorch_model.bin"
    has_st = (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
    if not has_st and bin_file.is_file():  # the EAGLE reference ships a pickle; load it without running code
        try:
            return torch.load(bin_file, map_location="cpu", weights_only=True), bin_file.name
        except Exception as e:  # noqa: BLE001 (any unpickling failure is a bad file)
            raise InputError(
                f"{bin_file} cannot be read as a weights-only checkpoint ({e})",
                fix="convert it to safetensors",
                code="E105",
            ) from None
    return read_folder_tensors(folder, "draft"), "model.safetensors"


def _our_names(tensors: dict, cfg: dict) -> dict:
    out = {}
    for k, v in tensors.items():
        for p in ("model.", "draft_model."):
            if k.startswith(p):
                k = k[len(p) :]
                break
        if k.startswith("layers.0."):  # speculators names the one layer layers.0; SGLang / SpecForge midlayer
            k = "midlayer." + k[len("layers.0.") :]
        if k in VERIFIER_COPIES:
            continue
        out[k] = v
    # eaglekit < 0.2 wrote norm_before_fc's weight as fc_norm.weight; every engine calls it input_norm.weight
    if cfg.get("norm_before_fc") and "fc_norm.weight" in out and "input_norm.weight" not in out:
        out["input_norm.weight"] = out.pop("fc_norm.weight")
    return out


def _from_speculators(raw: dict) -> dict:
    layer = dict(raw.get("transformer_layer_config") or {})
    kind = layer.get("model_type", "llama")
    if kind not in ("llama", None):
        raise InputError(
            f"the speculators draft's transformer_layer_config is a {kind!r} layer; eaglekit's draft "
            f"layer is the Llama one (vLLM maps llama -> Eagle3LlamaForCausalLM)",
            fix="train the draft with a llama transformer_layer_config",
            code="E112",
        )
    cfg = {
        **layer,
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "draft_vocab_size": raw.get("draft_vocab_size", layer.get("vocab_size")),
        # vLLM's speculators reader defaults this to True when the field is absent
        "norm_before_residual": raw.get("norm_before_residual", True),
    }
    for k in ("target_hidden_size", "norm_before_fc", "fc_norm", "norm_output", "eaglekit"):
        if raw.get(k) is not None:
            cfg[k] = raw[k]
    return cfg


def read_folder(folder: str | Path) -> tuple[dict, dict, FolderFormat]:
    """Any layout -> (config in the SGLang layout, tensors under our names, the FolderFormat read)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(
            f"draft folder {folder} does not exist", fix="pass the path of an EAGLE-3 draft folder", code="E101"
        )
    raw = read_json(folder / "config.json", "draft config")
    tensors, wfile = _read_tensors(folder)
    archs = raw.get("architectures") or []
    block = raw.get("eaglekit") or {}
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if "Eagle3Speculator" in archs or "speculators_config" in raw or "transformer_layer_config" in raw:
        cfg = _from_speculators(raw)
        ids = top or nested  # speculators: top level; some versions nest it: both mean "input of layer i"
        fmt = FolderFormat(
            "vllm",
            "input_of" if ids else None,
            tuple(ids) if ids else None,
            CaptureSpec.from_input_of(ids) if ids else None,
            wfile,
        )
    elif block.get("capture"):
        cfg = dict(raw)
        spec = CaptureSpec.from_dict(block["capture"])
        fmt = FolderFormat("eaglekit", "after_layers", tuple(spec.after_layers), spec, wfile)
    elif any("eagle3" in a.lower() for a in archs):
        cfg = dict(raw)
        if nested:
            fmt = FolderFormat("sglang", "output_of", tuple(nested), CaptureSpec.from_output_of(nested), wfile)
        elif top:  # the vLLM spelling inside an SGLang-layout folder
            fmt = FolderFormat(
                "sglang",
                "input_of",
                tuple(top),
                CaptureSpec.from_input_of(top),
                wfile,
                ("ids found at the top level, read in vLLM's 'input of layer' convention",),
            )
        else:
            fmt = FolderFormat("sglang", None, None, None, wfile)
    elif (
        raw.get("num_hidden_layers") == 1
        and any(k.endswith("fc.weight") for k in tensors)
        and any("midlayer." in k for k in tensors)
    ):
        cfg = {**raw, "architectures": ["LlamaForCausalLMEagle3"]}
        fmt = FolderFormat(
            "eagle",
            None,
            None,
            None,
            wfile,
            ("the EAGLE reference captures the inputs of layers [2, n//2, n-3]: the default",),
        )
    else:
        raise InputError(
            f"{folder / 'config.json'} describes {archs[0] if archs else 'no architecture'}, not an "
            f"EAGLE-3 draft (architectures {archs})",
            fix="pass the draft folder as --draft (a full model folder goes to --target)",
            code="E110",
        )
    tensors = _our_names(tensors, cfg)
    if "fc.bias" in tensors:
        cfg["bias"] = True  # SGLang's spelling of a bias on fc
    return cfg, tensors, fmt


def declared_captures(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Every place the folder records capture ids, each converted to after_layers (for conflict checks)."""
    raw = json.loads((Path(folder) / "config.json").read_text())
    vllm = "Eagle3Speculator" in (raw.get("architectures") or []) or "speculators_config" in raw
    out = {}
    block = raw.get("eaglekit") or {}
    if "capture" in block:
        out["eaglekit block (after_layers)"] = CaptureSpec.from_dict(block["capture"]).after_layers
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        out["eagle_config ids" + (" (vLLM: input of layer)" if vllm else " (SGLang: output of layer)")] = (
            CaptureSpec.from_input_of(nested) if vllm else CaptureSpec.from_output_of(nested)
        ).after_layers
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if top:
        out["top-level ids (vLLM: input of layer)"] = CaptureSpec.from_input_of(top).after_layers
    return out


def _unused_hint(extra: list[str]) -> str:
    if any(k.startswith("layers.") for k in extra):  # layers.1.* and on: speculators' num_layers > 1
        return " (a draft of several decoder layers: eaglekit's EAGLE-3 draft has one, as SGLang's and SpecForge's)"
    if any(k.startswith("fc_norm.") and k != "fc_norm.weight" for k in extra):
        return " (fc_norm.{i}.weight means one RMSNorm per captured layer before fc: fc_norm)"
    if "fc_norm.weight" in extra or "input_norm.weight" in extra:
        return " (a single norm over the fc input means the draft normalises its features before fc: norm_before_fc)"
    return ""


# --- save / load --------------------------------------------------------------------------------------
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64"}


def save_draft(
    draft: Eagle3Draft, folder: str | Path, dtype: torch.dtype = torch.bfloat16, with_embedding: bool = False
) -> Path:
    """Write config.json + model.safetensors atomically (weights first, config last)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight" or with_embedding}
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    state["t2d"] = t2d_from_d2t(state["d2t"], draft.config.vocab_size)  # derived from d2t, never stale
    save_tensors(folder / "model.safetensors", state, metadata={"format": "pt"})
    atomic_write_json(folder / "config.json", config_to_json(saved_config(draft), _DTYPES.get(dtype, "bfloat16")))
    return folder


def load_draft(
    folder: str | Path, device="cpu", dtype=torch.float32, embed_weight: torch.Tensor | None = None
) -> Eagle3Draft:
    """Load a draft folder. The embedding comes from the folder if stored, else `embed_weight` (the target's)."""
    folder = Path(folder)
    raw, tensors, fmt = read_folder(folder)
    fc = tensors.get("fc.weight")
    cfg = config_from_json(
        raw, str(folder / "config.json"), fc_in=fc.shape[1] if fc is not None else None, capture=fmt.capture
    )
    if "d2t" not in tensors:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise ContractError(
                f"draft in {folder} has a reduced vocabulary ({cfg.draft_vocab_size} of {cfg.vocab_size} target "
                f"tokens) but no d2t tensor: draft id i would be read as target id i",
                fix="add the d2t offsets the draft was trained with (eaglekit train writes them)",
                code="E210",
            )
        tensors["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    tensors["d2t"] = tensors["d2t"].long()  # some writers store it as int32 or float
    if "t2d" not in tensors:
        tensors["t2d"] = t2d_from_d2t(tensors["d2t"], cfg.vocab_size)
    tensors["t2d"] = tensors["t2d"].bool()
    if "embed_tokens.weight" not in tensors:
        if embed_weight is None:
            raise InputError(
                f"draft in {folder} stores no embed_tokens.weight and no target embedding was given",
                fix="load the draft together with its target",
                code="E111",
            )
        if tuple(embed_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ContractError(
                f"the draft's hidden size {cfg.hidden_size} and vocabulary {cfg.vocab_size} do not fit the target "
                f"embedding {tuple(embed_weight.shape)}; the draft reuses the target's token embedding",
                fix="use a draft made for this target, or one that stores its own embed_tokens.weight",
                code="E203",
            )
        tensors["embed_tokens.weight"] = embed_weight
    lm = tensors.get("lm_head.weight")
    if lm is not None and lm.shape[0] != cfg.draft_vocab_size:
        raise ContractError(
            f"lm_head.weight in {folder} has {lm.shape[0]} rows but config.json declares draft_vocab_size "
            f"{cfg.draft_vocab_size}",
            fix="set draft_vocab_size to the lm_head's row count (and check d2t)",
            code="E214",
        )
    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    extra = sorted(set(tensors) - set(draft.state_dict()))
    if extra:
        raise ContractError(
            f"the checkpoint in {folder} holds tensors this config does not use: {extra[:5]}{_unused_hint(extra)}; "
            f"a loader that ignores them computes something other than what was trained",
            fix="declare the options the draft was trained with in config.json ("
            + ", ".join(OPTIONS)
            + ", attention_bias)",
            code="E218",
        )
    load_state_dict_into(draft, tensors, folder, dtype=dtype, device=device)
    assert cfg.head_dim is not None  # (DraftConfig.__post_init__ resolves it)
    draft.rotary = Rotary(cfg.head_dim, cfg.rope).to(device)  # non-persistent buffer: rebuilt, not loaded
    draft.embed_tokens.weight.requires_grad_(False)
    draft.source_format = fmt
    draft.source_folder = folder  # what an export copies beside the weights (the training record)
    return draft


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    ids = torch.arange(d2t.numel()) + d2t.cpu()
    ok = (ids >= 0) & (ids < vocab_size)
    t2d[ids[ok]] = True
    return t2d
