"""Where a served request's time goes: the shipped pair served with no draft, its draft and an untrained draft, one
server at a time, each with `--profile` (the engine's phases timed with CUDA events on a GPU), at one concurrency.

    python benchmarks/lab/serve_phases.py [--concurrency 1] [--prompts 32] [--out DIR]    # GPU or CPU

For each variant: output tok/s, TTFT and TPOT medians (eaglekit bench), the engine's steps (plain steps, cycles,
prefills), each phase's total and per-step time (/server_info's phase_profile) and the policy's summary, in
DIR/serve_phases.json. The phases' sum against the level's wall time says how much of a served token is the engine's
and how much the server's around it (HTTP, detokenizing, the scheduler's thread hand-offs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    import torch

    from benchmarks.cases.serve import DEMO_VARIANTS, demo_drafts, demo_serve_args
    from eaglekit.serve.bench import BenchOptions, run_bench
    from eaglekit.serve.local import LocalServer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--variants", default=",".join(DEMO_VARIANTS))
    ap.add_argument("--extra", default="", help="more `eaglekit serve` arguments, space-separated")
    ap.add_argument("--out", default=os.environ.get("OUT", "./out"))
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"schema": "eaglekit-lab/1", "what": "the shipped pair served per variant with --profile: throughput, "
           "latency and the engine's phases", "command": "python benchmarks/lab/serve_phases.py "
           + " ".join(argv if argv is not None else sys.argv[1:]), "device": device,
           "machine": torch.cuda.get_device_name() if device == "cuda" else "cpu", "variants": {}}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    dest = Path(a.out) / "serve_phases.json"
    with tempfile.TemporaryDirectory() as tmp:
        drafts = demo_drafts(Path(tmp))
        for v in a.variants.split(","):
            args = demo_serve_args(device, a.max_batch, drafts[v]) + ["--profile", *a.extra.split()]
            t0 = time.time()
            srv = LocalServer(args, log=Path(tmp) / f"{v}.log", startup_s=600)
            started = time.time() - t0
            try:
                run_bench(BenchOptions(endpoint=srv.url, num_prompts=4, max_tokens=8, ignore_eos=True))
                before = srv.get("/server_info")["internal_states"][0]
                lv = run_bench(BenchOptions(endpoint=srv.url, num_prompts=a.prompts, concurrency=(a.concurrency,),
                                            max_tokens=a.max_tokens, ignore_eos=True))[0]
                after = srv.get("/server_info")["internal_states"][0]
            finally:
                srv.stop()
            prof_a, prof_b = after["phase_profile"] or {}, before["phase_profile"] or {}
            ms = {p: round(v - (prof_b.get("ms") or {}).get(p, 0.0), 3) for p, v in (prof_a.get("ms") or {}).items()}
            steps = {k: prof_a.get(k, 0) - prof_b.get(k, 0) for k in ("cycles", "plain_steps", "prefills")}
            out["variants"][v] = {
                "startup_s": round(started, 1), "output_tok_s": lv["output_throughput"],
                "ttft_ms_median": lv["ttft_ms"]["median"], "tpot_ms_median": lv["tpot_ms"]["median"],
                "completed": lv["completed"], "failed": lv["failed"], "steps": steps, "phase_ms": ms,
                "phase_ms_sum": round(sum(ms.values()), 3), "level_wall_ms": lv["duration_s"] * 1e3,
                "phase_ms_per_step": {p: round(t / max(1, steps["cycles"] + steps["plain_steps"]), 4)
                                      for p, t in ms.items()},
                "spec_policy": after.get("spec_policy")}
            print(v, json.dumps({k: out["variants"][v][k] for k in ("output_tok_s", "tpot_ms_median",
                                                                      "ttft_ms_median", "steps", "phase_ms_per_step",
                                                                      "phase_ms_sum", "level_wall_ms")}), flush=True)
            dest.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
