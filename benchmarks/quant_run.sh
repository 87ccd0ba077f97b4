#!/usr/bin/env bash
# One H200 call for the int8 draft (eaglekit.models.quant). STEPS picks the parts, in order (default: all but the
# variants): tests (its GPU tests), int8 (cycles with it: fast_probe), quant (the draft's products bf16 against int8,
# smallm's int8 configs swept: quant_probe), main (cycles with the stored bf16 draft on the same machine); variants of
# int8: int8ind (one row through inductor's GEMV: what "int8" was in the nineteenth session's call 1), int8pdl
# (inductor's PDL on), int8nocudnn (the draft's attention without cuDNN's SDPA), int8pdlnocudnn (both), int8swept (int8
# under another name, to run again after quant's table), int8rs (the target's attention scores by butterflies: bulk's
# EK_ATTN_RS=0, the same bits; halving is the default since the 21st session), int8top1 (a chain's pick in two stages),
# int8sdpa (the draft's attention by torch's SDPA, the default before the 21st session's bulk pending_attention),
# int8levels (a compiled tree level by level: each level's layer, pick and bookkeeping graphs of their own, the default
# before the 22nd session's whole-tree graph), int8rows (the attention by bulk's attn_rows, a block a row on the CUDA
# cores: EK_ATTN_MMA=0, the default before the 23rd session's attn_tiles). PROBE_ARGS: more fast_probe arguments (e.g.
# "--gaps 5,4,8"); QUANT_ARGS: more quant_probe arguments (e.g. "--no-inductor --sweep-rows 1"). Results: $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
S=${SHAPES:-"5,1,6;5,4,8"}
probe() {  # variant, fast_probe arguments...
  local v=$1; shift
  timeout "${T_PROBE:-220}" python3 benchmarks/fast_probe.py --variant "$v" --products bulk --shapes "$S" --out "$OUT" \
    "$@" ${PROBE_ARGS:-} > "$OUT/$v.log" 2>&1
}
for step in ${STEPS:-tests int8 quant main}; do
  t=$(date +%s)
  case $step in
    tests) timeout "${T_TESTS:-90}" python3 -m pytest -q -p no:warnings -m gpu tests/test_gpu.py -k "${TESTS:-int8}" \
             > "$OUT/tests.log" 2>&1 ;;
    int8) probe int8 --draft-quant int8 ;;
    int8ind) probe int8ind --draft-quant int8 --draft-quant-one-row inductor ;;
    int8pdl) TORCHINDUCTOR_ENABLE_PDL=1 probe int8pdl --draft-quant int8 ;;
    int8swept) probe int8swept --draft-quant int8 ;;
    int8rs) probe int8rs --draft-quant int8 --bulk-define EK_ATTN_RS=0 ;;
    int8top1) probe int8top1 --draft-quant int8 --top1-two-stage ;;
    int8sdpa) probe int8sdpa --draft-quant int8 --draft-attention sdpa ;;
    int8levels) probe int8levels --draft-quant int8 --level-tree ;;
    int8rows) probe int8rows --draft-quant int8 --bulk-define EK_ATTN_MMA=0 ;;
    int8nocudnn) probe int8nocudnn --draft-quant int8 --no-cudnn-sdp ;;
    int8pdlnocudnn) TORCHINDUCTOR_ENABLE_PDL=1 probe int8pdlnocudnn --draft-quant int8 --no-cudnn-sdp ;;
    quant) timeout "${T_QUANT:-200}" python3 benchmarks/quant_probe.py "$OUT" --sweep --budget-s "${SWEEP_S:-90}" \
             ${QUANT_ARGS:-} > "$OUT/quant.log" 2>&1 ;;
    main) probe main ;;
  esac
  echo "$step rc=$? $(( $(date +%s) - t )) s"
done
tail -3 "$OUT/tests.log" 2>/dev/null
grep -h "cycle .* ms" "$OUT"/*.log 2>/dev/null | tail -8
