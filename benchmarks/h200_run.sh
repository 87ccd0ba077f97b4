#!/usr/bin/env bash
# One H200 call: the GPU tests, then the benchmark suite. Results land in $OUT (copy the JSON into
# benchmarks/results/ afterwards).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
python3 benchmarks/h200_suite.py --out "$OUT" --budget-s "${BUDGET_S:-330}" 2>&1 | tee "$OUT/suite.log" | grep -v -i "warn"
