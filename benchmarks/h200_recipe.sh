#!/usr/bin/env bash
# Train the shipped demo pair on one H200 (the device tool runs this from the repository root, carrying
# .corpus/python3.11: the CPython 3.11.7 standard library's .py files copied from a 2-core machine).
# Results come back as demo.tgz.part* (each < 16 MiB) + recipe.log in $OUT, packed after each half
# so a failure in the second half still returns the target.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
R=/tmp/demo
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
pack() {
  rm -f "$OUT"/demo.tgz.part*
  tar czf - -C /tmp --exclude=demo/regen.jsonl --exclude=demo/draft_run --exclude='*.pt' demo \
    | split -b 15M - "$OUT/demo.tgz.part"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)" >> "$OUT/gpu.txt"
python3 -m eaglekit.cli recipe demo --out $R --preset gpu --device cuda --stdlib .corpus/python3.11 --stop-after target 2>&1 | tee "$OUT/recipe.log" | grep -v "it/s"
pack
python3 -m eaglekit.cli recipe demo --out $R --preset gpu --device cuda --stdlib .corpus/python3.11 2>&1 | tee -a "$OUT/recipe.log" | grep -v "it/s"
pack
ls -la "$OUT"
