"""The target side: our compact decoders (the Llama family; the DeepSeek family), and an adapter over transformers."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from .base import Target, TargetInfo
from .config import FAMILIES, TargetConfig, check_config_values, check_folder_json, load_target_config, read_json
from .deepseek_config import DEEPSEEK_FAMILIES, load_deepseek_config

BACKENDS = ("auto", "ours", "hf")


def resolve_dtype(name: str | torch.dtype | None, device: str = "cpu") -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        # bf16 matmuls are slow on most CPUs and the demo models are small: float32 there
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float64": torch.float64,
    }
    if name not in table:
        raise InputError(f"unknown dtype {name!r}", fix=f"use one of {', '.join(table)}", code="E108")
    return table[name]


def load_target(folder: str | Path, backend: str = "auto", device: str = "cpu", dtype=None) -> Target:
    """Load a Hugging Face model folder as a Target. `auto` picks our decoders for llama/mistral/qwen2/qwen3
    (models.llama) and deepseek_v2/deepseek_v3/kimi_k2 (models.deepseek), the transformers adapter for everything
    else and for configs our decoders do not implement. A .gguf file (or a folder holding one) is read as the
    folder eaglekit.gguf materializes from it."""
    from ..gguf import resolve_target

    folder = Path(resolve_target(folder))
    if not folder.is_dir():
        raise InputError(f"target folder {folder} does not exist", fix="pass the path of a model folder", code="E101")
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}", fix=f"use one of {', '.join(BACKENDS)}", code="E108")
    from ..distributed import current

    tp = current()
    if tp is not None and tp.world > 1:  # inside a tensor-parallel launch: this rank's shards, on its device
        if backend == "hf":
            raise InputError(
                "tensor parallelism (--tp / torchrun) runs eaglekit's own decoder only",
                fix="leave out --backend hf (or run without --tp)",
                code="E108",
            )
        device, backend = str(tp.device), "tp"
    dt = resolve_dtype(dtype, device)
    raw = read_json(folder / "config.json", "target config")
    check_folder_json(folder)
    # a field of the wrong type or range ("64", -3) is named here (E117, E102), before any loader reads the weights
    # or takes it for a config our decoders do not implement and hands it to transformers
    check_config_values(raw, str(folder / "config.json"))
    deepseek = raw.get("model_type") in DEEPSEEK_FAMILIES
    if backend == "auto":
        backend = "ours" if raw.get("model_type") in FAMILIES + DEEPSEEK_FAMILIES else "hf"
        if backend == "ours":
            try:
                load_deepseek_config(folder) if deepseek else load_target_config(folder)
            except InputError:
                backend = "hf"  # e.g. an unusual rope type or routing: transformers handles it
    if backend == "tp" and deepseek:
        raise InputError(
            "tensor parallelism (--tp / torchrun) runs eaglekit's Llama-family decoder only; DeepSeek "
            "models run on one device (docs/deepseek.md: how TP of MLA and EP of the experts would go)",
            fix="run without --tp (one GPU), or with --backend hf",
            code="E192",
        )
    if backend == "ours" and deepseek:
        from .deepseek import DeepSeekTarget

        target: Target = DeepSeekTarget.from_folder(folder, device, dt)
    elif backend == "tp":
        from .tp import TPLlamaTarget

        assert tp is not None  # (backend "tp" is set only inside a tensor-parallel launch)
        target = TPLlamaTarget.from_folder(folder, tp, dt, tp.lm_head)
    elif backend == "ours":
        from .llama import LlamaTarget

        target = LlamaTarget.from_folder(folder, device, dt)
    else:
        from .hf import HFTarget

        target = HFTarget.from_folder(folder, device, dt)
    from ..tokenizer import tokenizer_fingerprint

    target.tokenizer_fingerprint = tokenizer_fingerprint(folder)
    target.folder = folder
    return target


__all__ = [
    "BACKENDS",
    "DEEPSEEK_FAMILIES",
    "FAMILIES",
    "Target",
    "TargetConfig",
    "TargetInfo",
    "load_target",
    "load_target_config",
    "resolve_dtype",
]
