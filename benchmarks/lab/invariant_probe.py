"""Products "invariant" compiled vs uncompiled, step by step (issue "Fast v2" item 4): where do they part?

The demo target in bf16 on the GPU, loaded twice with products "invariant" (batch-invariant products and attention):
compiled and uncompiled. One prompt is decoded greedily by the uncompiled target; at every step both targets step
the same token as 1 row and as row 0 of a k-row chain. Per step it records the span, whether each pair of logits is
bit-identical, and their largest difference (garbage shows as a large one, rounding as a small one), and at the end
dynamo's recompile counters.

    python benchmarks/lab/invariant_probe.py OUT.json [--steps 300 --rows 4]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglekit.demo import ASSETS
from eaglekit.options import PairRuntime
from eaglekit.pair import load_pair
from eaglekit.tokenizer import encode, load_tokenizer, read_prompts


def step(t, tok, rows):
    L = int(t.committed)
    logits = t.step(tok, rows).float()
    t.committed.fill_(L + 1)
    return logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--span", type=int, default=None, help="cache span (default: prompt + steps)")
    args = ap.parse_args()
    plain, _ = load_pair(ASSETS / "target", None, device="cuda", dtype="bfloat16",
                         run=PairRuntime(compile="off", products="invariant"))
    comp, _ = load_pair(ASSETS / "target", None, device="cuda", dtype="bfloat16",
                        run=PairRuntime(compile="on", products="invariant"))
    tok = load_tokenizer(ASSETS / "target")
    ids = torch.tensor(encode(tok, read_prompts(ASSETS / "prompts.jsonl")[0]), device="cuda")
    span = args.span or len(ids) + args.steps + 8
    for t in (plain, comp):
        t.reset(span)
    lp, _ = plain.prefill(ids)
    lc, _ = comp.prefill(ids)
    rows = []
    nxt = lp[-1].argmax().view(1)
    with torch.inference_mode():
        for i in range(args.steps):
            p1 = step(plain, nxt, 1)
            c1 = step(comp, nxt, 1)
            for t in (plain, comp):
                t.committed.sub_(1)
            pk = step(plain, nxt, args.rows)
            ck = step(comp, nxt, args.rows)
            rows.append({"i": i, "slot": int(plain.committed) - 1,
                         "plain_1_vs_k": torch.equal(p1, pk), "comp_1_vs_k": torch.equal(c1, ck),
                         "comp_vs_plain_1": torch.equal(c1, p1), "max_diff_comp_plain": float((c1 - p1).abs().max()),
                         "max_diff_comp_1_k": float((c1 - ck).abs().max()),
                         "argmax_same": int(c1.argmax()) == int(p1.argmax())})
            nxt = p1.argmax().view(1)
    from torch._dynamo.utils import counters

    bad = [r for r in rows if not (r["plain_1_vs_k"] and r["comp_1_vs_k"])]
    summary = {"prompt_tokens": len(ids), "span": span, "steps": args.steps,
               "plain_1_vs_k_identical": sum(r["plain_1_vs_k"] for r in rows),
               "comp_1_vs_k_identical": sum(r["comp_1_vs_k"] for r in rows),
               "comp_vs_plain_identical": sum(r["comp_vs_plain_1"] for r in rows),
               "argmax_same": sum(r["argmax_same"] for r in rows),
               "max_diff_comp_plain": max(r["max_diff_comp_plain"] for r in rows),
               "first_bad": bad[:5], "counters": {k: dict(v) for k, v in counters.items() if k in ("stats", "frames")}}
    print(json.dumps({k: v for k, v in summary.items() if k != "first_bad"}, indent=1, default=str))
    print(json.dumps(bad[:5], indent=1))
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
