"""Run a target + EAGLE-3 draft pair in vLLM's offline `LLM` API and report what vLLM itself measured.

Executed with the python of a venv that has vLLM (`python -m eaglekit.integrations.vllm.run JOB.json OUT.json`),
by `eaglekit.integrations.vllm.doctor` in the eaglekit process; it imports nothing of eaglekit beyond the plugin.
The job gives the folders, the prompts as token ids (tokenized by eaglekit, so both engines see the same
ids), the chain length k, max_tokens and the dtype. The result: each prompt's generated ids, vLLM's
spec-decode counters (LLM.get_metrics(): vllm:spec_decode_num_drafts, ..._num_draft_tokens,
..._num_accepted_tokens, ..._num_accepted_tokens_per_pos), and the `engine.config` records of the plugin
(the aux layer ids vLLM resolved, fc width, d2t).

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and the plugin is registered here
directly, so the config records come back even where the entry point is not installed.
"""

from __future__ import annotations

import json
import os
import sys
import time


def run(job: dict) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the probe needs little
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: do not pin cores
    os.environ["EAGLE3_DEBUG"] = "1"
    if not job.get("trace_file"):
        os.environ["EAGLE3_DEBUG_STEPS"] = "0"  # the config records only
    else:
        os.environ["EAGLE3_DEBUG_FILE"] = job["trace_file"]
        if job.get("trace_steps") is not None:
            os.environ["EAGLE3_DEBUG_STEPS"] = str(job["trace_steps"])
    from eaglekit.integrations.vllm import plugin
    from eaglekit.observe import trace

    sink: list = []
    trace.configure(sink=sink, stream=open(os.devnull, "w") if not job.get("trace_file") else None)
    plugin.register()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.time()
    spec = None
    if job.get("draft"):
        spec = {"method": "eagle3", "model": job["draft"], "num_speculative_tokens": int(job["k"])}
    llm = LLM(
        model=job["target"],
        tokenizer=job["target"],
        speculative_config=spec,
        enforce_eager=True,
        dtype=job.get("dtype", "float32"),
        max_model_len=int(job.get("max_model_len", 512)),
        seed=0,
        disable_log_stats=False,
        **job.get("llm_kwargs", {}),
    )
    load_s = time.time() - t0
    sp = SamplingParams(
        temperature=0.0, max_tokens=int(job["max_tokens"]), stop_token_ids=list(job.get("eos_ids") or []) or None
    )
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in job["prompts"]]
    t1 = time.time()
    if job.get("one_at_a_time"):
        outs = [o for p in prompts for o in llm.generate([p], sp, use_tqdm=False)]
    else:
        outs = llm.generate(prompts, sp, use_tqdm=False)
    gen_s = time.time() - t1
    counters = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode"):
            continue
        values, value = plugin.vllm_member(m, "values"), plugin.vllm_member(m, "value")
        if values is not None:  # a Vector: one value per draft position
            counters[m.name] = list(values)
        elif value is not None:
            counters[m.name] = value
    return {
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "finish_reasons": [o.outputs[0].finish_reason for o in outs],
        "counters": counters,
        "config": plugin._state["config"],
        "config_records": [r for r in sink if r.get("point") == "engine.config"],
        "vllm_version": __import__("vllm").__version__,
        "load_s": round(load_s, 1),
        "generate_s": round(gen_s, 1),
    }


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    res = run(job)
    with open(sys.argv[2], "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
