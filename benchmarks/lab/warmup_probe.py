"""What `eaglekit demo` waits before its timings, and what it then measures, per way of compiling: each variant in
processes of its own, first with an empty inductor cache (a first run on a fresh machine), then again on the cache that
run left (a second run).

Variants:
- `default`: `eaglekit demo` as shipped (decode layers compiled with eaglekit.kernels.compiling.decode_options: the
  demo target's layers, hidden 256, untuned since D43);
- `no_cd`: the same with DECODE_OPTIONS emptied (inductor's defaults: no coordinate-descent tuning, which benchmarks
  config variants of every Triton kernel while it compiles; kept for layers of hidden 2048 and up, D21);
- `prompt_graphs`: `--prompt-graphs` (prompts through one compiled graph for every length);
- `no_cd_prompt_graphs`: both.

    python benchmarks/lab/warmup_probe.py --out DIR [--variants default,no_cd,prompt_graphs] [--prompts 16]
                                          [--dtype bfloat16] [-- extra demo flags]

Per variant and run: the demo's warm_up_s, speedup, identical, tokens/s both ways, the process's wall time (load,
warm-up and timings), and where its compile time went (`compile`: dynamo's compile_times summed over the process, in
seconds: compile_s in all, of it trace_s tracing and inductor_s in inductor, of that kernels_wait_s waiting for Triton
builds; the warm-up less compile_s is recording, the policy's timings and the kernels' first-launch tuning; and the
graph and cache counters; `recompiles`: dynamo's recompiles by function and by cause). Writes DIR/warmup_probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# run the CLI in a child process, optionally with DECODE_OPTIONS emptied first; at exit it writes where its compile
# time went ($WARMUP_PROBE_STATS: dynamo's compile_times, seconds summed over the process, and its counters)
_CHILD = """
import atexit, json, os, runpy, sys
if sys.argv[1] == "no_cd":
    import eaglekit.kernels.compiling as c
    c.DECODE_OPTIONS.clear()

def _stats():
    import torch._dynamo.utils as u
    names, secs = u.compile_times(repr="csv", aggregate=True)
    t = dict(zip(names, (float(x) for x in secs)))
    keep = {"compile_s": "_compile.compile_inner", "trace_s": "bytecode_tracing",
            "inductor_s": "OutputGraph.call_user_compiler", "kernels_wait_s": "async_compile.wait",
            "load_s": "PyCodeCache.load_by_key_path", "guards_s": "build_guards"}
    out = {k: round(t.get(v, 0.0), 2) for k, v in keep.items()}
    out["counters"] = {k: dict(u.counters[k]) for k in ("stats", "inductor", "aot_autograd") if k in u.counters}
    with open(os.environ["WARMUP_PROBE_STATS"], "w") as f:
        json.dump(out, f)

if os.environ.get("WARMUP_PROBE_STATS"):
    atexit.register(_stats)
sys.argv = ["eaglekit"] + sys.argv[2:]
runpy.run_module("eaglekit", run_name="__main__")
"""

KEEP = ("warm_up_s", "speedup", "identical", "prompts", "accept_length", "eagle_tokens_per_s", "baseline_tokens_per_s",
        "compiled", "prompt_graphs", "products", "draft_precision")


def run_demo(variant: str, cache: str, prompts: int, dtype: str, extra: list[str]) -> dict:
    args = ["demo", "--json", "--prompts", str(prompts), "--dtype", dtype] + extra
    if "prompt_graphs" in variant:
        args.append("--prompt-graphs")
    stats = Path(cache).with_name(Path(cache).name + "-stats.json")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TQDM_DISABLE="1", WARMUP_PROBE_STATS=str(stats),
               TORCH_LOGS="recompiles")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _CHILD, "no_cd" if variant.startswith("no_cd") else "-", *args],
                       capture_output=True, text=True, env=env, timeout=900)
    wall = round(time.perf_counter() - t0, 1)
    compile_stats = json.loads(stats.read_text()) if stats.exists() else None
    stats.unlink(missing_ok=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"process_s": wall, "rc": r.returncode, "error": r.stderr[-3000:]}
    res = json.loads(lines[-1])
    return {"process_s": wall, **{k: res.get(k) for k in KEEP}, "compile": compile_stats,
            "recompiles": recompiles(r.stderr)}


def recompiles(log: str) -> dict:
    """Dynamo's recompiles (TORCH_LOGS=recompiles) by function, and by cause: "new shape or value" where one of the
    guards that failed was a size or a value (a new token count or chain length: by design); otherwise what failed
    ("global state": torch's thread count changed since the compile; "dispatch keys": a tensor made inside inference
    mode where the first was made outside, or the other way round), a compile that a fixed setting saves."""
    by_fn: dict = {}
    by_cause: dict = {}
    lines = log.splitlines()
    for i, ln in enumerate(lines):
        m = re.search(r"Recompiling function (\S+) in (\S+)", ln)
        if not m:
            continue
        fn = f"{m.group(1)} ({Path(m.group(2)).name})"
        by_fn[fn] = by_fn.get(fn, 0) + 1
        failed = []
        for x in lines[i + 2:]:
            if "[__recompiles]" not in x or "Recompiling function" in x:
                break
            if re.search(r"\]\s+- \d+/\d+: ", x):
                failed.append(re.sub(r".*\]\s+- \d+/\d+: ", "", x))
        if any("size mismatch" in f or "==" in f for f in failed):
            cause = "new shape or value"
        else:
            cause = ", ".join(sorted({"global state" if "GLOBAL_STATE" in f else "dispatch keys" if "dispatch key" in f
                                      else f.split("#")[0].strip()[:60] for f in failed})) or "?"
        by_cause[cause] = by_cause.get(cause, 0) + 1
    return {"by_function": by_fn, "by_cause": by_cause}


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
