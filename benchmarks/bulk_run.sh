#!/usr/bin/env bash
# One H200 call for products "bulk" (eaglekit.models.bulk): build its kernels, run its GPU tests, then the 8B-shape
# baseline and cycles (h200_suite.py --only-8b) with products bulk and, side by side on the same machine, invariant.
# Results land in $OUT (copy the JSONs into benchmarks/results/ afterwards).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv; command -v nvcc; nvcc --version | tail -2; } \
  2>&1 | tee "$OUT/env.txt"
python3 -c "
import time; t = time.time()
from eaglekit.models import bulk
bulk.library(); print(f'bulk build {bulk.BUILD_SECONDS} s, load {time.time() - t:.2f} s')" 2>&1 | tee -a "$OUT/env.txt"
timeout "${TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider ${TESTS:-tests/test_bulk.py} 2>&1 | tail -40 \
  | tee "$OUT/bulk_tests.txt"
for kind in ${KINDS:-bulk invariant}; do
  timeout "${SUITE_S:-170}" python3 benchmarks/h200_suite.py --only-8b --products "$kind" --out "$OUT/$kind" 2>&1 \
    | grep -v -i warn | tail -12
done
