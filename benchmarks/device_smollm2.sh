#!/usr/bin/env bash
# The smollm2 recipe's gpu preset on a lent GPU machine. The GGUF (98 MB) is larger than what one device call carries
# (64 MiB with the tree), so it travels in two calls on one warm machine (it stays warm ~30 s between calls):
#   here, once:  G=$(python -c 'from eaglekit.gguf import find_smollm2; print(find_smollm2())')
#                mkdir -p .gg1 .gg2 .ggw && printf '/.gg1/\n/.gg2/\n/.ggw/\n' >> .git/info/exclude
#                head -c 58000000 $G > .gg1/part1 && tail -c +58000001 $G > .gg2/part2
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .ggw gguf==0.19.0
#   (the tree must leave room: carry only what the call needs; the demo pair's 27 MB may have to stay behind)
#   call 1 (carry .gg1):        mkdir -p /tmp/gg && cp .gg1/part1 /tmp/gg/
#   call 2 (carry .gg2, .ggw):  bash benchmarks/device_smollm2.sh   (results: $OUT/recipe.log, regen.tar.gz, draft.tar.gz)
# Here, afterwards: tar xzf regen.tar.gz -C runs/smollm2 && tar xzf draft.tar.gz -C runs/smollm2, then eaglekit recipe
# smollm2 --out runs/smollm2 --install (the stages done on the GPU are skipped; the eval runs here).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cat /tmp/gg/part1 .gg2/part2 > /tmp/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/smol.gguf" | sha256sum -c || exit 3
python3 -m pip install -q --no-index --no-deps --target /tmp/site .ggw/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TQDM_DISABLE=1 EAGLEKIT_GGUF_CACHE=/tmp/ggcache
nvidia-smi -L
t0=$(date +%s)
# stage by stage, each stage's output packed into $OUT as soon as it exists: a call cut short by the lease still
# returns what it finished. SETTINGS: extra `--set KEY=VALUE` for a short lease (e.g. regen_budget=60 draft_budget=80)
sets=(); for kv in ${SETTINGS:-}; do sets+=(--set "$kv"); done
recipe() { python3 -m eaglekit recipe smollm2 --out /tmp/run --preset gpu --target /tmp/smol.gguf --device cuda \
           "${sets[@]}" "$@" 2>&1 | tee -a "$OUT/recipe.log"; }
recipe --stop-after long
(cd /tmp/run && tar czf "$OUT/regen.tar.gz" regen $(ls long.jsonl 2>/dev/null))
echo "regen packed at $(( $(date +%s) - t0 ))s" | tee -a "$OUT/recipe.log"
recipe --stop-after draft --set regen_budget=0 --set long_convs=0
echo "recipe wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/recipe.log"
(cd /tmp/run && tar czf "$OUT/draft.tar.gz" draft draft_train.json draft_run/train_log.jsonl 2>/dev/null)
ls -la "$OUT"
