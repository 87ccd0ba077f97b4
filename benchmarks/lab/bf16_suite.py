"""bf16 on a GPU: is greedy speculative output identical to the target's, and what does it cost?

In bf16 a GPU matmul can round one row differently from the same row inside a k-row product, so the 1-row
baseline step and the speculative verify (a tree of k rows) drift apart at near-ties. `Decoder.baseline_rows`
runs the baseline step as row 0 of a k-row chain (Target.step(token, rows)): the verify's shapes, hence its
kernels. This script measures both sides of that trade on one GPU:

    a. the demo pair in bf16, 32 prompts x 128 tokens, for several tree shapes: outputs identical to the
       k-row baseline and to the 1-row baseline (prompts out of 32), speedup over the 1-row baseline
    b. the Llama-3.1-8B shape (random bf16 weights, context 512), graphed baseline step at 1, 4, 6, 8 rows:
       what a k-row reference step costs against the 1-row step

    python benchmarks/lab/bf16_suite.py OUT.json        (GPU, ~2 minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import median_ms  # noqa: E402  (the suite's timer)

SHAPES = [(3, 1, 4), (5, 1, 6), (4, 2, 8), (6, 8, 48)]


def demo_identity(n_prompts: int, max_new: int, compile: str = "off",
                  products: str = "auto") -> list[dict]:
    from eaglekit.decoding.compare import compare
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    # uncompiled by default, as results/2026-12-01_h200_bf16.json was measured
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cuda", dtype="bfloat16",
                     run=PairRuntime(compile=compile, products=products))
    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, p) for p in read_prompts(ASSETS / "prompts.jsonl")[:n_prompts]]
    rows = []
    for s in SHAPES:
        dec = Decoder(t, d, TreeShape(*s))  # baseline_rows "auto": the tree's draft tokens in bf16 on a GPU
        cmp = compare(dec, prompts, max_new, warmup=16)
        c = cmp.summary()
        same = sum(cmp.same)  # against the decoder's baseline: the 1-row one where baseline_rows is 1
        one_row = same if c["baseline_rows"] == 1 else c.get("identical_one_row")
        row = {"shape": list(s), "baseline_rows": c["baseline_rows"], "identical_k_row": same,
               "identical_one_row": one_row, "accept_length": c["accept_length"],
               "speedup_over_one_row": c["speedup"], "tok_s_eagle": c["eagle_tokens_per_s"],
               "tok_s_one_row": c["baseline_tokens_per_s"], "tok_s_k_row": c.get("baseline_rows_tokens_per_s")}
        rows.append(row)
        k_row = (f"identical to the k-row baseline {same}/{len(prompts)}, " if c["baseline_rows"] > 1 else "")
        print(f"   {s}: k={row['baseline_rows']}: {k_row}identical to the 1-row baseline {one_row}/{len(prompts)}; "
              f"accept length {row['accept_length']}; {row['tok_s_eagle']} tok/s vs {row['tok_s_one_row']} (1 row), "
              f"{row['tok_s_k_row']} (k rows): x{row['speedup_over_one_row']}", flush=True)
    return rows


def step_cost(ctx: int, reps: int) -> list[dict]:
    from benchmarks.cases.batch import build_pair
    from benchmarks.timing import OneRow
    from eaglekit.decoding.tree import TreeShape

    t, _, raw = build_pair(False, "cuda")
    prompt = torch.randint(0, raw["vocab_size"] - 1, (ctx,), device="cuda")
    out = []
    base = None
    for rows in (1, 4, 6, 8):  # the one engine's plain step at one row, `rows` rows a step
        one = OneRow(t, None, TreeShape.make(), prompt, graphs=True, plain_rows=rows)
        ms = median_ms(one.step, reps, warm=5, cuda=True, before=one.restore)
        base = base or ms
        out.append({"rows": rows, "step_ms": round(ms, 4), "over_one_row": round(ms / base, 4)})
        print(f"   8B shape, {rows}-row step: {ms:.3f} ms ({ms / base:.3f} x the 1-row step)", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--compile", default="off", choices=("auto", "on", "off"))
    ap.add_argument("--products", default="auto", help="load_pair's products (invariant: batch-invariant kernels)")
    ap.add_argument("--no-steps", action="store_true", help="leave out the 8B-shape step timing")
    ap.add_argument("--shapes", default=None, help="tree shapes in order, e.g. '5,1,6;3,1,4' (default: SHAPES)")
    args = ap.parse_args()
    if args.shapes:
        SHAPES[:] = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "prompts": args.prompts,
           "max_new_tokens": args.max_new, "compile": args.compile,
           "products": args.products, "shapes": SHAPES}
    print("== a. demo pair, bf16", flush=True)
    res["demo_bf16"] = demo_identity(args.prompts, args.max_new, args.compile, args.products)
    if not args.no_steps:
        print("== b. 8B-shape step at k rows", flush=True)
        res["step_rows_8b"] = step_cost(512, args.reps)
    res["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out} ({res['wall_s']} s)")


if __name__ == "__main__":
    main()
