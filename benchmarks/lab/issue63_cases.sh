#!/bin/bash
# Issue 63's cases replayed against an eaglekit checkout: each case's command, its exit status and the lines that
# show what it did. Run it in the project's venv, once per checkout, and set the two transcripts side by side:
#
#     git archive d6e9d2c | tar -x -C /tmp/before          # the checkout before (any other tree works)
#     benchmarks/lab/issue63_cases.sh /tmp/before > before.txt
#     benchmarks/lab/issue63_cases.sh "$PWD" > after.txt
#
# SKIP5=1 leaves out case 5 (a 65 MiB one-line text file given to train): before, it tokenizes for minutes and grows
# to gigabytes of RSS. Cases 2 (stop strings) and the served case 1 are benchmarks/cases/poison.py and
# tests/serve/test_poison.py. Everything is written under a temporary folder, removed at the end.
TREE=${1:?usage: issue63_cases.sh TREE}
export PYTHONPATH=$TREE OMP_NUM_THREADS=1
T=$TREE/eaglekit/assets/demo/target
D=$TREE/eaglekit/assets/demo/draft
W=$(mktemp -d)
run() { echo "### $1"; shift; echo "\$ $*"; ( cd $W && timeout 600 "$@" ) > $W/out 2>&1; rc=$?; grep -v "^\s*$" $W/out | grep -iE "error|E[0-9]{3}|Traceback|Error|wrote|diverged|resum|rc|nan" | tail -4 | cut -c1-220; echo "rc=$rc"; }
run "1 temperature 1e-300" python -m eaglekit generate --target $T --draft $D --prompt "def f(x):" --max-new-tokens 8 --temperature 1e-300 --json
run "1 top_p 1e-300" python -m eaglekit generate --target $T --prompt "def f(x):" --max-new-tokens 8 --temperature 1 --top-p 1e-300 --json
run "3 a 5000-digit integer" python -c "
from eaglekit.serve.protocol import parse_json, parse_completion
try:
    parse_completion(parse_json(b'{\"prompt\": \"x\", \"max_tokens\": ' + b'9' * 5000 + b'}'), ['m'])
except Exception as e:
    print(type(e).__name__, getattr(e, 'status', None), getattr(e, 'code', None), str(e)[:120])"
printf '{"text": "def add(a, b):\\n    return a + b\\n"}\n%.0s' $(seq 40) > $W/d.jsonl
cp $W/d.jsonl $W/d.orig
run "4 regenerate --data d.jsonl --out d.jsonl" python -m eaglekit regenerate --target $T --data d.jsonl --out d.jsonl --max-prompts 2 --max-new-tokens 4
cmp -s $W/d.jsonl $W/d.orig && echo "d.jsonl intact" || echo "d.jsonl REPLACED"
cp -r $D $W/draft
run "4 export onto its own draft" python -m eaglekit export $W/draft --draft $W/draft --to sglang --target $T
cmp -s $W/draft/model.safetensors $D/model.safetensors && echo "draft weights intact" || echo "draft weights REWRITTEN"
if [ -z "$SKIP5" ]; then
python -c "open('$W/big.txt','w').write('x' * (65 * 2**20))"
run "5 train on a 65 MiB one-line text file (RSS: /usr/bin/time)" /usr/bin/time -f "maxrss_kb=%M" python -m eaglekit train --target $T --data big.txt --out run_big --max-steps 1
grep -o "maxrss_kb=[0-9]*" $W/out
fi
run "6 train --lr 1e30" python -m eaglekit train --target $T --data d.jsonl --out run_nan --max-steps 4 --save-every 2 --batch-size 2 --lr 1e30 --heldout 0
python - <<PY
import json, pathlib, torch
p = pathlib.Path("$W/run_nan")
log = (p / "train_log.jsonl").read_text() if (p / "train_log.jsonl").exists() else ""
print("NaN literal in train_log.jsonl:", "NaN" in log)
d = p / "draft" / "model.safetensors"
if d.exists():
    from safetensors.torch import load_file
    print("draft has non-finite tensors:", any(not torch.isfinite(v.float()).all() for v in load_file(d).values()))
else:
    print("no draft written")
PY
run "6 resume with other --max-steps" python -m eaglekit train --target $T --data d.jsonl --out run_ok --max-steps 2 --save-every 2 --batch-size 2 --heldout 0
run "6 resume with other --max-steps (2 -> 3)" python -m eaglekit train --target $T --data d.jsonl --out run_ok --max-steps 3 --save-every 2 --batch-size 2 --heldout 0
cp -r $T $W/nan; python -c "import json; p='$W/nan/config.json'; c=json.load(open(p)); c['initializer_range']=float('nan'); json.dump(c, open(p,'w'))"
run "7 NaN initializer_range" python -m eaglekit generate --target $W/nan --prompt def --max-new-tokens 2
cp -r $T $W/inf; python -c "import json; p='$W/inf/config.json'; c=json.load(open(p)); c['rope_theta']=float('inf'); json.dump(c, open(p,'w'))"
run "7 rope_theta Infinity" python -m eaglekit generate --target $W/inf --prompt def --max-new-tokens 2
cp -r $T $W/loop; rm $W/loop/tokenizer.json; ln -s $W/loop/tokenizer.json $W/loop/tokenizer.json
run "7 tokenizer.json symlink loop" python -m eaglekit generate --target $W/loop --prompt def --max-new-tokens 2
echo "### 7 docs/errors.md headings repeated:"; grep "^## " $TREE/docs/errors.md | sort | uniq -d
echo "### 7 reference.md cited in docs/doctor.md:"; grep -c "reference.md" $TREE/docs/doctor.md
echo "### 8 generate --threads:"; python -m eaglekit generate --help | grep -c -- "--threads"
rm -rf $W
