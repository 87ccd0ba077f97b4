"""A decode call's routed experts in two Triton kernels: each (token, expert) pair's gate and up rows against the
token with silu(gate) * up in the same program, then per token its experts' down rows, weighted and summed in a fixed
order.

Why it was written: in DeepSeek-V2-Lite's compiled decode step on an H200, inductor's fused gathers
(eaglekit.models.moe.Experts.gather, `fused`) read the indexed expert weights at 61% (gate/up) and 31% (down) of copy
bandwidth; the two took 1.39 of the step's 3.62 ms (docs/performance.md#d33).
No kernel in torch does an indexed grouped GEMV: torch._grouped_mm groups rows by expert (a prefill's shape), and at
one token a row per expert leaves its tiles nearly empty (eaglekit.models.moe.Experts.grouped runs it so, opt-in, to
be measured against this).

What it computes, for x [N, D], the stacked weights gate_up [E, 2I, D] and down [E, D, I], ids and weights [N, k]:
act[n, j] = silu(gate_up[e][:I] . x[n]) * (gate_up[e][I:] . x[n]) with e = ids[n, j], each product rounded to x's
dtype first; y[n] = sum over j = 0..k-1 in order of weights[n, j] * (down[e] . act[n, j]) rounded to x's dtype, summed
in float32: the arithmetic of Experts.gather. A token's result depends on its row and experts alone (each pair is its
own program and sums over D and I in the same blocks whatever N is), so a token stepped alone and the same token in a
verified tree get the same bits. Reads each pair's expert once (a tree's tokens that share an expert read it once
each: what the gather reads too).

Opt-in (`Experts.mode = "triton"`, `DeepSeekTarget.set_experts("triton")`) until its speed is measured on a GPU;
`reference` is the same computation in torch (the tests' oracle). Runs where Triton runs (CUDA, or Triton's
interpreter in tests), for bfloat16 and float16.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F

HAVE_TRITON = importlib.util.find_spec("triton") is not None
MAX_PAIRS = 512  # (token, expert) pairs a call may have: decode steps and trees; a prompt takes the loop
# blocks: rows of one program and the width of one load. A function of nothing but these constants, so a token's bits
# never depend on the call's size (see the docstring)
BLOCK_I, BLOCK_D = 16, 256  # gate/up: 2 x 16 rows x 256 columns a load
BLOCK_R, BLOCK_K = 8, 256  # down: 8 output rows x 256 columns of I a load


def usable(x: torch.Tensor, pairs: int) -> bool:
    """Whether `experts` runs the kernels for x [N, D] with `pairs` (token, expert) pairs."""
    return (
        HAVE_TRITON
        and x.dtype in (torch.bfloat16, torch.float16)
        and pairs <= MAX_PAIRS
        and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
    )


def reference(x, gate_up, down, idx, w):
    """The kernels' computation in torch (Experts.gather's arithmetic), for tests."""
    I = down.shape[-1]
    gu = torch.matmul(gate_up[idx], x[:, None, :, None]).squeeze(-1)  # [N, k, 2I] in x's dtype
    g, u = gu.split(I, dim=-1)
    a = F.silu(g) * u
    y = torch.matmul(down[idx], a[..., None]).squeeze(-1)  # [N, k, D]
    return (y.float() * w.float()[..., None]).sum(1).to(x.dtype)


_OPS = None


def kernels():
    """`.op` (torch.library.triton_op: torch.compile sees its kernels, CUDA graphs record them) and `.run` (the
    same, called directly). Built on first use, so that importing eaglekit never needs Triton."""
    global _OPS
    if _OPS is None:
        from torch.library import triton_op, wrap_triton

        from . import moe_gemv_triton
        from .compiling import op_name
        from .invariant_gemm import triton_cdiv

        def run(x, gate_up, down, idx, w, wrap=lambda k: k):
            N, D = x.shape
            k = idx.shape[-1]
            I = down.shape[-1]
            x = x.contiguous()
            ids = idx.reshape(-1).contiguous()
            wt = w.reshape(-1).float().contiguous()
            act = torch.empty((N * k, I), device=x.device, dtype=x.dtype)
            y = torch.empty((N, D), device=x.device, dtype=x.dtype)
            wrap(moe_gemv_triton.gate_up_act)[(N * k, triton_cdiv(I, BLOCK_I))](
                x, gate_up, ids, act, I, D, k, gate_up.stride(0), gate_up.stride(1), BLOCK_I=BLOCK_I, BLOCK_D=BLOCK_D
            )
            wrap(moe_gemv_triton.down_sum)[(N, triton_cdiv(D, BLOCK_R))](
                act, down, ids, wt, y, I, D, k, down.stride(0), down.stride(1), BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K
            )
            return y

        @triton_op(op_name("moe_gemv", __file__, moe_gemv_triton.__file__), mutates_args=())
        def moe_gemv(
            x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, idx: torch.Tensor, w: torch.Tensor
        ) -> torch.Tensor:
            return run(x, gate_up, down, idx, w, wrap_triton)

        _OPS = SimpleNamespace(op=moe_gemv, run=run)
    return _OPS


def experts(x, gate_up, down, idx, w):
    """y [N, D] for x [N, D] through each token's experts idx [N, k] weighted by w [N, k] (the docstring's sum)."""
    if gate_up.stride(-1) != 1 or down.stride(-1) != 1:
        raise ValueError("the stacked expert weights must be contiguous in their last dimension")
    return kernels().op(x, gate_up, down, idx, w)
