"""Checks of the draft folder and of the pair, before anything runs: each a Finding with a stable code.

The pair's contract (widths, ranges, d2t / t2d, lm_head rows, fingerprints) is checked once, by
`eaglekit.draft.pair_problems`, the same function that refuses a bad pair at load; the folder's own records
(declared conventions, missing records) are read here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from ..capture import CaptureSpec
from ..models.config import read_json
from .report import Finding


def _tensor_names(folder: Path) -> set[str] | None:
    """Names stored in the folder's safetensors (header or index only, nothing loaded); None: not readable here."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    try:
        if single.is_file():
            from safetensors import safe_open

            with safe_open(str(single), "pt") as f:
                return set(f.keys())
        if index.is_file():
            return set(read_json(index, "draft weights index").get("weight_map", {}))
    except Exception:  # noqa: BLE001 (an unreadable file is reported by the loader, with its own code)
        return None
    return None


def folder_findings(folder: Path, num_layers: int) -> list[Finding]:
    """What the draft folder itself says, before loading: declared conventions and missing records."""
    from ..interop.formats import declared_captures

    raw = read_json(folder / "config.json", "draft config")
    block = raw.get("eaglekit") or {}
    declared = declared_captures(folder)
    out = _capture_findings(declared, num_layers)
    if not (block.get("target") or {}).get("fingerprint"):
        out.append(
            Finding(
                "I302",
                "info",
                "the folder records no target fingerprint, so a draft made for another "
                "target cannot be told apart by its config; the probe's acceptance is the check",
            )
        )
    for flag in ("norm_before_residual", "norm_before_fc"):
        if raw.get(flag):
            out.append(
                Finding(
                    "I303",
                    "info",
                    f"{flag} is set: engines that ignore it compute another function "
                    f"(SGLang and vLLM versions differ here)",
                )
            )
    out += _t2d_finding(folder)
    if not block.get("features"):
        out.append(
            Finding(
                "I307",
                "info",
                "the folder records no feature fingerprint (drafts trained by eaglekit "
                "do), so the report names no layers by the features' statistics; acceptance decides the "
                "wiring either way",
            )
        )
    out += _sglang_finding(raw, declared)
    return out


def _capture_findings(declared: dict[str, tuple[int, ...]], num_layers: int) -> list[Finding]:
    """The capture layers the folder declares (`declared`: where -> after_layers): places that disagree (E219), or
    none at all (W301)."""
    out = []
    if len(set(declared.values())) > 1:
        parts = "; ".join(f"{k} -> after_layers {list(v)}" for k, v in declared.items())
        out.append(
            Finding(
                "E219",
                "error",
                f"the folder declares different capture layers in different places: {parts}",
                "keep one set of ids, written in each place in that place's convention (eaglekit export does)",
                {"declared": {k: list(v) for k, v in declared.items()}},
            )
        )
    if not declared:
        d = list(CaptureSpec.default(num_layers).after_layers)
        out.append(
            Finding(
                "W301",
                "warning",
                f"the folder records no capture layers: eaglekit, SGLang and vLLM all "
                f"fall back to their default (after_layers {d}); the probe below checks that this is what "
                f"the draft was trained on",
                "record the layers the draft was trained with (eagle_config.eagle_aux_hidden_state_layer_ids)",
            )
        )
    return out


def _t2d_finding(folder: Path) -> list[Finding]:
    """A d2t stored without its t2d (I305): engines that read t2d from the checkpoint find none."""
    names = _tensor_names(folder)
    if names is None or not any(n.endswith("d2t") for n in names) or any(n.endswith("t2d") for n in names):
        return []
    return [
        Finding(
            "I305",
            "info",
            "the folder stores d2t but no t2d: eaglekit rebuilds t2d from d2t (the "
            "target ids the draft vocabulary covers), as SGLang does; an engine that reads t2d from the "
            "checkpoint would not find it",
            "re-save with eaglekit export, which writes both",
            {"tensors": sorted(n for n in names if n.endswith(("d2t", "t2d")))},
        )
    ]


def _sglang_finding(raw: dict, declared: dict[str, tuple[int, ...]]) -> list[Finding]:
    """SGLang config ids whose reading depends on the SGLang release (W302)."""
    from ..interop.export import sglang_rule_reading

    sglang = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not (sglang and any("SGLang" in k for k in declared) and sglang[0] != 1):
        return []
    # eaglekit reads these ids as written ("output of layer"); SGLang's reading depends on its release
    # (a first id other than 1: the releases read them apart, so there is a reading to name)
    return [
        Finding(
            "W302",
            "warning",
            cast(str, sglang_rule_reading(CaptureSpec.from_output_of(sglang))),
            "serve the draft with an SGLang release that always adds +1, or check which layers your "
            "release captures for these ids",
            {"ids": list(sglang)},
        )
    ]


def recorded_fingerprint(folder: Path):
    raw = json.loads((folder / "config.json").read_text())
    return (raw.get("eaglekit") or {}).get("features")


def capture_width_finding(folder: Path, hidden: int, num_layers: int):
    """A folder whose declared ids do not fit its fc (the loader then refuses the fc's shape, E107): the cause named
    as a capture fault, E202, with the ids to write in the folder's convention. None when they fit or cannot be read."""
    from ..errors import EaglekitError
    from ..interop.formats import read_folder
    from .fixes import convention_of, ids_fix, ids_in

    try:
        _, tensors, fmt = read_folder(folder)
    except EaglekitError:
        return None
    fc = tensors.get("fc.weight")
    if fc is None or fmt.capture is None or fmt.capture.width(hidden) == fc.shape[1] or fc.shape[1] % hidden:
        return None
    k, layers = fc.shape[1] // hidden, list(fmt.capture.after_layers)
    ids = ids_in(layers, convention_of(fmt))
    extra = " (the embedding output among them)" if -1 in layers else ""
    fit: list[int] | None
    fit = [i for i in layers if i != -1]
    if len(fit) != k:
        default = list(CaptureSpec.default(num_layers).after_layers)
        fit = default if len(default) == k else None
    fix = ids_fix(fit, fmt) if fit else f"list exactly {k} ids, the layers the draft was trained on"
    return Finding(
        "E202",
        "error",
        f"the folder lists {len(layers)} capture ids {ids}{extra} = after_layers {layers}, "
        f"so an engine captures {len(layers)} x {hidden} = {len(layers) * hidden} features, but the draft's "
        f"fc was trained on {fc.shape[1]} = {k} x {hidden}",
        fix,
        {"ids": ids, "after_layers": layers, "fc_in": int(fc.shape[1])},
    )
