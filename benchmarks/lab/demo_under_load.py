"""`eaglekit demo` on a loaded CPU machine: its chain pick's time and the speedup, against a run without the load.

    python benchmarks/lab/demo_under_load.py --out benchmarks/results/DATE_cpu_demo_under_load.json

Runs the demo (`python -m eaglekit demo --json --repick`, the full 32 prompts x 128 tokens unless --demo-args says
otherwise) once without added load (the reference: "quiet" only relative on a shared machine, hence the load
average recorded with each run), then --loaded times with --burners processes burning a core each
(`python -c "while True: pass"`), started a few seconds before the demo and killed after it. --repick makes each
run pick anew (the pick's time is the figure), under a cache folder of its own (XDG_CACHE_HOME): the user's cache
is never touched; one more loaded run without --repick shows the cached pick reused (--cached-run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eaglekit.io import atomic_write_json

ROOT = Path(__file__).resolve().parents[2]


def burn(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def demo(extra: list[str], env: dict, repick: bool) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "eaglekit", "demo", "--json", *extra] + (["--repick"] if repick else [])
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 1):  # (1: output not identical, recorded as such)
        sys.exit(f"demo failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout), wall


def row(name: str, burners: int, res: dict, wall: float, load_before: float) -> dict:
    p, chk, la = res["tree"]["picked"] or {}, res.get("pick_check") or {}, res.get("load_average") or {}
    return {"run": name, "burners": burners, "load": {"before": load_before, "start": la.get("start"),
                                                      "end": la.get("end"), "cores": la.get("cores")},
            "pick_s": p.get("seconds") if not p.get("cached") else 0.0, "cached": p.get("cached"),
            "chain": res["tree"]["steps"], "threads": res["threads"],
            "threads_pick_ms": (res.get("threads_pick") or {}).get("step_ms"),
            "predicted_speedup": p.get("speedup"), "predicted_tok_s": p.get("tokens_per_s"),
            "achieved_tok_s": res["eagle_tokens_per_s"], "baseline_tok_s": res["baseline_tokens_per_s"],
            "speedup": res["speedup"], "far_below": chk.get("far_below"), "identical": res["identical"],
            "accept_length": res["accept_length"], "wall_s": round(wall, 1), "why": p.get("why")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--loaded", type=int, default=3)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--cached-run", action="store_true", help="one more loaded run, reusing the cached pick")
    ap.add_argument("--demo-args", default="", help="more demo flags, e.g. '--prompts 8'")
    a = ap.parse_args()
    extra = a.demo_args.split()
    env = {**os.environ, "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="ek_demo_load_")}
    plan = [("quiet", 0, True)] + [(f"loaded {i + 1}", a.burners, True) for i in range(a.loaded)]
    if a.cached_run:
        plan.append(("loaded, cached pick", a.burners, False))
    rows = []
    for name, n, repick in plan:
        procs = burn(n)
        try:
            time.sleep(5 if n else 0)
            before = round(os.getloadavg()[0], 2)
            res, wall = demo(extra, env, repick)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        rows.append(row(name, n, res, wall, before))
        print(json.dumps(rows[-1]), flush=True)
        atomic_write_json(a.out, summary(rows, a, extra))  # after each run: a partial file shows the runs so far


def summary(rows: list[dict], a, extra: list[str]) -> dict:
    import platform

    import torch

    quiet = next((r["speedup"] for r in rows if r["run"] == "quiet"), None)
    for r in rows:
        r["speedup_vs_quiet"] = round(r["speedup"] / quiet, 3) if quiet else None
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores, torch {torch.__version__}",
            "command": f"python benchmarks/lab/demo_under_load.py --out {a.out} --loaded {a.loaded} "
                       f"--burners {a.burners}" + (" --cached-run" if a.cached_run else "")
                       + (f" --demo-args '{' '.join(extra)}'" if extra else ""),
            "goal": "pick <= 30 s; loaded speedup within 10% of the quiet run's, never below 1.3x", "runs": rows}


if __name__ == "__main__":
    main()
