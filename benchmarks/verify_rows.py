"""Products "bulk" at the Llama-3.1-8B shape: what each verify row costs over the one-row step, and where.

The decoder's own recorded step with k rows (as Target.step(rows=k) runs them: a chain of k tokens), context 512 in a
1024 cache, random bf16 weights; for each build variant given (bulk.library(defines)) swapped into the same Kernels,
alternating in two rounds: the step's median over 100 replays at each k. Then, with plain launches (under PDL a
kernel's duration includes its time parked at griddepcontrol.wait), one replay under torch.profiler at a few k: the
kernels by kind, so the growth with k is attributed (products by epilogue and tile grouping, attention, the rest).

    python benchmarks/verify_rows.py OUT_DIR [--variant NAME=DEFINE,DEFINE ...] [--rows 1,2,4,6,8,9]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import h200_suite as suite  # noqa: E402
from bulk_step import kinds, rows_ms  # noqa: E402
from fast_probe import timeline  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=MACRO=V,MACRO=V: a build beside the default (e.g. single=EK_TG_LO_FROM=99)")
    ap.add_argument("--rows", default="1,2,4,6,8,9")
    ap.add_argument("--profile-rows", default="1,6,8")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from eaglekit.decoding.engine import Decoder
    from eaglekit.models import bulk

    suite.copy_bandwidth()
    suite.PRODUCTS = "bulk"
    t, _ = suite.llama8b()
    kern = t.net.products.layer_kernels
    variants = {"default": bulk.library()}
    for v in args.variant:
        name, defs = v.split("=", 1)
        variants[name] = bulk.library(tuple(defs.split(",")))
    counts = tuple(int(r) for r in args.rows.split(","))
    res = {"copy_bandwidth_TBps": round(suite.RESULTS["copy_bandwidth_bytes_per_s"] / 1e12, 3),
           "variants": {k: v for k, v in (x.split("=", 1) for x in args.variant)}, "rows_ms": {}, "profiles": {}}
    dec = Decoder(t)
    prompt = torch.randint(0, 128000, (512,), device="cuda")
    t.reset(1024)
    logits, _ = t.prefill(prompt)
    for rnd in range(2):
        for name, lib in variants.items():
            kern.lib = lib
            dec._steps.clear()
            ms = rows_ms(t, dec, logits, counts)
            res["rows_ms"].setdefault(name, []).append(ms)
            print(f"round {rnd} {name}: " + ", ".join(f"{k} rows {v:.3f}" for k, v in ms.items()), flush=True)
    (out / "verify_rows.json").write_text(json.dumps(res, indent=1))
    # the kernels' own durations: plain launches
    for name, lib in variants.items():
        kern.lib = lib
        lib.ek_bulk_set_pdl(0)
        for rows in (int(r) for r in args.profile_rows.split(",")):
            dec._steps.clear()
            g, _ = dec._graphed_step(logits[-1].argmax(), rows)
            t.committed.fill_(512)
            g.replay()
            t.committed.fill_(512)
            ev = timeline(g.replay)
            span = (ev[-1][0] + ev[-1][1] - ev[0][0]) / 1e3
            res["profiles"][f"{name}_rows{rows}"] = {"span_ms": round(span, 4), "kernels": len(ev),
                                                     "by_kind": kinds(ev)}
            print(f"{name}, {rows} rows, plain launches: span {span:.3f} ms, {len(ev)} kernels")
            for k, v in list(res["profiles"][f"{name}_rows{rows}"]["by_kind"].items())[:9]:
                print(f"   {v[0]:5d} {v[1]:8.4f} ms  {k}")
        lib.ek_bulk_set_pdl(1)
    kern.lib = variants["default"]
    (out / "verify_rows.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
