#!/usr/bin/env bash
# One H200 call for batched serving (~5 minutes): the GPU tests (incl. BatchEngine with CUDA graphs),
# benchmarks/batch_suite.py, then benchmarks/serve_suite.py (the demo pair through `eaglekit serve` and
# `eaglekit bench`). The GPU image has no FastAPI: carry its wheels in .wheels/ (pip download
# --only-binary=:all: --python-version 3.12 --no-deps fastapi starlette uvicorn pydantic pydantic-core
# annotated-types typing-inspection annotated-doc opentelemetry-api -d .wheels). `h200_batch_run.sh serve`: the serve suite alone.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/pydeps
if [ -d .wheels ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/pydeps .wheels/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=$PWD:/tmp/pydeps PYTHONUNBUFFERED=1 TQDM_DISABLE=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
[ "${1:-all}" = serve ] || timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
[ "${1:-all}" = serve ] || timeout 200 python3 benchmarks/batch_suite.py "$OUT/h200_batch.json" 2>&1 | tee "$OUT/batch.log" | grep -v -i warn | tail -30
timeout 300 python3 benchmarks/serve_suite.py "$OUT/h200_serve.json" --device cuda 2>&1 | tee "$OUT/serve.log" | tail -12
