"""Reading safetensors folders (single file or sharded index) with errors that say what to do."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from ..errors import InputError


def _open_file(path: Path, what: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        size = path.stat().st_size if path.exists() else 0
        raise InputError(
            f"{what} weights file {path} ({size} bytes) cannot be read: it is truncated or corrupt ({e})",
            fix="re-copy or re-export the checkpoint; a partial download or an interrupted write leaves such a file",
            code="E105",
        ) from None


def read_folder_tensors(folder: str | Path, what: str) -> dict[str, torch.Tensor]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{what} folder {folder} does not exist", fix="pass the path of a model folder", code="E101")
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        return _open_file(single, what)
    if index.is_file():
        from .config import read_json

        weight_map = read_json(index, f"{what} weights index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise InputError(
                f"{what} weights index {index} has no weight_map object", fix="re-export the checkpoint", code="E154"
            )
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            p = folder / shard
            if not p.is_file():
                raise InputError(
                    f"{what} shard {p} named by {index.name} is missing",
                    fix="copy every shard listed in the index",
                    code="E106",
                )
            tensors.update(_open_file(p, what))
        missing = [k for k in weight_map if k not in tensors]
        if missing:
            raise InputError(
                f"{what} index lists {len(missing)} tensors absent from the shards, e.g. {missing[:3]}",
                fix="re-export the checkpoint",
                code="E105",
            )
        return tensors
    others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    hint = f" (found {', '.join(others[:3])}: only safetensors are read)" if others else ""
    raise InputError(
        f"{what} folder {folder} has no model.safetensors or model.safetensors.index.json{hint}",
        fix="save the model with safetensors (save_pretrained does by default)",
        code="E106",
    )


def load_state_dict_into(
    net: nn.Module,
    tensors: dict[str, torch.Tensor],
    folder,
    dtype,
    device,
    tied: dict[str, str] | None = None,
    optional: tuple[str, ...] = (),
) -> None:
    """Strict load with readable errors; `tied` maps a parameter to the one it shares storage with."""
    tied = tied or {}
    expected = {k: v for k, v in net.state_dict(keep_vars=True).items() if k not in tied}
    missing = [k for k in expected if k not in tensors and k not in optional]
    if missing:
        raise InputError(
            f"checkpoint in {folder} lacks {len(missing)} tensors the model needs, e.g. {missing[:4]}",
            fix="check that config.json belongs to these weights",
            code="E107",
        )
    bad = [
        (k, tuple(tensors[k].shape), tuple(v.shape))
        for k, v in expected.items()
        if k in tensors and tuple(tensors[k].shape) != tuple(v.shape)
    ]
    if bad:
        k, got, want = bad[0]
        raise InputError(
            f"tensor {k} in {folder} has shape {got} but config.json implies {want}"
            + (f" ({len(bad) - 1} more mismatches)" if len(bad) > 1 else ""),
            fix="check that config.json belongs to these weights",
            code="E107",
        )
    state = {}
    for k, v in expected.items():
        if k in tensors:
            t = tensors[k]
            state[k] = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        else:  # optional and absent: materialise as the module initialises it
            state[k] = torch.zeros(v.shape, dtype=dtype if v.is_floating_point() else v.dtype, device=device)
    net.load_state_dict(state, strict=False, assign=True)
    for dst, src in tied.items():
        mod_path, _, attr = dst.rpartition(".")
        src_mod, _, src_attr = src.rpartition(".")
        setattr(net.get_submodule(mod_path), attr, getattr(net.get_submodule(src_mod), src_attr))
