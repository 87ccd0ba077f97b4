"""Loading a target and its draft together (the draft borrows the target's embedding)."""

from __future__ import annotations

import torch

from .draft import Eagle3Draft, load_draft
from .errors import InputError
from .models import Target, load_target


def pick_device(name: str | None = "auto") -> str:
    if name in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {name} was asked for but no CUDA device is visible", fix="use --device cpu",
                         code="E108")
    return name


def load_pair(target_dir, draft_dir=None, backend: str = "auto", device: str = "auto", dtype=None
              ) -> tuple[Target, Eagle3Draft | None]:
    device = pick_device(device)
    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    draft = None
    if draft_dir is not None:
        draft = load_draft(draft_dir, device=device, dtype=target.dtype, embed_weight=target.embed_weight())
    return target, draft
