"""Does a weight prefetched into L2 during a latency-bound kernel make the next product faster? (Fast v2, goal 1)

The 8B step's attention (~11 us a layer: 64 small kernels, 0.37 ms a step) leaves HBM nearly idle, and the o
product after it (4096 x 4096 bf16, 33.5 MB, ~12 us at ~2.8 TB/s) fits the H200's L2. This times, in CUDA graphs
with L2 flushed first, a product alone, after a spin of the attention's length, and after a prefetch issued before
that spin (instructions with no destination register: the threads do not wait for the data), so the product's own
time with and without the prefetch is a difference of two graphs measured side by side.

    python benchmarks/l2_prefetch.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import graph_ms  # noqa: E402  (benchmarks/timing.py, beside this script)

from eaglekit.models import smallm  # noqa: E402


@triton.jit
def prefetch_lines(ptr, n_lines, LINES: tl.constexpr):
    """One prefetch.global.L2 per 128-byte line of [ptr, ptr + 128 * n_lines)."""
    offs = tl.minimum(tl.program_id(0) * LINES + tl.arange(0, LINES), n_lines - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptr + offs.to(tl.int64) * 128],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_bulk(ptr, n_chunks, CHUNK: tl.constexpr, THREADS: tl.constexpr):
    """One cp.async.bulk.prefetch.L2 of CHUNK bytes per thread (sm_90's bulk prefetch)."""
    offs = tl.minimum(tl.program_id(0) * THREADS + tl.arange(0, THREADS), n_chunks - 1)
    size = tl.full([THREADS], CHUNK, tl.int32)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [ptr + offs.to(tl.int64) * CHUNK, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetcher(mode: str):
    def run(w: torch.Tensor, nbytes: int | None = None):
        b = w.view(-1).view(torch.uint8)
        n = b.numel() if nbytes is None else min(nbytes, b.numel())
        if mode == "lines":
            L = 1024
            lines = n // 128
            prefetch_lines[(triton.cdiv(lines, L),)](b, lines, LINES=L, num_warps=4)
        else:
            chunk = int(mode.split(":")[1])
            chunks = n // chunk
            prefetch_bulk[(triton.cdiv(chunks, 128),)](b, chunks, CHUNK=chunk, THREADS=128, num_warps=4)
    return run


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    torch.manual_seed(0)
    big = torch.empty(2 * 256 * 2**20, dtype=torch.uint8, device=dev)
    flush_src, flush_dst = big[: 256 * 2**20], big[256 * 2**20:]
    spin = int(sys.argv[2]) if len(sys.argv) > 2 else 20000  # ~10 us at ~1.98 GHz
    res = {"device": torch.cuda.get_device_name(), "spin_cycles": spin, "rows": {}}
    weights = {"o 4096x4096": (4096, 4096), "qkv 6144x4096": (6144, 4096), "down 4096x14336": (4096, 14336)}
    for name, (N, K) in weights.items():
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        for M in (1, 6):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            cfg = smallm.config(N, K, exact=True)

            def prod():
                smallm.kernels().run(x, w, cfg)

            def flush():
                flush_dst.copy_(flush_src)

            def sleep():
                torch.cuda._sleep(spin)

            base = {"flush": graph_ms(flush), "flush+spin": graph_ms(lambda: (flush(), sleep())),
                    "flush+prod": graph_ms(lambda: (flush(), prod())),
                    "flush+spin+prod": graph_ms(lambda: (flush(), sleep(), prod())),
                    "flush+prod+prod": graph_ms(lambda: (flush(), prod(), prod()))}
            row = {k: round(v * 1e3, 2) for k, v in base.items()}
            row["prod_cold_us"] = round((base["flush+spin+prod"] - base["flush+spin"]) * 1e3, 2)
            row["prod_l2_us"] = round((base["flush+prod+prod"] - base["flush+prod"]) * 1e3, 2)
            nb = w.numel() * 2
            for mode in ("lines", "bulk:4096", "bulk:65536"):
                pf = prefetcher(mode)
                try:
                    a = graph_ms(lambda: (flush(), pf(w), sleep()))
                    b = graph_ms(lambda: (flush(), pf(w), sleep(), prod()))
                    half = graph_ms(lambda: (flush(), pf(w, nb // 2), sleep(), prod()))
                    row[f"{mode}: flush+pf+spin"] = round(a * 1e3, 2)
                    row[f"{mode}: prod_after_pf_us"] = round((b - a) * 1e3, 2)
                    row[f"{mode}: prod_after_half_pf_us"] = round((half - a) * 1e3, 2)
                except Exception as e:  # an instruction this GPU or Triton does not take
                    row[f"{mode}: error"] = f"{type(e).__name__}: {str(e)[:300]}"
            res["rows"][f"{name} M={M}"] = row
            print(name, M, json.dumps(row), flush=True)
            (out / "l2_prefetch.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
