"""The GPU tier (`pytest -m gpu`) in parts that each finish in a few minutes on one GPU, run one after another.

    python tests/gpu_parts.py 2        # part 2
    python tests/gpu_parts.py all      # every part, in order
    python tests/gpu_parts.py list     # the parts and their tests
    python tests/gpu_parts.py check    # every GPU test is in exactly one part (tests/test_gpu_parts.py runs it)

Each part is a pytest run of its own (a failure or a crash in one leaves the next to run) and prints its time. With
$OUT set, each part writes $OUT/gpu_part<N>.xml (JUnit) and the runs add up in $OUT/gpu_parts.json. The exit status
is 0 when every part run passed. Parts name test functions (all their parameters), grouped by what they build: the
sm_90 CUDA layer first (one nvcc build, cached on disk for the parts after), then the Triton and int8 kernels, the
float32 pair with CUDA graphs and torch.compile, and the bf16 pair compiled and not.
"""

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU = "tests/gpu/test_gpu.py"
HOPPER = "tests/kernels/test_hopper.py"

PARTS = {
    1: ("the sm_90 layer kernels and the batched server on them", [
        f"{HOPPER}::test_a_shape_the_kernels_refuse_is_an_error_not_a_crash",
        f"{HOPPER}::test_attention_tree_rows_equal_rows_alone",
        f"{HOPPER}::test_decoder_tree_rows_equal_one_row_steps",
        f"{HOPPER}::test_norm_in_the_products",
        f"{HOPPER}::test_pending_attention_compiled_before_the_cache_write",
        f"{HOPPER}::test_pending_attention_reads_this_calls_keys_apart",
        f"{HOPPER}::test_products_right_and_row_invariant",
        f"{HOPPER}::test_qkv_rotates_and_writes_the_cache",
        "tests/serve/test_gpu_batch.py::test_bf16_serving_is_batch_invariant_by_default",
        "tests/serve/test_gpu_batch.py::test_hopper_products_run_a_one_row_batch_with_the_decoders_bits",
        "tests/models/test_attention.py::test_folded_heads_compute_grouped_query_attention",
        "tests/models/test_attention.py::test_cached_decode_calls_on_a_gpu_fold_and_prompts_do_not",
    ]),
    2: ("Triton and int8 kernels against torch", [
        f"{GPU}::test_small_m_kernel_is_right_and_batch_invariant_in_bf16",
        f"{GPU}::test_rotary_in_the_qkv_product_bf16",
        f"{GPU}::test_tree_top_k_kernels_equal_torch",
        f"{GPU}::test_invariant_attention_tree_rows_equal_rows_alone_bf16",
        f"{GPU}::test_draft_attention_bulk_against_sdpa",
        f"{GPU}::test_int8_products_in_bf16_one_row_compiled_and_in_the_kernel",
        f"{GPU}::test_int8_draft_compiled_in_graphs_keeps_the_output",
        f"{GPU}::test_small_m_compiled_graphs_equal_eager_bf16",
        f"{GPU}::test_moe_experts_kernels_in_bf16_eager_compiled_and_recorded",
        f"{GPU}::test_moe_grouped_experts_in_bf16_eager_compiled_and_recorded",
        f"{GPU}::test_small_m_shared_tiles_keep_each_rows_bits_bf16",
    ]),
    3: ("the float32 pair: CUDA graphs, torch.compile, batches, sampling", [
        f"{GPU}::test_graphs_equal_eager_and_baseline",
        f"{GPU}::test_compiled_equals_uncompiled_and_a_new_span_does_not_compile",
        f"{GPU}::test_sampling_on_the_gpu_is_seeded",
        f"{GPU}::test_recorded_graphs_follow_a_reallocated_cache",
        f"{GPU}::test_batched_graphs_equal_alone",
        f"{GPU}::test_compiled_whole_tree_is_the_level_walk",
        f"{GPU}::test_a_draft_given_up_steps_through_the_quiet_graph",
    ]),
    4: ("the bf16 pair: speculative output equals the one-row baseline", [
        f"{GPU}::test_bf16_chains_equal_the_verify_shaped_baseline",
        f"{GPU}::test_invariant_bf16_speculative_equals_the_one_row_baseline",
    ]),
    5: ("the bf16 pair's one-row batch, and DeepSeek's experts modes", [
        f"{GPU}::test_one_row_batch_equals_the_one_row_baseline_through_the_drafts_own_walk",
        "tests/models/test_deepseek.py::test_speculative_decoding_with_each_experts_mode_on_the_gpu",
    ]),
    6: ("prompts through the prompt graphs (--prompt-graphs)", [
        f"{GPU}::test_prompt_graphs_decode_what_eager_prompts_do",
        "tests/models/test_deepseek.py::test_prompt_graphs_on_the_gpu",
    ]),
}


def gpu_tests():
    """The GPU tier's tests as `file::function` (parameters folded), from pytest's own collection."""
    p = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "gpu", "--collect-only", "-q",
                        "-p", "no:cacheprovider"],
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode not in (0, 5):  # 5: nothing collected
        raise SystemExit(f"collecting the GPU tier failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return {ln.split("[")[0] for ln in p.stdout.splitlines() if "::" in ln}


def check():
    """Problems with PARTS: a GPU test in no part, a part naming no GPU test, a test in two parts."""
    have = gpu_tests()
    listed = [t for _, tests in PARTS.values() for t in tests]
    problems = [f"in no part: {t}" for t in sorted(have - set(listed))]
    problems += [f"names no GPU test: {t}" for t in listed if t not in have]
    problems += [f"in two parts: {t}" for t in sorted({t for t in listed if listed.count(t) > 1})]
    return problems


def _counts(xml):
    try:
        s = ET.parse(xml).getroot()
        s = s if s.tag == "testsuite" else s.find("testsuite")
        return {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    except (OSError, ET.ParseError, AttributeError):
        return None


def run_part(n, out):
    what, tests = PARTS[n]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rfEs", *tests]
    xml = out / f"gpu_part{n}.xml" if out else None
    if xml:
        cmd.append(f"--junitxml={xml}")
    print(f"== GPU part {n}/{len(PARTS)}: {what} ({len(tests)} test functions)", flush=True)
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    dt = time.monotonic() - t0
    print(f"== GPU part {n}: exit {rc} in {dt:.0f} s", flush=True)
    return {"part": n, "what": what, "tests": tests, "exit": rc, "seconds": round(dt, 1),
            "counts": _counts(xml) if xml else None}


def main(argv):
    arg = argv[0] if argv else "all"
    if arg == "list":
        for n, (what, tests) in PARTS.items():
            print(f"part {n}: {what}")
            print("".join(f"    {t}\n" for t in tests), end="")
        return 0
    if arg == "check":
        problems = check()
        print("\n".join(problems) or f"every GPU test is in exactly one of {len(PARTS)} parts")
        return 1 if problems else 0
    if arg != "all" and not (arg.isdigit() and int(arg) in PARTS):
        print(f"usage: gpu_parts.py [all | list | check | {' | '.join(map(str, PARTS))}]", file=sys.stderr)
        return 2
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    runs = [run_part(n, out) for n in (PARTS if arg == "all" else [int(arg)])]
    for r in runs:
        print(f"part {r['part']}: exit {r['exit']}, {r['seconds']:.0f} s, {r['counts'] or ''}")
    if out:
        path = out / "gpu_parts.json"
        done = json.loads(path.read_text()) if path.exists() else []
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(done + runs, indent=1))
        os.replace(tmp, path)  # atomic: a run cut at its time limit leaves the previous summary whole
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
