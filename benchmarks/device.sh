#!/usr/bin/env bash
# The one runner for a lent GPU machine: its image lacks the serving wheels and runs from a copy of the tree, so this
# installs .whl/*.whl (if carried: the device's run(carry=[".whl"]); made here with `pip download --only-binary
# :all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps -d .whl fastapi uvicorn openai ...`) beside
# it, then runs one suite with its result under $OUT.
#   bash benchmarks/device.sh h200 [--quick] [--param key=value ...]      (results: $OUT/DATE_SUITE.json)
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/pydeps
if [ -d .whl ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/pydeps .whl/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=$PWD:/tmp/pydeps PYTHONUNBUFFERED=1 TQDM_DISABLE=1
suite=$1; shift
python3 -m benchmarks run "$suite" --out "$OUT/$(date +%F)_$suite.json" "$@" 2>&1 | tee "$OUT/$suite.log" | grep -v -i warn
