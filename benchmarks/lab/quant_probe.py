"""The 8B draft's products in bf16 and in int8 (eaglekit.kernels.int8), side by side on one GPU.

For each of the draft's weights (fused q/k/v, o, [gate; up] with its SwiGLU, down, lm_head, fc): ms and TB/s (of the
weight's own bytes) for cuBLAS in bf16 (F.linear) and inductor's compiled GEMV in bf16 at one row (what the draft runs
today), the int8 weight through inductor's GEMV at one row and through invariant_gemm's kernel at 1 / 4 / 6 rows (its
rule's config). With --sweep, invariant_gemm's int8 configs at `--sweep-rows` rows per weight within a time budget; the
fastest go into this GPU's invariant_gemm table as "int8:NxK" entries (what invariant_gemm.config reads), unless
--no-write. Every timing is a CUDA graph of calls over weight copies that exceed the L2 (invariant_gemm.graph_ms).

    python benchmarks/lab/quant_probe.py OUT [--sweep] [--budget-s 120]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eaglekit.kernels import int8, invariant_gemm  # noqa: E402
from eaglekit.kernels.compiling import compile_decode  # noqa: E402

# the 8B draft (hidden 4096, 32 heads / 8 KV heads of 128, intermediate 14336, draft vocab 32000, three captures)
SHAPES = {"qkv": (6144, 8192, False), "o": (4096, 4096, False), "gate_up": (28672, 4096, True),
          "down": (4096, 14336, False), "lm_head": (32000, 4096, False), "fc": (4096, 12288, False)}
# likelier first (a GEMV of int8 wants many programs and many bytes in flight each): K split, 512 columns of K a tile
SWEEP = [(bn, bk, sp, wp, st) for bk, sp, bn, st, wp in itertools.product((512, 256, 1024), (4, 2, 8, 1),
                                                                          (32, 64, 128, 16), (4, 3), (4, 8))
         if st * (16 * 2 + bn) * bk <= 200 * 1024]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-rows", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=120, help="the sweep's time over all weights")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--no-inductor", action="store_true", help="leave out inductor's one-row GEMVs")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": {}}
    run = invariant_gemm.kernels().run
    g = torch.Generator(device="cuda").manual_seed(0)
    t0 = time.time()
    data = {}
    for name, (N, K, gated) in SHAPES.items():
        copies = max(2, -(-600_000_000 // (N * K)))  # int8 copies past ~12x the L2 (bf16 ones twice that)
        w = [torch.randn(N, K, device="cuda", generator=g).bfloat16() * 0.02 for _ in range(copies)]
        q = [int8.quantize(x) for x in w]
        x = torch.randn(6, K, device="cuda", generator=g).bfloat16()
        row = {"N": N, "K": K, "gated": gated, "bf16_gb": N * K * 2 / 1e9, "int8_gb": N * K / 1e9}

        def epi(y, gated=gated):
            return invariant_gemm.epilogue(y, None, gated)

        for M in (1, 4, 6):
            row[f"cublas_bf16_{M}"] = invariant_gemm.graph_ms(lambda i: epi(F.linear(x[:M], w[i])), copies)
        if not args.no_inductor:  # (each a compile with coordinate-descent tuning: ~10-20 s)
            gemv = compile_decode(lambda v, wi: epi(F.linear(v, wi)))
            row["inductor_bf16_1"] = invariant_gemm.graph_ms(lambda i: gemv(x[:1], w[i]), copies)
            gemv8 = compile_decode(lambda v, qi, si: epi(invariant_gemm.linear(v, qi, enabled=False, scale=si)))
            row["inductor_int8_1"] = invariant_gemm.graph_ms(lambda i: gemv8(x[:1], *q[i]), copies)
        cfg = invariant_gemm.int8_rule(N, K)
        row["rule"] = list(cfg)
        for M in (1, 4, 6):
            row[f"kernel_int8_{M}"] = invariant_gemm.graph_ms(
                lambda i: run(x[:M], q[i][0], invariant_gemm.gated_config(cfg) if gated else cfg, gated=gated,
                              scale=q[i][1]), copies)
        res["weights"][name] = row
        data[name] = (q, x, copies)
        del w
        print(name, json.dumps(row), flush=True)
    (out / "quant_probe.json").write_text(json.dumps(res, indent=1))
    found = {}
    if args.sweep:  # config by config over every weight (a config compiles once: N and K are not constexprs)
        M, times = args.sweep_rows, {name: {} for name in SHAPES}
        for c in SWEEP:
            if time.time() > t0 + args.budget_s:
                break
            for name, (N, K, gated) in SHAPES.items():
                q, x, copies = data[name]
                if K % (c[1] * c[2]) or K // c[2] < c[1] or (gated and c[0] < 32):
                    continue
                try:
                    times[name][c] = invariant_gemm.graph_ms(
                        lambda i: run(x[:M], q[i][0], invariant_gemm.gated_config(c) if gated else c, gated=gated,
                                      scale=q[i][1]), copies)
                except Exception as e:  # (a config the GPU cannot hold: too much shared memory)
                    res.setdefault("sweep_errors", []).append(f"{name} {c}: {type(e).__name__}")
        for name, (N, K, gated) in SHAPES.items():
            if times[name]:
                best = min(times[name], key=times[name].get)
                found[f"int8:{N}x{K}"] = list(best)
                gb8 = N * K / 1e9
                res["weights"][name]["sweep"] = {
                    "rows": M, "tried": len(times[name]), "best": list(best), "best_ms": round(times[name][best], 4),
                    "best_tb_s": round(gb8 / times[name][best], 2),
                    "top5": [[list(c), round(gb8 / t, 2)] for c, t in sorted(times[name].items(),
                                                                            key=lambda kv: kv[1])[:5]]}
    for row in res["weights"].values():
        for k in [k for k in row if k.startswith(("cublas_", "inductor_", "kernel_"))]:
            row[k] = round(row[k], 4)
            row[f"{k}_tb_s"] = round((row["bf16_gb"] if "bf16" in k else row["int8_gb"]) / row[k], 2)
    if found and not args.no_write:
        res["written"] = {"table": str(invariant_gemm.save_entries(found)), "entries": found}
    res["seconds"] = round(time.time() - t0, 1)
    (out / "quant_probe.json").write_text(json.dumps(res, indent=1))
    for name, r in res["weights"].items():
        tb = {k[:-5]: v for k, v in r.items() if k.endswith("_tb_s")}
        print(f"{name:8s} TB/s " + ", ".join(f"{k} {v}" for k, v in tb.items()) + f"; sweep {r.get('sweep')}")

if __name__ == "__main__":
    main()
