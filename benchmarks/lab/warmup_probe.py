"""What `eaglekit demo` waits before its timings, and what it then measures, per way of compiling: each variant in
processes of its own, first with an empty inductor cache (a first run on a fresh machine), then again on the cache that
run left (a second run).

Variants:
- `default`: `eaglekit demo` as shipped (decode layers compiled with eaglekit.kernels.compiling.DECODE_OPTIONS);
- `no_cd`: the same with DECODE_OPTIONS emptied (inductor's defaults: no coordinate-descent tuning, which benchmarks
  config variants of every Triton kernel while it compiles; chosen for the 8B shape's step, where it bought 4.79 ->
  4.36-4.49 ms, benchmarks/results/2026-12-01_h200_fast_v2.json);
- `prompt_graphs`: `--prompt-graphs` (prompts through one compiled graph for every length);
- `no_cd_prompt_graphs`: both.

    python benchmarks/lab/warmup_probe.py --out DIR [--variants default,no_cd,prompt_graphs] [--prompts 16]
                                          [--dtype bfloat16] [-- extra demo flags]

Per variant and run: the demo's warm_up_s, speedup, identical, tokens/s both ways, and the process's wall time (load,
warm-up and timings). Writes DIR/warmup_probe.json.
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

ROOT = Path(__file__).resolve().parents[2]

# run the CLI in a child process, optionally with DECODE_OPTIONS emptied first
_CHILD = """
import runpy, sys
if sys.argv[1] == "no_cd":
    import eaglekit.kernels.compiling as c
    c.DECODE_OPTIONS.clear()
sys.argv = ["eaglekit"] + sys.argv[2:]
runpy.run_module("eaglekit", run_name="__main__")
"""

KEEP = ("warm_up_s", "speedup", "identical", "prompts", "accept_length", "eagle_tokens_per_s", "baseline_tokens_per_s",
        "compiled", "prompt_graphs", "products", "draft_precision")


def run_demo(variant: str, cache: str, prompts: int, dtype: str, extra: list[str]) -> dict:
    args = ["demo", "--json", "--prompts", str(prompts), "--dtype", dtype] + extra
    if "prompt_graphs" in variant:
        args.append("--prompt-graphs")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TQDM_DISABLE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _CHILD, "no_cd" if variant.startswith("no_cd") else "-", *args],
                       capture_output=True, text=True, env=env, timeout=900)
    wall = round(time.perf_counter() - t0, 1)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"process_s": wall, "rc": r.returncode, "error": r.stderr[-3000:]}
    res = json.loads(lines[-1])
    return {"process_s": wall, **{k: res.get(k) for k in KEEP}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="./out")
    ap.add_argument("--variants", default="default,no_cd,prompt_graphs")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("extra", nargs="*", help="more demo flags (after --)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"what": "eaglekit demo's warm-up and figures per way of compiling, first on an empty inductor cache, then "
                   "on the cache that run left", "command": " ".join(sys.argv), "dtype": a.dtype, "variants": {}}
    for v in a.variants.split(","):
        with tempfile.TemporaryDirectory(prefix=f"eaglekit-warmup-{v}-") as cache:
            runs = [run_demo(v, cache, a.prompts, a.dtype, a.extra) for _ in ("first", "second")]
        res["variants"][v] = {"first_run": runs[0], "second_run": runs[1]}
        print(v, json.dumps(res["variants"][v]), flush=True)
        (out / "warmup_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
