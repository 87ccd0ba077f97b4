"""Fixes written in the convention of the folder being diagnosed.

eaglekit thinks in after_layers (output of layer i); a folder records its ids in the convention of the layout
it was written in (eaglekit.draft.checkpoint.CONVENTIONS, read by `read_folder` into FolderFormat): a vLLM
(speculators) folder in "input of layer i" (after_layers + 1), an SGLang / SpecForge folder in "output of layer
i" (= after_layers). A fix that names ids names them in that convention, with how the engines read them, so
that pasting the value into the folder gives the wiring the draft was trained on.
"""

from __future__ import annotations

from ..draft.checkpoint import CONVENTIONS, FolderFormat

VLLM_READS = "vLLM reads them as 'input of layer i' and sorts them (their order does not matter there)"
SGLANG_READS = (
    "SGLang adds +1 to explicit ids to reach its 'input of layer' ids (releases since mid-2026 only "
    "when the first id is 1)"
)


def convention_of(fmt: FolderFormat | None) -> str:
    """The convention new ids must be written in for this folder: its own, else its layout's."""
    if fmt is None:
        return "output_of"
    if fmt.ids_convention in ("input_of", "output_of"):
        return fmt.ids_convention
    return "input_of" if fmt.name == "vllm" else "output_of"


def ids_in(after_layers, convention: str) -> list[int]:
    return [i + 1 for i in after_layers] if convention == "input_of" else list(after_layers)


def ids_fix(after_layers, fmt: FolderFormat | None, engine: str | None = None) -> str:
    """The fix for a wrong capture: the ids to write in this folder, where, and how the engines read them."""
    layers = list(after_layers)
    conv = convention_of(fmt)
    ids = ids_in(layers, conv)
    cli = f"with eaglekit: --capture-layers {','.join(str(i) for i in layers)}"
    if fmt is not None and fmt.name == "eagle":
        return (
            f"this EAGLE reference folder has no field for capture ids (its loaders use the default), so "
            f"after_layers {layers} cannot be written into it: convert it (eaglekit export OUT --to vllm|sglang "
            f"--draft D --target T) and write them there; {cli}"
        )
    where = (
        "at the top level and in eagle_config (eagle_aux_hidden_state_layer_ids)"
        if conv == "input_of"
        else "in eagle_config.eagle_aux_hidden_state_layer_ids"
        + (" and eaglekit.capture.after_layers" if fmt is not None and fmt.name == "eaglekit" else "")
    )
    text = (
        f"write eagle_aux_hidden_state_layer_ids = {ids} {where} (this folder's convention: "
        f"{CONVENTIONS[conv]}; = eaglekit after_layers {layers})"
    )
    if conv == "input_of":
        text += f"; {VLLM_READS}"
        if engine != "vllm":
            text += "; eaglekit reads them in the order written"
    else:
        text += f"; {SGLANG_READS}"
        if ids and ids[0] != 1:
            text += (
                f": the first id here is {ids[0]}, so a release with that rule reads them as input of layer, "
                f"one layer low; check the server's resolved ids"
            )
    if ids != sorted(ids):
        text += "; keep them ascending"
    return f"{text}; {cli}"


def unsorted_note(ids) -> str | None:
    """What the engines do with ids out of ascending order (None when they are in order)."""
    ids = list(ids)
    if ids == sorted(ids):
        return None
    return (
        f"the ids {ids} are not in ascending order: vLLM sorts them ({sorted(set(ids))}), eaglekit and SGLang "
        f"concatenate the captures in the order written, so the engines feed the draft different features"
    )
