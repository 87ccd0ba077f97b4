"""The adaptive policy (eaglekit.decoding.adaptive.SpecPolicy) against a simulated draft: each draft position accepted
at rate `p` given the one before (a draft that is right now and then by luck at small p), with fixed costs in plain
steps for a cycle of each length and for the draft's catch-up before a cycle that follows plain steps. Reports tokens
per unit of time over plain decoding's (1.0 = as fast as no draft) and the cycles run, median over seeds.

    python benchmarks/lab/policy_sim.py [--steps 20000] [--seeds 5] [--out DIR]

What it answers: how much an untrained or weak draft costs by the policy's own choices (its probes, the streaks of
cycles a lucky probe turns on), apart from any machine. Costs: `cpu` (the demo target on the 2-core VM: cycles
1.4-1.6 plain steps, a catch-up 0.6) and `gpu` (an H100: cycles 1.6-2.3, a catch-up 9;
benchmarks/results/2026-12-05h_h100_engine_gap.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

COSTS = {"cpu": ({0: 1.0, 1: 1.4, 2: 1.5, 3: 1.6}, 0.6), "gpu": ({0: 1.0, 1: 1.6, 2: 1.9, 3: 2.3}, 9.0)}


def simulate(p: float, costs: dict, catch: float, steps: int, seed: int) -> tuple[float, int]:
    """-> (tokens per unit time over plain decoding's, cycles run)."""
    from eaglekit.decoding.adaptive import SpecPolicy

    rng = random.Random(seed)
    pol = SpecPolicy(3, (1, 2, 3))
    pol.seed_costs(1, costs[0], {j: costs[j] for j in (1, 2, 3)})
    t = tokens = 0.0
    cycles, last = 0, 0
    for _ in range(steps):
        j, _ = pol.choose(1)
        pol.switched(j)
        if j == 0:
            pol.observe_plain(1, costs[0])
            t, tokens = t + costs[0], tokens + 1
        else:
            if last == 0:
                pol.observe_catch_up(1, catch)
                t += catch
            n = 0
            while n < j and rng.random() < p:
                n += 1
            pol.observe_cycle(1, costs[j], [n], j)
            t, tokens, cycles = t + costs[j], tokens + n + 1, cycles + 1
        last = j
    return tokens / t * costs[0], cycles


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rates", default="0,0.05,0.1,0.2,0.3,0.5,0.7")
    ap.add_argument("--out", default=os.environ.get("OUT", "./out"))
    a = ap.parse_args(argv)
    from benchmarks.schema import git_sha

    out = {"schema": "eaglekit-lab/1", "what": "the adaptive policy against a simulated draft: speed over plain "
           "decoding and cycles, median over seeds", "command": "python benchmarks/lab/policy_sim.py "
           + " ".join(argv if argv is not None else sys.argv[1:]), "commit": git_sha(), "steps": a.steps,
           "costs": {k: {"cycle_plain_steps": c, "catch_up_plain_steps": k_} for k, (c, k_) in COSTS.items()},
           "rows": []}
    for machine, (costs, catch) in COSTS.items():
        for p in (float(x) for x in a.rates.split(",")):
            runs = [simulate(p, costs, catch, a.steps, s) for s in range(a.seeds)]
            row = {"costs": machine, "accept_rate": p, "speed": round(statistics.median(r[0] for r in runs), 4),
                   "cycles": [r[1] for r in runs]}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "policy_sim.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
