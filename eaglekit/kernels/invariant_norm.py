"""RMSNorm with one program per row (Triton): a row's bits do not depend on how many rows are normed with it.

Why: eager RMSNorm keeps a row's arithmetic whatever the row count, but inside torch.compile'd layers inductor generates
one kernel per token count, with its own block and warp layout, so the sum of squares of a row is added in another order
at 1 row and at k rows (compiled steps parted from the baseline with invariant products and attention alone:
docs/performance.md#d19). This op is opaque to inductor's fusion and its layout depends on
the width only. Used by products "invariant" (eaglekit.kernels.products.Invariant) on the GPU."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from .invariant_attention import usable


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dimension, statistics in fp32 (as layers.RMSNorm)."""
    return kernels().op(x, weight, eps)


def runs(x: torch.Tensor) -> bool:
    return x.shape[-1] <= 16384 and usable(x, 0)


_KERNELS = None


def kernels():
    """`.op(x, weight, eps)`, built on first use like invariant_gemm.kernels (products.Invariant builds it before
    compiling)."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _build()
    return _KERNELS


def _build():
    import triton
    import triton.language as tl
    from torch.library import triton_op, wrap_triton

    from .compiling import op_name

    @triton.jit
    def rms_norm_rows(x_ptr, w_ptr, y_ptr, D, EPS: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        d = tl.arange(0, BLOCK)
        m = d < D
        x = tl.load(x_ptr + r * D + d, mask=m, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / D + EPS)
        xn = (x * inv).to(y_ptr.dtype.element_ty)  # normed in fp32, cast, then weighted in the input dtype
        w = tl.load(w_ptr + d, mask=m, other=0.0)
        tl.store(y_ptr + r * D + d, (w * xn).to(y_ptr.dtype.element_ty), mask=m)

    @triton_op(op_name("invariant_rms_norm", __file__), mutates_args=())
    def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        D = x.shape[-1]
        xc = x.contiguous()
        y = torch.empty_like(xc)
        rows = xc.numel() // D
        block = triton.next_power_of_2(D)
        wrap_triton(rms_norm_rows)[(rows,)](
            xc, weight.to(x.dtype).contiguous(), y, D, EPS=eps, BLOCK=block, num_warps=4 if block <= 4096 else 8
        )
        return y

    return SimpleNamespace(op=invariant_rms_norm)
