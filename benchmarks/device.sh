#!/usr/bin/env bash
# The one runner for a lent GPU machine: its image lacks the serving wheels and runs from a copy of the tree, so this
# installs .whl/*.whl (if carried: the device's run(carry=[".whl"])) beside it, then runs one suite with its result
# under $OUT. The folder is git-ignored; make it here (the image's python is 3.12) with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl -r benchmarks/serve_wheels.txt
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
