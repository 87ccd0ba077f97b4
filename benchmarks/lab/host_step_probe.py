"""The host's own work per engine step that a server with a draft does and one without does not: the policy's choice
and its observation of the step (decoding.adaptive.SpecPolicy), and the /metrics update of the spec counters
(serve.metrics.ServerMetrics.observe_spec), each timed alone in a loop (microseconds per step, median of 5 runs).

On a GPU with a small target a plain step takes ~0.4-0.5 ms of host time, so a few tens of microseconds of Python
here are a few percent of an untrained draft's served tokens/s against no draft's.

    python benchmarks/lab/host_step_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _per_step_us(fn, n: int = 20000, runs: int = 5) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(out), 3)


def policy_step_us() -> float:
    """A policy that has switched an untrained draft off (plain steps, the probes' figures in place): choose, record
    the choice, observe the plain step."""
    from eaglekit.decoding.adaptive import SpecPolicy

    p = SpecPolicy(3, (1, 2, 3))
    p.seed_costs(1, 0.0005, {1: 0.0008, 2: 0.0009, 3: 0.0011})
    for _ in range(50):
        p.observe_cycle(1, 0.0011, [0])

    def step():
        j, _ = p.choose(1, 1.0)
        p.switched(j)
        if j == 0:
            p.observe_plain(1, 0.0005)
        else:
            p.observe_cycle(1, 0.0011, [0], j)
    return _per_step_us(step)


def metrics_step_us(speculative: bool) -> float:
    """The scheduler's per-step metrics after a plain step: with a draft observe_spec on the engine's stats (one
    counter moved), without one what every server updates."""
    from eaglekit.serve.metrics import ServerMetrics

    m = ServerMetrics("probe", speculative, 5 if speculative else 0)
    st = {"num_drafts": 10, "num_draft_tokens": 50, "num_accepted_tokens": 3, "accepted_per_pos": [2, 1, 0, 0, 0],
          "switches_to_spec": 1, "switches_to_plain": 1, "plain_steps": 0, "spec_cycles": 10,
          "cycles_by_length": {1: 0, 3: 10}}

    def step():
        st["plain_steps"] += 1
        m.generation_tokens.inc(1)
        m.running.set(1)
        m.waiting.set(0)
        m.observe_spec(st)
    return _per_step_us(step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = {"policy_choose_and_observe_us": policy_step_us(),
           "metrics_with_draft_us": metrics_step_us(True),
           "metrics_without_draft_us": metrics_step_us(False)}
    print(json.dumps(res))
    if a.out:
        from benchmarks.schema import cpu_name, git_sha

        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "host_step_probe.json").write_text(json.dumps(
            {"schema": "eaglekit-lab/1", "probe": "benchmarks/lab/host_step_probe.py",
             "command": "python benchmarks/lab/host_step_probe.py --out DIR", "commit": git_sha(),
             "machine": f"{cpu_name()}, Python {platform.python_version()}", "result": res}, indent=1))


if __name__ == "__main__":
    main()
