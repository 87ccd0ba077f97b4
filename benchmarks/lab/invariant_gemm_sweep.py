"""Products of 1..8 rows by the Llama-3.1-8B weights (and its EAGLE-3 draft's): cuBLAS (F.linear) against
eaglekit.kernels.invariant_gemm's kernel over a grid of tile configs, each timed inside a CUDA graph (a graph of R calls
over R different weights, so the timing is launch-free and the weights come from HBM, not L2).

    python benchmarks/lab/invariant_gemm_sweep.py --out DIR        # one H200: ~2 minutes

Writes DIR/smallm_sweep.json: per (N, K, rows) the cuBLAS time, the best config and its time, the default
config's (invariant_gemm.config: tuned if the table has it) time, and bytes/s for each; prints a table. With --tune it
first runs invariant_gemm.tune (every config of invariant_gemm.GRID at 6 rows, cuBLAS too) and stores the winners for
this GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eaglekit.kernels import invariant_gemm

SHAPES = {  # name: (N, K)
    "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
    "lm_head": (128256, 4096), "draft_qkv": (6144, 8192), "draft_lm_head": (32000, 4096), "draft_fc": (4096, 12288),
}
ROWS = (1, 6, 8)
GRID = (list(itertools.product((32, 64, 128), (128, 256), (1, 2, 4, 8), (4,), (4,)))
        + [(16, 256, s, 4, 4) for s in (1, 2, 4)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tune", action="store_true", help="instead: invariant_gemm.tune() over its GRID at 6 rows, "
                    "written to this GPU's table (invariant_gemm.table_path()), then the sweep with the tuned configs "
                    "as 'default'")
    ap.add_argument("--epilogues", action="store_true", help="instead: the fused epilogues of the invariant "
                    "policy (gate_up gated over a grid of configs, down with its residual add) against the plain "
                    "product followed by the same epilogue in torch")
    args = ap.parse_args()
    names = args.shapes.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.epilogues:
        return epilogues(out)
    if args.tune:
        t0 = time.time()
        tuned = invariant_gemm.tune([SHAPES[n] for n in names])
        tuned["wall_s"] = round(time.time() - t0, 1)
        (out / "smallm_tune.json").write_text(json.dumps(tuned, indent=1))
    graph_ms = invariant_gemm.graph_ms
    run = invariant_gemm.kernels().run
    results = []
    for name in names:
        N, K = SHAPES[name]
        nbytes = N * K * 2
        ws = weights(N, K)
        copies = len(ws)
        default = invariant_gemm.config(N, K) or GRID[0]  # (None: tuned to cuBLAS)
        for M in ROWS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), ws[0].float())
            cublas = graph_ms(lambda i: F.linear(x, ws[i]), copies)
            cfgs = [c for c in ([] if args.tune else GRID) + [default] if K % (c[1] * c[2]) == 0]
            timed = time_configs(f"{name} rows={M}", cfgs, lambda i, c: run(x, ws[i], c), ref, copies)
            best = min(timed, key=timed.get)
            row = {"name": name, "N": N, "K": K, "rows": M, "cublas_ms": round(cublas, 5),
                   "best_cfg": list(best), "best_ms": round(timed[best], 5), "default_cfg": list(default),
                   "default_ms": round(timed[default], 5),
                   "cublas_tb_s": round(nbytes / cublas / 1e9, 3), "best_tb_s": round(nbytes / timed[best] / 1e9, 3),
                   "default_tb_s": round(nbytes / timed[default] / 1e9, 3),
                   "top5": top5(timed)}
            results.append(row)
            print(f"{name:14s} N={N:6d} K={K:5d} rows={M}: cuBLAS {row['cublas_tb_s']:.2f} TB/s, "
                  f"best {row['best_tb_s']:.2f} {best}, default {row['default_tb_s']:.2f} {default}", flush=True)
        del ws
    save(out / "smallm_sweep.json", results)


def weights(N: int, K: int) -> list[torch.Tensor]:
    """Copies of a random [N, K] bf16 weight, together over 600 MB (> 10x the L2): timed in turn, each streams from
    HBM as in a model."""
    copies = max(2, -(-600_000_000 // (N * K * 2)))
    return [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]


def time_configs(label: str, cfgs, call, ref: torch.Tensor, copies: int) -> dict:
    """{config: median ms} for each config, `call(i, cfg)` running it on weight i, after checking its output on
    weight 0 against `ref` (exits on a wrong one)."""
    timed = {}
    for cfg in cfgs:
        if cfg in timed:
            continue
        err = (call(0, cfg).float() - ref).abs().max().item() / ref.abs().max().item()
        if err > 2e-2:
            raise SystemExit(f"{label} cfg={cfg}: relative error {err:.3g}")
        timed[cfg] = invariant_gemm.graph_ms(lambda i, c=cfg: call(i, c), copies)
    return timed


def top5(timed: dict) -> list:
    return [[list(c), round(t, 5)] for c, t in sorted(timed.items(), key=lambda kv: kv[1])[:5]]


def save(path: Path, rows: list) -> None:
    path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


GATED_GRID = [c for c in itertools.product((32, 64, 128), (64, 128, 256), (1,), (4, 8), (3, 4, 5))
              if c[4] * (16 + 2 * c[0]) * c[1] * 2 <= 200 * 1024]  # a program's stages fit the shared memory


def epilogues(out: Path) -> None:
    """gate_up + SwiGLU and down + residual: one kernel (invariant_gemm's epilogue) against the product and torch after
    it, each inside a CUDA graph over weights that stream from HBM (8B shapes, rows 1 and 6)."""
    graph_ms, run = invariant_gemm.graph_ms, invariant_gemm.kernels().run
    rows = []
    for name, gated in (("gate_up", True), ("down", False)):
        N, K = SHAPES[name]
        ws = weights(N, K)
        copies = len(ws)
        plain = invariant_gemm.config(N, K, exact=True)
        width = N // 2 if gated else N
        for M in (1, 6):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            r = torch.randn(M, width, device="cuda", dtype=torch.bfloat16)
            ref = invariant_gemm.epilogue(F.linear(x.float(), ws[0].float()), None if gated else r.float(), gated)
            apart = graph_ms(lambda i: invariant_gemm.epilogue(run(x, ws[i], plain), None if gated else r, gated),
                             copies)
            cfgs = [c for c in GATED_GRID if K % c[1] == 0] if gated else []
            default = invariant_gemm.gated_config(plain) if gated else plain
            timed = time_configs(f"{name} rows={M}", [default] + cfgs,
                                 lambda i, c: run(x, ws[i], c, residual=None if gated else r, gated=gated), ref, copies)
            best = min(timed, key=timed.get)
            row = {"name": name, "rows": M, "apart_ms": round(apart, 5), "default_cfg": list(default),
                   "fused_ms": round(timed[default], 5), "best_cfg": list(best), "best_ms": round(timed[best], 5),
                   "top5": top5(timed)}
            rows.append(row)
            print(f"{name} rows={M}: product + torch {apart * 1e3:.1f} us, fused {timed[default] * 1e3:.1f} us "
                  f"{default}, best {timed[best] * 1e3:.1f} us {best}", flush=True)
        del ws
    save(out / "smallm_epilogues.json", rows)


if __name__ == "__main__":
    main()
