"""`eaglekit inspect`: what a draft folder says, in plain words, without trusting it enough to load it."""

from __future__ import annotations

from pathlib import Path

import torch

from ..capture import CaptureSpec
from ..draft import load_draft, pair_problems
from ..draft.checkpoint import CONVENTIONS, FORMATS, OPTIONS, declared_captures, read_folder, sliding_window_of
from ..errors import EaglekitError

EXPECTED = (
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
)
OPTIONAL = ("embed_tokens.weight", "fc.bias", "input_norm.weight")  # + fc_norm.{i}.weight


def _optional(name: str) -> bool:
    return name in OPTIONAL or (name.startswith("fc_norm.") and name.split(".")[1].isdigit())


def inspect_folder(folder, target=None) -> dict:
    folder = Path(folder)
    cfg, tensors, fmt = read_folder(folder)
    info = target.info if target is not None else None
    block = cfg.get("eaglekit") or {}
    n_layers = info.num_layers if info else (block.get("target") or {}).get("num_layers")
    H = int(cfg["hidden_size"])
    Ht = int(cfg.get("target_hidden_size") or (info.hidden_size if info else H))
    vocab = int(cfg.get("vocab_size", 0))
    dvocab = int(cfg.get("draft_vocab_size") or vocab)
    out: dict = {
        "folder": str(folder),
        "format": fmt.name,
        "format_name": FORMATS[fmt.name],
        "ids_convention": fmt.ids_convention,
        "ids": fmt.ids,
        "weights_file": fmt.weights,
        "notes": list(fmt.notes),
    }
    out.update(_capture_ids(fmt.capture, n_layers))
    out["declared"] = {k: list(v) for k, v in declared_captures(folder).items()}
    fc = tensors.get("fc.weight")
    if fc is not None:
        out["fc_in"] = int(fc.shape[1])
        out["fc_captures"] = fc.shape[1] / Ht
    out.update(
        hidden_size=H,
        target_hidden_size=Ht,
        vocab_size=vocab,
        draft_vocab_size=dvocab,
        target_vocab_coverage=round(dvocab / vocab, 4) if vocab else None,
        **{k: bool(cfg.get(k)) for k in OPTIONS},
        sliding_window=sliding_window_of(cfg),
        fc_bias=bool(cfg.get("bias")),
    )
    out["d2t"] = _d2t_form(tensors.get("d2t"), vocab, dvocab)
    names = set(tensors)
    out["missing_tensors"] = [k for k in EXPECTED if k not in names and not (k == "t2d" and "d2t" in names)]
    out["extra_tensors"] = sorted(n for n in names - set(EXPECTED) if not _optional(n))
    out["has_embedding"] = "embed_tokens.weight" in names
    rec = (block.get("target") or {}).get("fingerprint")
    out["target_fingerprint"] = rec
    if info is not None:
        out.update(_against_target(folder, target, rec))
    out["summary"] = summary(out, n_layers)
    return out


def _capture_ids(spec: CaptureSpec | None, n_layers: int | None) -> dict:
    """The capture ids in both conventions (the target's default set where the folder records none and the layer
    count is known); nothing where neither tells them."""
    out: dict = {}
    defaulted = spec is None and n_layers is not None
    if defaulted:
        assert n_layers is not None  # part of `defaulted`
        spec = CaptureSpec.default(n_layers)
    if spec is not None:
        out["after_layers"] = list(spec.after_layers)
        out["input_of"] = list(spec.input_of())
        out["sglang_config_ids"] = list(spec.after_layers)
        out["vllm_ids"] = list(spec.input_of())
        out["capture_defaulted"] = defaulted
        if n_layers:
            out["is_default_capture"] = spec == CaptureSpec.default(n_layers)
    return out


def _d2t_form(d2t: torch.Tensor | None, vocab: int, dvocab: int) -> str:
    """What the d2t tensor holds, in words: offsets (as it must), absolute ids, ids outside the vocabulary."""
    if d2t is None:
        return "missing: draft id i is read as target id i" + (
            " (fine: full vocabulary)" if dvocab == vocab else " (wrong: the vocabulary is reduced)"
        )
    ids = torch.arange(d2t.numel()) + d2t.long()
    if torch.equal(d2t.long(), torch.arange(d2t.numel())):
        return "absolute ids (d2t = arange): it must hold offsets; every id maps to 2i"
    if int(((ids < 0) | (ids >= max(vocab, 1))).sum()):
        return "maps outside the target vocabulary: absolute ids where offsets belong?"
    if int(d2t.abs().sum()) == 0:
        return "offsets, identity (draft id i = target id i)"
    dup = d2t.numel() - int(torch.unique(ids).numel())
    return "offsets" + (f", but {dup} target ids repeat" if dup else "")


def _against_target(folder: Path, target, rec: str | None) -> dict:
    """With --target: its layers, widths and fingerprint (`rec`, the draft's record of it, matched or not) and the
    pair's problems, a draft that cannot load being one."""
    info = target.info
    out: dict = {
        "target": {
            "layers": info.num_layers,
            "hidden_size": info.hidden_size,
            "vocab_size": info.vocab_size,
            "fingerprint": info.fingerprint,
            "fingerprint_matches": rec == info.fingerprint if rec else None,
        }
    }
    try:
        d = load_draft(folder, embed_weight=target.embed_weight())
        out["problems"] = [f"[{p.code}] {p.message}" for p in pair_problems(d, target)[1]]
    except EaglekitError as e:
        out["problems"] = [f"[{e.code}] {e.message}"]
    return out


def summary(r: dict, n_layers) -> list[str]:
    lines = [
        f"format: {r['format_name']}; its capture ids are written as {CONVENTIONS[r['ids_convention']]}"
        + (f": {r['ids']}" if r["ids"] else "")
    ]
    if "after_layers" in r:
        how = " (no ids recorded: the default for this target)" if r.get("capture_defaulted") else ""
        for_n = f" for this {n_layers}-layer target" if n_layers else ""
        lines.append(
            f"it captures the outputs of layers {r['after_layers']} = the inputs of layers {r['input_of']}"
            f"{for_n}{how}" + ("; that is the default set" if r.get("is_default_capture") else "")
        )
        lines.append(f"SGLang config ids: {r['sglang_config_ids']}; vLLM ids: {r['vllm_ids']}")
    if len(set(map(tuple, r["declared"].values()))) > 1:
        lines.append(
            "WARNING: the folder declares different layers in different places: "
            + "; ".join(f"{k} -> {v}" for k, v in r["declared"].items())
        )
    if "fc_in" in r:
        caps = r["fc_captures"]
        lines.append(
            f"fc takes {r['fc_in']} = {caps:g} x {r['target_hidden_size']} features"
            + ("" if caps == int(caps) else " (not a multiple of the target hidden size)")
        )
    cov = r["target_vocab_coverage"]
    lines.append(
        f"draft vocabulary: {r['draft_vocab_size']} of {r['vocab_size']} target tokens "
        f"({cov:.1%} of the target vocabulary); d2t: {r['d2t']}"
    )
    flags = [f for f in (*OPTIONS, "fc_bias") if r[f]]
    if r.get("sliding_window"):
        flags.append(f"sliding_window {r['sliding_window']}")
    if flags:
        lines.append("options: " + ", ".join(flags))
    lines.append("embedding: stored" if r["has_embedding"] else "embedding: not stored (the target's is used)")
    if r["missing_tensors"]:
        lines.append(f"MISSING tensors: {r['missing_tensors']}")
    if r["extra_tensors"]:
        lines.append(f"EXTRA tensors (not used by this config): {r['extra_tensors']}")
    if r.get("target"):
        m = r["target"]["fingerprint_matches"]
        lines.append("target fingerprint: " + ("matches" if m else "differs" if m is False else "not recorded"))
    for p in r.get("problems", []):
        lines.append(f"PROBLEM with this target: {p}")
    return lines
