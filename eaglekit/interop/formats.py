"""The draft folder formats of the ecosystem, read into one layout at the edge.

    eaglekit  SGLang layout + an `eaglekit` block (capture in after_layers, target fingerprint)
    sglang    SGLang / SpecForge: architectures [LlamaForCausalLMEagle3], ids in
              eagle_config.eagle_aux_hidden_state_layer_ids meaning "output of layer i" (= after_layers)
    vllm      vLLM speculators: architectures [Eagle3Speculator], transformer_layer_config,
              speculators_config, top-level eagle_aux_hidden_state_layer_ids meaning "input of layer i"
    eagle     the SafeAILab EAGLE reference: a one-layer LlamaForCausalLM config, no ids; its target code
              captures the inputs of layers [2, n//2, n-3] (fixed), i.e. the default after_layers

`normalize` returns the config in the SGLang layout, the tensors under our names, and a FolderFormat
that says which convention the ids were written in, so every caller sees after_layers only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..capture import CaptureSpec
from ..errors import InputError
from ..models.config import read_json

NAMES = {"eaglekit": "eaglekit (SGLang layout + eaglekit block)", "sglang": "SGLang / SpecForge",
         "vllm": "vLLM speculators", "eagle": "EAGLE reference (SafeAILab)"}
CONVENTIONS = {"after_layers": "after_layers (output of layer i)", "output_of": "output of layer i (SGLang config ids)",
               "input_of": "input of layer i (vLLM, EAGLE reference)", None: "no ids recorded (engine default)"}


@dataclass
class FolderFormat:
    name: str
    ids_convention: str | None
    ids: list[int] | None
    capture: CaptureSpec | None
    weights: str
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"{NAMES[self.name]}; ids: {CONVENTIONS[self.ids_convention]}"


def _read_tensors(folder: Path) -> tuple[dict, str]:
    from ..models.weights import read_folder_tensors

    bin_file = folder / "pytorch_model.bin"
    has_st = (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
    if not has_st and bin_file.is_file():  # the EAGLE reference ships a pickle; load it without running code
        try:
            return torch.load(bin_file, map_location="cpu", weights_only=True), bin_file.name
        except Exception as e:  # noqa: BLE001 (any unpickling failure is a bad file)
            raise InputError(f"{bin_file} cannot be read as a weights-only checkpoint ({e})",
                             fix="convert it to safetensors", code="E105") from None
    tensors = read_folder_tensors(folder, "draft")
    return tensors, "model.safetensors"


def _our_names(tensors: dict) -> dict:
    out = {}
    for k, v in tensors.items():
        for p in ("model.", "draft_model."):
            if k.startswith(p):
                k = k[len(p):]
                break
        if k.startswith("layers.0."):  # speculators names the one layer layers.0; SGLang / SpecForge midlayer
            k = "midlayer." + k[len("layers.0."):]
        out[k] = v
    return out


def normalize(folder: str | Path) -> tuple[dict, dict, FolderFormat]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"draft folder {folder} does not exist", fix="pass the path of an EAGLE-3 draft folder",
                         code="E101")
    raw = read_json(folder / "config.json", "draft config")
    tensors, wfile = _read_tensors(folder)
    tensors = _our_names(tensors)
    archs = raw.get("architectures") or []
    block = raw.get("eaglekit") or {}
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if "Eagle3Speculator" in archs or "speculators_config" in raw or "transformer_layer_config" in raw:
        layer = dict(raw.get("transformer_layer_config") or {})
        cfg = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
               "draft_vocab_size": raw.get("draft_vocab_size", layer.get("vocab_size")),
               "norm_before_residual": raw.get("norm_before_residual", False)}
        for k in ("target_hidden_size", "norm_before_fc", "eaglekit"):
            if raw.get(k) is not None:
                cfg[k] = raw[k]
        ids = top or nested  # speculators: top level; some versions nest it: both mean "input of layer i"
        fmt = FolderFormat("vllm", "input_of" if ids else None, list(ids) if ids else None,
                           CaptureSpec.from_input_of(ids) if ids else None, wfile)
    elif block.get("capture"):
        cfg = dict(raw)
        spec = CaptureSpec.from_dict(block["capture"])
        fmt = FolderFormat("eaglekit", "after_layers", list(spec.after_layers), spec, wfile)
    elif any("eagle3" in a.lower() for a in archs):
        cfg = dict(raw)
        if nested:
            fmt = FolderFormat("sglang", "output_of", list(nested), CaptureSpec.from_output_of(nested), wfile)
        elif top:  # the vLLM spelling inside an SGLang-layout folder
            fmt = FolderFormat("sglang", "input_of", list(top), CaptureSpec.from_input_of(top), wfile,
                               ["ids found at the top level, read in vLLM's 'input of layer' convention"])
        else:
            fmt = FolderFormat("sglang", None, None, None, wfile)
    elif raw.get("num_hidden_layers") == 1 and "fc.weight" in tensors and any(k.startswith("midlayer.") for k in tensors):
        cfg = {**raw, "architectures": ["LlamaForCausalLMEagle3"]}
        fmt = FolderFormat("eagle", None, None, None, wfile,
                           ["the EAGLE reference captures the inputs of layers [2, n//2, n-3]: the default"])
    else:
        raise InputError(f"{folder / 'config.json'} describes {archs[0] if archs else 'no architecture'}, not an "
                         f"EAGLE-3 draft (architectures {archs})",
                         fix="pass the draft folder as --draft (a full model folder goes to --target)", code="E110")
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
            CaptureSpec.from_input_of(nested) if vllm else CaptureSpec.from_output_of(nested)).after_layers
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if top:
        out["top-level ids (vLLM: input of layer)"] = CaptureSpec.from_input_of(top).after_layers
    return out
