#!/usr/bin/env bash
# One H200 call for the int8 draft (eaglekit.models.quant): its GPU tests, the cycles with it (fast_probe), the
# draft's products bf16 against int8 with smallm's int8 configs swept (quant_probe), and, as time allows, the cycles
# with the stored bf16 draft on the same machine. Results land in $OUT. STEPS picks the parts (default: all).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
S=${SHAPES:-"5,1,6;5,4,8"}
for step in ${STEPS:-tests int8 quant main}; do
  t=$(date +%s)
  case $step in
    tests) timeout "${T_TESTS:-90}" python3 -m pytest -q -p no:warnings -m gpu tests/test_gpu.py -k "${TESTS:-int8}" \
             > "$OUT/tests.log" 2>&1 ;;
    int8) timeout "${T_PROBE:-220}" python3 benchmarks/fast_probe.py --variant int8 --products bulk --draft-quant int8 \
            --shapes "$S" --out "$OUT" > "$OUT/int8.log" 2>&1 ;;
    int8k) timeout "${T_PROBE:-220}" python3 benchmarks/fast_probe.py --variant int8k --products bulk --draft-quant int8 \
            --draft-quant-one-row kernel --shapes "$S" --out "$OUT" > "$OUT/int8k.log" 2>&1 ;;
    int8pdl) TORCHINDUCTOR_ENABLE_PDL=1 timeout "${T_PROBE:-220}" python3 benchmarks/fast_probe.py --variant int8pdl \
            --products bulk --draft-quant int8 --shapes "$S" --out "$OUT" > "$OUT/int8pdl.log" 2>&1
          python3 -c "import torch._inductor.config as c; print('triton.enable_pdl:', hasattr(c.triton, 'enable_pdl'))" ;;
    quant) timeout "${T_QUANT:-200}" python3 benchmarks/quant_probe.py "$OUT" --sweep --budget-s "${SWEEP_S:-90}" \
             > "$OUT/quant.log" 2>&1 ;;
    main) timeout "${T_PROBE:-220}" python3 benchmarks/fast_probe.py --variant main --products bulk --shapes "$S" \
            --out "$OUT" > "$OUT/main.log" 2>&1 ;;
  esac
  echo "$step rc=$? $(( $(date +%s) - t )) s"
done
tail -3 "$OUT/tests.log" 2>/dev/null
grep -h "cycle_over_baseline\|cycle .* ms" "$OUT"/*.log 2>/dev/null | tail -8
