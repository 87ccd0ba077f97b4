"""How close can the step's products get to the read bandwidth, and which kernel style gets there? (Fast v2, goal 1)

pdl_probe.py measured invariant_gemm's products chained as in a step at 3.67-3.71 TB/s (85-86% of the copy figure), and
draft_fp8 showed invariant_gemm taking the same time for fp8 weights as for bf16 ones: bound per weight element, not per
byte. If the bf16 products are bound the same way, a kernel that spends less per element streams faster. This puts
side by side, on pdl_probe's chain (eight layers of q/k/v, o, gate/up, down; one CUDA graph each):

    the ceilings: a 2 GB copy (read + write), torch.sum over the chain's weights, a Triton read-and-sum of them
    invariant_gemm (a 16-row tile through tl.dot, the invariant default), a GEMV in Triton (fp32 multiply-adds and a sum
    over K: no dot, no operand layout), F.linear (cuBLAS), torch.compile'd F.linear

at 1 row (the baseline step) and at 8 (a verify), each product's output checked against F.linear's in float.

    python benchmarks/lab/product_ceiling.py OUT [--layers 8] [--ceilings-only | --by-size]

--by-size: the ceilings, then each weight shape alone as a pure read and as invariant_gemm's product (results and what
they say: benchmarks/NOTES.md, "The products' ceiling").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pdl_probe import Chain  # noqa: E402

from benchmarks.timing import graph_ms  # noqa: E402
from eaglekit.kernels import invariant_gemm  # noqa: E402


@triton.jit
def gemv(x_ptr, w_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
         ROWS: tl.constexpr):
    # y[r, n] = sum_k x[r, k] w[n, k] for ROWS rows, BLOCK_N outputs a program, K in BLOCK_K steps: each weight tile
    # is read once and multiplied into every row in fp32 registers (K must be a multiple of BLOCK_K)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rr = tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=nmask[:, None], other=0.0).to(tl.float32)
        x = tl.load(x_ptr + rr[:, None] * stride_xm + rk[None, :]).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    tl.store(y_ptr + rr[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=nmask[None, :])


def gemv_linear(block_n: int, block_k: int, warps: int):
    def run(x, w, y):
        N, K = w.shape
        gemv[(triton.cdiv(N, block_n),)](x, w, y, N, K, x.stride(0), w.stride(0), y.stride(0), BLOCK_N=block_n,
                                         BLOCK_K=block_k, ROWS=x.shape[0], num_warps=warps)
    return run


@triton.jit
def read_sum(ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


@triton.jit
def read_grid(ptr, out_ptr, n, BLOCK: tl.constexpr):
    # a persistent read: program p sums blocks p, p + grid, p + 2 grid, ... (each BLOCK contiguous elements)
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for b in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def ceilings(res: dict, gb: int = 4):
    """The device's copy and read ceilings on one `gb`-GB buffer, after 1.5 s of matrix products (the clocks idle
    before). The copy in a CUDA graph is a memcpy node and reads ~2.7 TB/s where h200_suite's eager copy reads
    4.1-4.25: recorded, not the figure goal 1 is stated against. -> the best read rate in bytes per second."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t = time.time()
    while time.time() - t < 1.5:
        a @ a
    torch.cuda.synchronize()
    del a
    n = gb * 2**30 // 2
    buf = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    half = buf[: n // 2]
    dst = torch.empty_like(half)
    ms = graph_ms(lambda: dst.copy_(half))
    res["copy_TBps (read + write)"] = round(2 * half.numel() * 2 / (ms / 1e3) / 1e12, 3)
    del dst
    sink = torch.empty((), device="cuda", dtype=torch.float32)
    ms = graph_ms(lambda: sink.copy_(buf.sum(dtype=torch.float32)))
    res["torch.sum_TBps"] = round(n * 2 / (ms / 1e3) / 1e12, 3)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for block, warps, per_sm in ((4096, 8, 4), (8192, 8, 4), (8192, 16, 2), (16384, 16, 2), (4096, 4, 8),
                                 (2048, 4, 16)):
        part = torch.empty(sms * per_sm, device="cuda")
        name = f"triton read {block} w{warps} x{per_sm}/SM_TBps"
        try:
            ms = graph_ms(lambda: read_grid[(part.numel(),)](buf, part, n, BLOCK=block, num_warps=warps))
            res[name] = round(n * 2 / (ms / 1e3) / 1e12, 3)
        except Exception as e:
            traceback.print_exc()
            res[name] = f"{type(e).__name__}: {str(e)[-300:]}"
    print(res, flush=True)
    del buf
    return max(v for k, v in res.items() if k.startswith("triton read") and isinstance(v, float)) * 1e12


def read_by_size(res: dict, chain: "Chain", big_rate: float):
    """A pure read (read_grid, its best tiling above) of each of the step's weight shapes as its own kernel, over the
    chain's eight copies in turn (nothing stays in L2), next to invariant_gemm's product of the same weights at one row:
    does a kernel that only streams one weight already lose the time the products lose (then only streaming across
    products, one persistent kernel, gets nearer the ceiling), or does it reach the big buffer's rate (`big_rate`,
    bytes per second)?"""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for i, (n, k) in enumerate(Chain.SHAPES):
        ws = [lw[i] for lw in chain.ws]
        nbytes = sum(w.numel() * 2 for w in ws)
        part = torch.empty(sms * 4, device="cuda")
        ms_read = graph_ms(lambda: [read_grid[(part.numel(),)](w, part, w.numel(), BLOCK=8192, num_warps=8)
                                    for w in ws])
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)  # the chain's x0 is only 4096 wide
        ms_prod = graph_ms(lambda: [smallm_linear(x, w, None) for w in ws])
        res[f"{n}x{k}"] = {"MB": round(nbytes / len(ws) / 1e6, 1),
                           "read_us": round(ms_read * 1e3 / len(ws), 2),
                           "read_TBps": round(nbytes / (ms_read / 1e3) / 1e12, 3),
                           "smallm_us": round(ms_prod * 1e3 / len(ws), 2),
                           "smallm_TBps": round(nbytes / (ms_prod / 1e3) / 1e12, 3),
                           "us_at_big_read_rate": round(nbytes / len(ws) / big_rate * 1e6, 2)}
        print(f"{n}x{k}", res[f"{n}x{k}"], flush=True)


def smallm_linear(x, w, y):
    return invariant_gemm.kernels().run(x, w, invariant_gemm.config(*w.shape, exact=True))


def aten_linear(x, w, y):
    torch.matmul(x, w.t(), out=y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ceilings-only", action="store_true")
    ap.add_argument("--by-size", action="store_true", help="only the ceilings and the reads and products per shape")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": torch.cuda.get_device_name(), "ceilings": {}, "chains": {}}

    def save():
        (out / "product_ceiling.json").write_text(json.dumps(res, indent=1))

    big_rate = ceilings(res["ceilings"])
    save()
    if args.ceilings_only:
        return
    if args.by_size:
        res["by_size"] = {}
        read_by_size(res["by_size"], Chain(args.layers, 1), big_rate)
        save()
        return
    for rows in (1, 8):
        chain = Chain(args.layers, rows)
        flat = [w.view(-1) for lw in chain.ws for w in lw]
        if rows == 1:
            sink = torch.empty((), device="cuda")
            ms = graph_ms(lambda: [sink.copy_(f.sum()) for f in flat])
            res["ceilings"]["torch.sum over the weights_TBps"] = round(chain.nbytes / (ms / 1e3) / 1e12, 3)
            B, IT = 4096, 16
            parts = [torch.empty(triton.cdiv(f.numel(), B * IT), device="cuda") for f in flat]
            ms = graph_ms(lambda: [read_sum[(p.numel(),)](f, p, f.numel(), BLOCK=B, ITERS=IT, num_warps=8)
                                   for f, p in zip(flat, parts)])
            res["ceilings"]["triton read-and-sum_TBps"] = round(chain.nbytes / (ms / 1e3) / 1e12, 3)
            print(res["ceilings"], flush=True)
            save()
        w0 = chain.ws[0][0]
        ref = F.linear(chain.x0.float()[:, : w0.shape[1]], w0.float())  # the chain's first product, in float
        variants = {"invariant_gemm (tl.dot)": smallm_linear, "F.linear (cuBLAS)": aten_linear,
                    "compiled F.linear": torch.compile(lambda x, w, y: F.linear(x, w), dynamic=False)}
        for bn, bk, wp in ((16, 256, 4), (32, 128, 4), (8, 512, 4), (16, 512, 8), (64, 64, 4), (4, 512, 4),
                           (8, 256, 2)):
            variants[f"gemv {bn}x{bk} w{wp}"] = gemv_linear(bn, bk, wp)
        rowres = {}
        for name, fn in variants.items():
            try:
                y = torch.empty(rows, w0.shape[0], device="cuda", dtype=torch.bfloat16)
                got = fn(chain.x0, w0, y)
                y = y if got is None else got
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                row, _ = chain.measure(fn)
                row["first_product_rel_err"] = round(err, 5)
                rowres[name] = row
            except Exception as e:
                traceback.print_exc()
                rowres[name] = {"error": f"{type(e).__name__}: {str(e)[-500:]}"}
            print(rows, name, rowres[name], flush=True)
            res["chains"][f"rows={rows}"] = rowres
            save()
        del chain, flat


if __name__ == "__main__":
    main()
