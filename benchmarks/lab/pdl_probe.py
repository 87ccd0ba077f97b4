"""Do programmatic dependent launches (PDL) hide a product's ramp? (Fast v2, goal 1)

The 8B step's products cost ~3.7 us each beyond their bytes (benchmarks/NOTES.md: o 4096x4096 13.8 us, qkv 19.1,
down 39.0 at M=1, a line of slope 3.33 TB/s through them), and the step runs four of them a layer. With PDL a kernel
lets its successor launch before it ends (`griddepcontrol.launch_dependents`); the successor can then read what no
predecessor writes (its weight) before it waits (`griddepcontrol.wait`) for what one does (its input row). This
times, in one CUDA graph, eight layers' worth of the step's four products (M=1, each product's input the previous
one's output) with invariant_gemm's tiling, as plain launches and as PDL launches that do 0, 1 or 2 weight tiles' loads
(into L2, as prefetches) before the wait, side by side; and checks the outputs equal the plain launches'.

    python benchmarks/lab/pdl_probe.py OUT
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarks.timing import graph_ms  # noqa: E402  (the suite's timer)
from eaglekit.kernels import invariant_gemm  # noqa: E402


@triton.jit
def product(x_ptr, w_ptr, part_ptr, M, N, K, stride_xm, stride_wn, k_slice, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, GDC: tl.constexpr, PREFETCH: tl.constexpr):
    # smallm_partial's plain product (no epilogue), with the PDL hooks: PREFETCH weight tiles of this program's
    # slice into L2, then wait for the predecessor (its output is our x), then let the successor launch
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, 16)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = pid_k * k_slice
    if PREFETCH > 0:
        # one address per 128-byte line (64 bf16) of the program's first PREFETCH tiles, as a flat list
        idx = tl.arange(0, BLOCK_N * (BLOCK_K // 64) * PREFETCH)
        row = tl.minimum(pid_n * BLOCK_N + idx % BLOCK_N, N - 1)
        col = tl.minimum(k0 + (idx // BLOCK_N) * 64, K - 1)
        p = w_ptr + row.to(tl.int64) * stride_wn + col
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [p], dtype=tl.int32,
                                  is_pure=False, pack=1)
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_slice, BLOCK_K):
        rk = k0 + kk + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                     other=0.0)
        wt = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K),
                     other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc)
    omask = (rm[:, None] < M) & (rn[None, :] < N)
    if pid_k == 0 and k_slice >= K:
        tl.store(part_ptr + rm[:, None] * N + rn[None, :], acc.to(part_ptr.dtype.element_ty), mask=omask)
    else:
        tl.store(part_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=omask)


@triton.jit
def add_parts(part_ptr, y_ptr, M, N, SPLIT: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < M * N
    acc = tl.load(part_ptr + offs, mask=m, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(part_ptr + s * M * N + offs, mask=m, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=m)


def linear(x, w, y, part, gdc: bool, prefetch: int):
    M, K = x.shape
    N = w.shape[0]
    block_n, block_k, split, warps, stages = invariant_gemm.config(N, K, exact=True)
    k_slice = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    kw = {"launch_pdl": True} if gdc else {}
    product[(triton.cdiv(N, block_n), split)](x, w, y if split == 1 else part, M, N, K, x.stride(0), w.stride(0),
                                              k_slice, BLOCK_N=block_n, BLOCK_K=block_k, GDC=gdc,
                                              PREFETCH=prefetch, num_warps=warps, num_stages=stages, **kw)
    if split > 1:
        add_parts[(triton.cdiv(M * N, 1024),)](part, y, M, N, SPLIT=split, BLOCK=1024, GDC=gdc,
                                               num_warps=4, **kw)


class Chain:
    """`layers` layers' worth of the 8B step's four products (q/k/v, o, gate/up, down; random bf16 weights, 0.44 GB
    a layer, so nothing stays in L2 from one replay to the next) at `rows` rows, each product fed the previous one's
    output (its first K columns), as a decode step feeds them. body(linear) runs the chain with linear(x, w, y):
    it writes y [rows, N] or returns its own output."""

    SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]

    def __init__(self, layers: int = 8, rows: int = 1, dev: str = "cuda"):
        torch.manual_seed(0)
        self.ws = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for n, k in self.SHAPES]
                   for _ in range(layers)]
        self.nbytes = sum(w.numel() * 2 for lw in self.ws for w in lw)
        self.x0 = torch.randn(rows, 4096, device=dev, dtype=torch.bfloat16)
        self.ys = [torch.empty(rows, n, device=dev, dtype=torch.bfloat16) for n, _ in self.SHAPES]
        self.products = 4 * layers

    def body(self, linear):
        def run():
            x = self.x0
            for lw in self.ws:
                for i, w in enumerate(lw):
                    y = linear(x[:, : w.shape[1]], w, self.ys[i])
                    x = self.ys[i] if y is None else y
            self.last = x
        return run

    def measure(self, linear, ref=None) -> tuple[dict, torch.Tensor]:
        """-> (ms of one replay, us a product, bytes per second, whether the output equals `ref`), the output."""
        body = self.body(linear)
        ms = graph_ms(body)
        body()
        torch.cuda.synchronize()
        got = self.last.clone()
        row = {"ms": round(ms, 4), "us_per_product": round(ms * 1e3 / self.products, 2),
               "bandwidth_TBps": round(self.nbytes / (ms / 1e3) / 1e12, 3)}
        if ref is not None:
            row["same_output"] = bool(torch.equal(got, ref))
        return row, got


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    chain = Chain(int(sys.argv[2]) if len(sys.argv) > 2 else 8)
    part = torch.empty(4, 1, 32768, device="cuda", dtype=torch.float32)
    res = {"device": torch.cuda.get_device_name(), "layers": len(chain.ws), "weight_bytes": chain.nbytes,
           "variants": {}}
    ref = None
    for name, gdc, pf in (("plain", False, 0), ("pdl", True, 0), ("pdl+prefetch1", True, 1),
                          ("pdl+prefetch2", True, 2), ("prefetch1 alone", False, 1), ("plain again", False, 0)):
        try:
            row, got = chain.measure(lambda x, w, y, g=gdc, p=pf: linear(x, w, y, part, g, p), ref)
            ref = got if ref is None else ref
            res["variants"][name] = row
        except Exception as e:
            traceback.print_exc()
            res["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
        print(name, res["variants"][name], flush=True)
        (out / "pdl_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
