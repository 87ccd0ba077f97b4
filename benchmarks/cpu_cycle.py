"""CPU cost of the EAGLE-3 cycle against the target's own decode step, on a random Llama-shaped target.

Random weights accept almost nothing, so this measures costs, not acceptance: the baseline step, one
verify of the tree, the draft's work per cycle, and the tokens/s the cycle would give at a few accept
lengths (cycle_time / accept_length vs step_time). Medians of repeated cycles.

    python benchmarks/cpu_cycle.py --hidden 768 --layers 12 --vocab 32000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from helpers import make_hf_model

    from eaglekit.decoding.tree import TreeShape
    from eaglekit.draft import new_draft
    from eaglekit.models import load_target

    H = args.hidden
    with tempfile.TemporaryDirectory() as d:
        make_hf_model(Path(d), "llama", vocab=args.vocab, hidden=H, layers=args.layers, heads=H // 64,
                      kv_heads=max(1, H // 256), inter=int(H * 8 / 3) // 64 * 64, std=1.0)
        t = load_target(d, backend="ours")
    n_params = sum(p.numel() for p in t.net.parameters())
    draft = new_draft(t, seed=0)
    from eaglekit.capture import CaptureSpec

    spec = CaptureSpec.default(args.layers)
    ctx = torch.randint(3, args.vocab, (args.context,))

    def timed(fn):
        out = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out[3:])

    from eaglekit.decoding.engine import Cycle

    span = args.context + 128
    t.reset(span)
    draft.reset(span + 64)
    _, feats = t.prefill(ctx, spec)
    h, dl = draft.extend(feats, torch.cat([ctx[1:], ctx[:1]]))
    L = t.length

    def step():
        t.committed.fill_(L)
        t.step(ctx[:1])

    rows = {"baseline_step_ms": timed(step) * 1e3}
    for steps, topk, dt in [(3, 1, 4), (5, 4, 8), (6, 8, 48)]:
        c = Cycle(t, draft, TreeShape(steps, topk, dt), spec)
        c.start(ctx[0], h, dl)

        def cycle():
            t.committed.fill_(L)
            draft.committed.fill_(L)
            for phase in ("draft_tree", "verify", "accept", "cache_update", "draft_extend"):
                c.run(phase)
            c.start(ctx[0], h, dl)

        def verify_only():
            t.committed.fill_(L)
            t.verify(c.tree.tokens, c.tree.depths, c.tree.mask, spec)

        cyc = timed(cycle) * 1e3
        v = timed(verify_only) * 1e3
        rows[f"({steps},{topk},{dt})"] = {"cycle_ms": cyc, "verify_ms": v, "draft_ms": cyc - v,
                                          "cycle_over_step": cyc / rows["baseline_step_ms"]}
    base = rows["baseline_step_ms"]
    print(f"target: {n_params / 1e6:.0f}M params (hidden {H}, {args.layers} layers, vocab {args.vocab}), "
          f"context {args.context}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"baseline decode step: {base:.1f} ms  ({1e3 / base:.1f} tok/s)")
    print(f"{'shape':>12} {'cycle ms':>9} {'verify ms':>10} {'draft ms':>9} {'cycle/step':>11}   "
          f"tok/s at accept length 2 / 3 / 4")
    for k, r in rows.items():
        if k == "baseline_step_ms":
            continue
        tps = " / ".join(f"{a * 1e3 / r['cycle_ms']:.1f}" for a in (2, 3, 4))
        print(f"{k:>12} {r['cycle_ms']:9.1f} {r['verify_ms']:10.1f} {r['draft_ms']:9.1f} "
              f"{r['cycle_over_step']:11.2f}   {tps}")
    if args.json:
        Path(args.json).write_text(json.dumps({"params": n_params, **rows}, indent=2))


if __name__ == "__main__":
    main()
