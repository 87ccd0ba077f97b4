"""Writing a draft for another engine, with that engine's layer-id convention.

    sglang     config ids = after_layers ("output of layer i"); SGLang adds +1 to reach its internal
               "input of" ids. SGLang releases that add +1 only when the first id is 1 read the same ids
               the same way only if the first id is 1 (true of the default capture): otherwise we warn.
    specforge  the SGLang layout, with the (frozen) embedding included so training can continue there.
    vllm       speculators layout (Eagle3Speculator, transformer_layer_config, speculators_config); ids =
               "input of layer i" = after_layers + 1, at the top level and nested in eagle_config.

d2t is written as offsets, t2d derived from it; the eaglekit block (capture in after_layers, target
fingerprint) rides along in every format: the engines ignore fields they do not know; so does the training record
of a draft loaded from a folder that has one (eaglekit_record.json: eaglekit.train.record), a file they never read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..capture import CaptureSpec
from ..draft.checkpoint import OPTIONS, config_to_json, saved_config, t2d_from_d2t
from ..errors import InputError
from ..io import atomic_write_json, save_tensors

TARGETS = ("sglang", "specforge", "vllm")


def sglang_rule_reading(spec: CaptureSpec) -> str | None:
    """How SGLang's releases read these eagle_config ids where they disagree (None: the first id is 1, read alike)."""
    ids = list(spec.after_layers)
    if ids and ids[0] == 1:
        return None
    return (
        f"SGLang reads eagle_config ids {ids} as 'output of layer' and adds +1 in releases that always do; "
        f"releases that add +1 only when the first id is 1 read them as 'input of layer', i.e. after_layers "
        f"{[i - 1 for i in ids]}: one layer off"
    )


def sglang_rule_warning(spec: CaptureSpec) -> str | None:
    reading = sglang_rule_reading(spec)
    return (
        None
        if reading is None
        else (
            f"{reading}. Serve this draft with an SGLang whose rule is 'always +1', or "
            f"check which layers your SGLang release captures for these ids (eaglekit "
            f"doctor reports such a folder as W302)"
        )
    )


def _state(draft, dtype, with_embedding: bool, layer_prefix: str) -> dict:
    out = {}
    for k, v in draft.state_dict().items():
        if k == "embed_tokens.weight" and not with_embedding:
            continue
        if k.startswith("midlayer."):
            k = layer_prefix + k[len("midlayer.") :]
        out[k] = v.to(dtype) if v.is_floating_point() else v
    out["t2d"] = t2d_from_d2t(draft.d2t, draft.config.vocab_size)
    return out


def _vllm_config(c, target_name: str | None, target_arch: str | None, dtype: str) -> dict:
    inputs = list(c.capture.input_of())
    sg = config_to_json(c, dtype)  # the SGLang config: its Llama fields are the speculators layer config
    keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_hidden_layers",
        "hidden_act",
        "rms_norm_eps",
        "vocab_size",
        "max_position_embeddings",
        "rope_theta",
        "rope_scaling",
        "tie_word_embeddings",
    )
    layer = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **{k: sg[k] for k in keys if k in sg},
        "attention_bias": c.attention_bias,
        "mlp_bias": False,
    }
    if c.sliding_window is not None:  # the layer's own fields, where vLLM and speculators look for them
        layer.update(sliding_window=c.sliding_window, layer_types=["sliding_attention"])
    out = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": c.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": inputs,  # vLLM: "input of layer i", read raw
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": inputs, "use_aux_hidden_state": True},
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "verifier": {"name_or_path": target_name, "architectures": [target_arch] if target_arch else []},
        },
        "torch_dtype": dtype,
    }
    # the optional fields are spelled the same in both layouts: take them from the SGLang config
    out.update({k: sg[k] for k in ("target_hidden_size", *OPTIONS[1:], "bias", "eaglekit") if k in sg})
    return out


def verifier_name(folder) -> tuple[str, str]:
    """What speculators' `verifier.name_or_path` should hold for a local target folder, and which kind it is.

    The field is read from wherever the loader runs (speculators, `vllm serve DRAFT` from another folder), so a
    relative path breaks there: write the absolute path, or the hub id when the folder is a Hugging Face cache
    snapshot (.../models--ORG--NAME/snapshots/REV), which any machine can resolve."""
    p = Path(folder).expanduser().resolve()
    parts = p.parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots" and part.count("--") >= 2:
            return part[len("models--") :].replace("--", "/", 1), "hub id (the folder is a Hugging Face cache snapshot)"
    return str(p), "absolute path"


def _own_embedding(draft, target) -> bool:
    """The draft embeds tokens with weights of its own (SpecForge and speculators store and may train them):
    written out, since the engine would otherwise substitute the target's and change the draft."""
    if target is None:
        return False
    t = target.embed_weight()
    w = draft.embed_tokens.weight
    return w.shape != t.shape or not torch.allclose(w.float().cpu(), t.float().cpu())


def _with_target_record(c, target):
    """The target the draft is exported for, recorded where the draft records none (a draft made elsewhere): its
    config fingerprint and its weights' (eaglekit.train.fingerprint), so the doctor can later tell a same-shape
    target with other weights. A draft that records its training target keeps that record."""
    import dataclasses

    from ..train.fingerprint import weights_fingerprint

    t = target.info
    if c.target_fingerprint and c.target_fingerprint != t.fingerprint:
        return c  # the draft's own record names another target: keep it, the doctor reports the difference
    folder = target.folder
    weights = c.target_weights or (weights_fingerprint(folder) if folder else None)
    return dataclasses.replace(
        c,
        target_fingerprint=t.fingerprint,
        target_vocab_size=t.vocab_size,
        target_num_layers=t.num_layers,
        target_weights=weights,
    )


def export(
    draft,
    out: str | Path,
    to: str,
    target=None,
    dtype: torch.dtype = torch.bfloat16,
    with_embedding: bool | None = None,
) -> list[str]:
    """Write `draft` for engine `to`; returns warnings (empty when every engine version reads it the same)."""
    if to not in TARGETS:
        raise InputError(f"unknown export format {to!r}", fix=f"use one of {', '.join(TARGETS)}", code="E108")
    if draft.config.capture is None and target is None:
        raise InputError(
            "the draft records no capture layers and no target was given to take the default from",
            fix="pass --target",
            code="E130",
        )
    # what is written is a copy of the config (the default capture, the d2t hash): the draft is left as it was
    c = saved_config(draft, CaptureSpec.default(target.info.num_layers) if target is not None else None)
    if target is not None:
        c = _with_target_record(c, target)
    warnings = []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dname = str(dtype).replace("torch.", "")
    if to in ("sglang", "specforge"):
        emb = (to == "specforge" or _own_embedding(draft, target)) if with_embedding is None else with_embedding
        save_tensors(out / "model.safetensors", _state(draft, dtype, emb, "midlayer."), metadata={"format": "pt"})
        atomic_write_json(out / "config.json", config_to_json(c, dname))
        assert c.capture is not None  # the draft's own, else the target's default (E130 above)
        w = sglang_rule_warning(c.capture)
        if w:
            warnings.append(w)
    else:
        emb = True if with_embedding is None else with_embedding  # speculators keeps its own embed_tokens
        save_tensors(out / "model.safetensors", _state(draft, dtype, emb, "layers.0."), metadata={"format": "pt"})
        name = arch = None
        if target is not None and target.folder:
            name, _ = verifier_name(target.folder)
            archs = json.loads((Path(target.folder) / "config.json").read_text()).get("architectures") or [None]
            arch = archs[0]
        atomic_write_json(out / "config.json", _vllm_config(c, name, arch, dname))
    from ..train.record import carry

    carry(draft.source_folder, out)  # the training record rides along: an extra file every engine
    return warnings
