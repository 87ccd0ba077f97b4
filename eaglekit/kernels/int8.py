"""Weight-only int8 for the draft's products: half the bytes a draft step reads, the same output.

Why: at batch 1 a draft step reads its whole layer and lm_head (the 8B shape's draft: 0.75 GB a step in bf16, five
reads a (5,1,6) cycle: ~1 ms on an H200, a quarter of the target's step). What the draft computes never reaches the
output (the target verifies every token), only how many tokens it gets accepted; int8 rows with a float32 scale per
row (symmetric, rounded to nearest) kept the demo pair's accept length within 0.3% on (5,1,6) and (5,4,8), as fp8
e4m3 did; int4 in groups of 128 lost 5% (docs/performance.md#d23).

How: `Int8Linear` stands in for an nn.Linear (and for a fused [q; k; v] or [gate; up] weight: layers.product runs it).
Its product is x @ (q * scale[:, None])^T: on a GPU in bf16/fp16 through eaglekit.kernels.invariant_gemm's kernel, the
int8 tiles widened as they are read (`SCALED`), one row or many (configs: invariant_gemm.int8_rule); elsewhere F.linear
over the widened weight (correct, not faster: the CPU demo's draft is small). On the H200 (8B shape, hopper target) it
makes the (5,1,6) chain about a third faster than bf16 (docs/performance.md#d24). Inductor's own
one-row GEMV over the int8 weight (ONE_ROW "inductor": the cast and the scale fused into its reduction) read it slower
than this kernel (the same decision)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn

from . import invariant_gemm

MODES = ("int8",)
# one row inside torch.compile: "kernel" (invariant_gemm's, as for more rows) or "inductor" (its GEMV reduction over the
# widened weight); read when a graph is traced (tests/gpu/test_gpu.py checks both against the fp64 product)
ONE_ROW = "kernel"


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (int8 [N, K], float32 scale [N]) with w ~= q * scale[:, None]; a zero row gets scale 1."""
    wf = w.detach().float()
    amax = wf.abs().amax(dim=1)
    if not torch.isfinite(amax).all():
        raise ValueError("int8 quantization: the weight has NaN or infinite values")
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = (wf / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """An nn.Linear whose weight is int8 rows and a float32 scale per row (buffers `qweight`, `scale`)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int8Linear":
        q, s = quantize(weight)
        return cls(q, s, None if bias is None else bias.detach().clone())

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    def rows(self, start: int, stop: int) -> "Int8Linear":
        """Rows [start, stop) as a module of their own sharing this one's memory (a fused weight's parts)."""
        b = None if self.bias is None else self.bias[start:stop]
        return Int8Linear(self.qweight[start:stop], self.scale[start:stop], b)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, gated: bool = False) -> torch.Tensor:
        """invariant_gemm.epilogue(x @ W^T + bias, residual, gated), W = qweight * scale."""
        one_row = x.numel() == x.shape[-1]
        inductor = ONE_ROW == "inductor" and one_row and torch.compiler.is_compiling()
        return invariant_gemm.linear(
            x,
            self.qweight,
            self.bias,
            enabled=not inductor,
            exact=True,
            residual=residual,
            gated=gated,
            scale=self.scale,
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(module: nn.Module, names: list[str]) -> None:
    """Replace module.<name> (nn.Linear, dotted paths) by its Int8Linear."""
    for name in names:
        parent, _, leaf = name.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        lin = getattr(owner, leaf)
        if isinstance(lin, nn.Linear):
            setattr(owner, leaf, Int8Linear.of(lin.weight, lin.bias))


def fused(parts: list[nn.Module]) -> tuple[Int8Linear, list[Int8Linear]]:
    """One Int8Linear over the parts' rows (their order) and each part again as a view of it: per-row scales make
    quantizing the concatenation the same as concatenating the quantized parts."""
    q = cast("list[Int8Linear]", parts)  # (quantize_linears made each part an Int8Linear)
    whole = Int8Linear(
        torch.cat([p.qweight for p in q]),
        torch.cat([p.scale for p in q]),
        None if q[0].bias is None else torch.cat([cast(torch.Tensor, p.bias) for p in q]),
    )
    views: list[Int8Linear] = []
    i = 0
    for p in q:
        views.append(whole.rows(i, i + p.out_features))
        i += p.out_features
    return whole, views
