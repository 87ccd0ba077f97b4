"""Loading a target and its draft together (the draft borrows the target's embedding)."""

from __future__ import annotations

from .draft import Eagle3Draft, load_draft
from .errors import InputError
from .models import Target, load_target
from .options import PRODUCTS, resolve_device


def pick_device(name: str | None = "auto") -> str:
    """--device's one meaning in every command: auto = cuda if a CUDA device is visible, else cpu."""
    return resolve_device(name)


def load_pair(target_dir, draft_dir=None, backend: str = "auto", device: str = "auto", dtype=None,
              compile: str | bool = "auto", products: str = "auto",
              batched: bool = False, draft_quant: str | None = None) -> tuple[Target, Eagle3Draft | None]:
    """`compile`: torch.compile the decoder layers for the decode shapes. 'auto' (or None) compiles on a GPU with
    eaglekit's own decoder, where the engine records the compiled kernels in its CUDA graphs (on a CPU it does not
    pay: benchmarks/NOTES.md); 'on' / True everywhere, 'off' / False never. The first generation pays the
    compile; eaglekit.models.compiling keeps the kernels for the next run.

    `products`: how the decode products run (eaglekit.models.products). 'auto': on a CPU with eaglekit's decoder,
    uncompiled, the faster of 'aten' and 'onednn' on this machine by timing a step and a verify (~1 s;
    `products_pick` on the target says what was timed); on a GPU in bf16/fp16, 'bulk' where its kernels take the
    model (bf16, sm_90, nvcc; eaglekit.models.bulk) and 'invariant' elsewhere, with a draft or without (so
    `generate --baseline` decodes the same bits as `generate`), unless `batched` (serve: many rows per forward,
    where its 16-row tiles are untimed); elsewhere F.linear (inductor compiles them). 'aten', 'onednn' (CPU) or
    'smallm' (GPU, Triton) force one; 'invariant' (GPU, Triton) and 'bulk' (sm_90 GPU, CUDA built at first use)
    make every decode product and the decode attention batch-invariant, so bf16 speculative output is identical to
    the bf16 baseline (the draft keeps F.linear). Their cost on the 8B shape, H200: invariant's step +3-11% over
    F.linear's; bulk's step ~15% faster than invariant's and its verifies 5-17% (benchmarks/NOTES.md).

    `draft_quant`: 'int8' runs the draft's products from int8 weights (eaglekit.models.quant: half its bytes a step;
    the output is the target's either way, the accept length may move); None or 'none' as stored."""
    device = pick_device(device)
    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    draft = None
    if draft_dir is not None:
        draft = load_draft(draft_dir, device=device, dtype=target.dtype, embed_weight=target.embed_weight())
        draft.fuse()
        if draft_quant not in (None, "none"):
            draft.quantize(draft_quant)
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
    set_pair_products(target, draft, products, device, batched)
    return target, draft


def set_pair_products(target, draft, products: str = "auto", device="cpu", batched: bool = False) -> None:
    """load_pair's `products` for a target and draft loaded some other way (see load_pair)."""
    from .models import smallm
    from .models.products import onednn_available, pick_cpu

    if products not in PRODUCTS:
        raise InputError(f"products={products!r} is not one of {', '.join(PRODUCTS)}", code="E108",
                         fix="pass auto, aten, onednn, smallm, invariant or bulk")
    ours = own_decoder(target)
    cpu = str(device) == "cpu"
    if products == "auto":
        products = auto_products(target, device, batched)
        if products is None:  # F.linear; compiled layers: inductor does the products its own way
            return
        if products == "pick":
            target.products_pick = pick_cpu(target)
            products = target.products_pick["products"]
        elif products == "bulk":
            from .models import bulk

            try:
                target.set_products("bulk")
            except bulk.Unavailable as e:  # (a build that failed: the same guarantee through Triton kernels)
                import warnings

                warnings.warn(f"products auto: bulk kernels unavailable ({e}); using invariant", stacklevel=2)
                products = "invariant"
                target.set_products(products)
        else:
            target.set_products(products)
    elif not ours:
        raise InputError(f"--products {products} needs eaglekit's own decoder on one device", code="E108",
                         fix="leave out --products for transformers-backed or tensor-parallel targets")
    elif products == "onednn" and not (cpu and onednn_available()):
        raise InputError("--products onednn runs on a CPU whose torch has oneDNN", code="E108",
                         fix="use --products aten (or auto) here")
    elif products == "onednn" and compiled(target):
        raise InputError("--products onednn cannot run inside torch.compile'd layers", code="E108",
                         fix="leave out --compile, or use --products aten")
    elif products in ("smallm", "invariant", "bulk") and not (str(device).startswith("cuda") and smallm.HAVE_TRITON):
        raise InputError(f"--products {products} is a GPU kernel (Triton)", code="E108",
                         fix="use it with --device cuda and triton installed")
    elif products == "bulk" and bulk_reason(target) is not None:
        raise InputError(f"--products bulk cannot run this target: {bulk_reason(target)}", code="E108",
                         fix="use --products invariant (the same guarantee, Triton kernels)")
    else:
        target.set_products(products)
    if draft is not None and hasattr(draft, "set_products"):
        # the draft's arithmetic never reaches the output: it keeps the fast products when the target is invariant
        draft.set_products(products if products not in ("invariant", "bulk") else None)
    if draft is not None and hasattr(draft, "set_attention"):
        # with bulk's kernels built for the target, the draft's decode attention takes bulk's too where its heads fit
        draft.set_attention("bulk" if products == "bulk" else "sdpa")


def auto_products(target, device, batched: bool = False) -> str | None:
    """What products='auto' means for this pair: 'pick' (time aten against onednn on this CPU), 'bulk' (bf16 on an
    sm_90 GPU with nvcc, a model its kernels take: the fastest baseline and the same guarantee as invariant's),
    'invariant' (bf16 or fp16 on other GPUs: speculative greedy output identical to the plain decode, whether or
    not a draft is loaded here, and the cycle no slower), or None (F.linear, or what inductor makes of it). The
    choice never depends on the tree: `generate --baseline` must decode the bits `generate` does."""
    import torch

    from .models import smallm

    if not own_decoder(target):
        return None  # transformers-backed or tensor-parallel: their own products
    if str(device) == "cpu":
        return None if compiled(target) else "pick"
    if (str(device).startswith("cuda") and not batched and smallm.HAVE_TRITON
            and getattr(target, "dtype", None) in (torch.bfloat16, torch.float16)):
        return "bulk" if bulk_reason(target) is None else "invariant"
    return None


def bulk_reason(target) -> str | None:
    """Why products 'bulk' (eaglekit.models.bulk) cannot run this target, or None where it can."""
    from .models import bulk

    cfg = getattr(target, "cfg", None)
    if cfg is None or not own_decoder(target):
        return "it needs eaglekit's own decoder on one device"
    return bulk.reason(cfg, target.device, target.dtype)


def own_decoder(target) -> bool:
    """Whether products can be set on this target: eaglekit's own decoder on one device (not transformers-backed,
    not a tensor-parallel rank)."""
    return hasattr(target, "set_products") and getattr(target, "tp", None) is None


def compiled(target) -> bool:
    """Whether the target's decode-time layers run compiled (load_pair's `compile`)."""
    return getattr(getattr(target, "net", None), "compiled_layer", None) is not None
