#!/usr/bin/env bash
# What bf16 exactness costs, side by side on one GPU (issue 12 item 4): the 8B-shape step and EAGLE-3 cycles with
# the default path and with --products invariant, each fast_probe in its own process (dynamo state does not carry
# over), in the order default, invariant; then the ratios. ~5 minutes on an H200; results in $OUT.
#   OUT=/tmp/out bash benchmarks/invariant_cost.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 benchmarks/fast_probe.py --variant default --out "$OUT" > "$OUT/probe_default.log" 2>&1
python3 benchmarks/fast_probe.py --variant invariant --products invariant --out "$OUT" > "$OUT/probe_invariant.log" 2>&1
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {v: json.loads((out / f"probe_{v}.json").read_text()) for v in ("default", "invariant")}
res = {v: {"step_ms": r["baseline_8b"]["step_ms"], "bandwidth_fraction": r["baseline_8b"]["bandwidth_fraction"],
           "cycles_ms": {f"{c['steps']},{c['topk']},{c['draft_tokens']}": c["cycle_ms"] for c in r["cycles"]}}
       for v, r in runs.items()}
d, i = res["default"], res["invariant"]
res["invariant_over_default"] = {"step": round(i["step_ms"] / d["step_ms"], 4),
                                 **{s: round(i["cycles_ms"][s] / d["cycles_ms"][s], 4) for s in d["cycles_ms"]}}
res["replay_516_at_3.52_tok_s"] = {v: round(3.52e3 / res[v]["cycles_ms"]["5,1,6"], 1) for v in ("default", "invariant")}
(out / "invariant_cost.json").write_text(json.dumps(res, indent=1))
print(json.dumps(res, indent=1))
PY
