#!/usr/bin/env bash
# One H200 call: fast_probe.py over the compile variants, each in its own process, the default one twice (the
# second run shows what the inductor cache saves). Results land in $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR=$OUT/../inductor-cache
(lscpu | head -20; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv) > "$OUT/machine.txt" 2>&1
probe() {  # name, seconds, args...
  local name=$1 secs=$2; shift 2
  timeout "$secs" python3 benchmarks/fast_probe.py --variant "$name" --out "$OUT" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"tokens_per_s": [0-9.]*' "$OUT/probe_$name.json" 2>/dev/null | head -1)"
}
for v in ${VARIANTS:-inductor_default cdt cdt_again autotune}; do
  case $v in
    inductor_default) probe $v 150 --options '{}' ;;
    cdt) probe $v 200 --options '{"coordinate_descent_tuning": true}' ;;
    cdt_again) probe $v 100 --options '{"coordinate_descent_tuning": true}' ;;
    autotune) probe $v 240 --options '{"coordinate_descent_tuning": true, "max_autotune": true}' ;;
    graphs) probe $v 120 --no-compile ;;
  esac
done
