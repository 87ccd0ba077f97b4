"""Loading a target and its draft together (the draft borrows the target's embedding)."""

from __future__ import annotations

from .draft import Eagle3Draft, load_draft
from .errors import InputError
from .models import Target, load_target
from .options import resolve_device


def pick_device(name: str | None = "auto") -> str:
    """--device's one meaning in every command: auto = cuda if a CUDA device is visible, else cpu."""
    return resolve_device(name)


def load_pair(target_dir, draft_dir=None, backend: str = "auto", device: str = "auto", dtype=None,
              compile: bool = False) -> tuple[Target, Eagle3Draft | None]:
    """`compile`: torch.compile the decoder layers for the decode shapes (worth it on a GPU, where the
    engine records the compiled kernels in CUDA graphs; the first generation pays the compile)."""
    device = pick_device(device)
    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    draft = None
    if draft_dir is not None:
        draft = load_draft(draft_dir, device=device, dtype=target.dtype, embed_weight=target.embed_weight())
        draft.fuse()
    if compile:
        if not hasattr(target, "compile"):
            raise InputError("--compile needs eaglekit's own decoder (--backend ours)", code="E108",
                             fix="leave out --compile for transformers-backed targets")
        target.compile()
        if draft is not None:
            draft.compile()
    return target, draft
