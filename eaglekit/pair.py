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
              compile: str | bool = "auto") -> tuple[Target, Eagle3Draft | None]:
    """`compile`: torch.compile the decoder layers for the decode shapes. 'auto' (or None) compiles on a GPU with
    eaglekit's own decoder, where the engine records the compiled kernels in its CUDA graphs (on a CPU it does not
    pay: benchmarks/NOTES.md); 'on' / True everywhere, 'off' / False never. The first generation pays the
    compile; eaglekit.models.compiling keeps the kernels for the next run."""
    device = pick_device(device)
    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    draft = None
    if draft_dir is not None:
        draft = load_draft(draft_dir, device=device, dtype=target.dtype, embed_weight=target.embed_weight())
        draft.fuse()
    if compile in ("auto", None):
        # (tensor-parallel ranks stay uncompiled: their all-reduces sit inside the layers)
        compile = str(device).startswith("cuda") and hasattr(target, "compile") and getattr(target, "tp", None) is None
    elif compile not in (True, False, "on", "off"):
        raise InputError(f"compile={compile!r} is not one of auto, on, off", fix="pass auto, on or off", code="E108")
    if compile in (True, "on"):
        if not hasattr(target, "compile"):
            raise InputError("--compile needs eaglekit's own decoder (--backend ours)", code="E108",
                             fix="leave out --compile for transformers-backed targets")
        target.compile()
        if draft is not None:
            draft.compile()
    return target, draft


def compiled(target) -> bool:
    """Whether the target's decode-time layers run compiled (load_pair's `compile`)."""
    return getattr(getattr(target, "net", None), "compiled_layer", None) is not None
