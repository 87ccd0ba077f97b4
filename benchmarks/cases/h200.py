"""GPU cases at the Llama-3.1-8B shape (random bf16 weights built on the GPU; timing does not depend on the values)
and the demo pair end to end. One run of the `h200` suite takes ~5-8 minutes on an H200; every ratio in it is
measured side by side in one process. Medians of CUDA-event timings.

    copy-bandwidth   a 2 GiB device copy (read + write): the roofline's denominator
    step-8b          the recorded baseline step (CUDA graph), tokens/s, its fraction of the copy roofline
    cycles-8b        the EAGLE-3 cycle per tree (draft: 1 layer, hidden 4096, draft vocab 32000), over the step
    demo-pair-gpu    the shipped pair end to end on the GPU: accept length, tok/s, speedup, identity
    peers            transformers generate (eager) and prompt lookup on the demo target, generate at the 8B shape

Tokens/s "replayed" multiply a cycle by an accept length measured elsewhere (the demo pair's, or SGLang's published
3.52 for (5,1,6) on Llama-3.1-8B): labelled so in the metric's name."""

from __future__ import annotations

import subprocess
import time

import torch

from ..registry import as_list, case, shapes, suite
from ..schema import stats, value
from ..timing import OneRow, samples_ms

SGLANG_ACCEPT_516 = 3.52  # SGLang's published accept length for (5,1,6) on Llama-3.1-8B (its 446.6 tok/s on an H200)


def gpu_state() -> dict:
    """The GPU's clocks, power, temperature and throttle reasons now (nvidia-smi; {} where it fails): recorded
    beside the step and each cycle, since the draft's latency-bound phases spread between processes."""
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10, check=False).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}
    return dict(zip(q.split(","), (v.strip() for v in out.split(","))))


def events(fn, reps=50, warm=3, before=None) -> list[float]:
    return samples_ms(fn, reps, warm, cuda=True, before=before)


def on_gpu_bf16(build):
    """Build a module directly on the GPU in bf16 (no float32 copy of 8B parameters on the way)."""
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            return build()
    finally:
        torch.set_default_dtype(torch.float32)


def llama8b_config():
    from eaglekit.models.config import parse_target_config
    from eaglekit.train.pretrain import LlamaShape, llama_config

    raw = llama_config(LlamaShape(128256, 4096, 32, 32, 8, 14336), max_pos=8192, tie=False, eos_id=128001)
    raw["rope_theta"] = 500000.0
    return raw, parse_target_config(raw)


def target8b(ctx, p):
    """The 8B-shape target, built once a run (its products and compile from the first case that asks)."""
    key = (p["products"], p["compile"])
    if ctx.get("target_key") not in (None, key):
        raise RuntimeError(f"the 8B target was built with {ctx['target_key']}; a case asked for {key}: run it in "
                           f"a suite (process) of its own")
    if "target" not in ctx:
        from eaglekit.models.llama import LlamaModel, LlamaTarget
        from eaglekit.pair import set_pair_products

        _, cfg = llama8b_config()
        net = on_gpu_bf16(lambda: LlamaModel(cfg))
        g = torch.Generator(device="cuda").manual_seed(0)
        with torch.no_grad():
            for w in net.parameters():
                w.normal_(0, 0.02, generator=g)  # never time zeros
        t = LlamaTarget(net, "cuda", torch.bfloat16)
        t.fuse()
        set_pair_products(t, None, p["products"], "cuda")
        if p["compile"]:
            t.compile()
        ctx.update(target=t, target_key=key)
    return ctx["target"]


def draft8b(t, p):
    from eaglekit.capture import CaptureSpec
    from eaglekit.draft.model import DraftConfig, Eagle3Draft

    spec = CaptureSpec.default(32)
    cfg = DraftConfig(hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, vocab_size=128256,
                      draft_vocab_size=32000, rope=t.cfg.rope, capture=spec)
    d = on_gpu_bf16(lambda: Eagle3Draft(cfg))
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for w in d.parameters():
            w.normal_(0, 0.02, generator=g)
        d.embed_tokens.weight.copy_(t.embed_weight())
        d.d2t.copy_(torch.arange(32000, device="cuda") * 3 - torch.arange(32000, device="cuda"))
    d.fuse()
    if p["draft_quant"] not in (None, "none"):
        d.quantize(p["draft_quant"])
    choice = getattr(t, "products_choice", None)
    kind = getattr(choice, "kind", None)
    attention = p.get("draft_attention") or ("hopper" if kind == "hopper" else "sdpa")
    used = d.set_attention(attention)
    if p["compile"]:
        d.compile()
    return d, spec, {"draft_attention": attention if used else "sdpa"}


COMMON = {"products": "auto", "compile": True}


@case("copy-bandwidth", "a 2 GiB device-to-device copy, bytes read + written per second", defaults={"reps": 20},
      needs="cuda")
def copy_bandwidth(p, ctx):
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = events(lambda: y.copy_(x), reps=p["reps"])
    tbs = [2 * 2**31 / (m / 1e3) / 1e12 for m in ms]
    ctx["copy_tb_s"] = sorted(tbs)[len(tbs) // 2]
    return {"metrics": {"copy_bandwidth": stats(tbs, "TB/s")}}


@case("step-8b", "the 8B shape's recorded greedy decode step at 1 row (and at `rows`: a verify's shapes)",
      defaults={**COMMON, "reps": 200, "context": 512, "rows": [1]}, quick={"reps": 50}, needs="cuda")
def step_8b(p, ctx):
    from eaglekit.decoding.tree import TreeShape

    t = target8b(ctx, p)
    emb = t.net.model.embed_tokens.weight
    nbytes = sum(w.numel() * w.element_size() for w in t.net.parameters()) - emb.numel() * emb.element_size()
    prompt = torch.randint(0, 128000, (p["context"],), device="cuda")
    metrics, rows = {}, as_list(p["rows"])
    for k in rows:  # the one engine's plain step at one row, recorded (k rows: a verify's shapes)
        one = OneRow(t, None, TreeShape.make(max(k - 1, 1), 1), prompt, graphs=True, plain_rows=k)
        ms = events(one.step, reps=p["reps"], warm=5, before=one.restore)
        metrics["step_ms" if k == 1 else f"step_ms_{k}_rows"] = stats(ms, "ms")
        del one
    state = gpu_state()
    step = metrics["step_ms"]["median"]
    bw = ctx.get("copy_tb_s", 4.25) * 1e12
    ctx["step_ms"] = step
    metrics["tokens_per_s"] = value(1e3 / step, "tok/s")
    metrics["copy_roofline_fraction"] = value(1e3 / step * nbytes / bw, "of copy bandwidth")
    return {"metrics": metrics,
            "details": {"weight_bytes_non_embedding": nbytes, "gpu_state": state,
                        "products": str(getattr(t, "products_choice", None)), "context": p["context"]}}


def _cycles(p, ctx):
    from eaglekit.decoding.tree import TreeShape

    t = target8b(ctx, p)
    d, spec, det = draft8b(t, p)
    step = ctx.get("step_ms")
    prompt = torch.randint(0, 128000, (p["context"],), device="cuda")
    metrics, phases, states = {}, {}, {}
    for s in shapes(p["shapes"]):
        shape = TreeShape(*(int(x) for x in s.split(",")))
        key = s.replace(",", "_")
        one = OneRow(t, d, shape, prompt, graphs=True, capture=spec)  # the one engine at one row: a graph a phase
        reset, by_phase, PHASES = one.restore, one.cycle, one.PHASES
        ms = events(by_phase, reps=p["reps"], before=reset)
        states[key] = gpu_state()
        phases[key] = {}
        for ph in PHASES:
            phases[key][ph] = round(sorted(events(lambda ph=ph, one=one: one.run(ph), reps=20, before=reset))[10], 4)
        metrics[f"cycle_ms_{key}"] = stats(ms, "ms")
        med = metrics[f"cycle_ms_{key}"]["median"]
        if step:
            metrics[f"cycle_over_step_{key}"] = value(med / step, "steps")
        if s == "5,1,6":
            metrics["tokens_per_s_516_replayed_at_sglang_3.52"] = value(SGLANG_ACCEPT_516 * 1e3 / med, "tok/s")
        acc = ctx.get("demo_accept", {}).get(s)
        if acc:
            metrics[f"tokens_per_s_{key}_replayed_at_demo_accept"] = value(acc * 1e3 / med, "tok/s")
    return {"metrics": metrics, "details": {**det, "phases_ms": phases, "gpu_state": states}}


CYCLES = {**COMMON, "shapes": "3,1,4;5,1,6;5,4,8", "reps": 50, "context": 512, "draft_quant": "none",
          "draft_attention": None}


@case("cycles-8b", "the EAGLE-3 cycle per tree at the 8B shape, its phases, its cost in baseline steps",
      defaults=CYCLES, quick={"shapes": "5,1,6", "reps": 20}, needs="cuda")
def cycles_8b(p, ctx):
    return _cycles(p, ctx)


@case("cycles-8b-int8", "as cycles-8b with the draft's weights in int8 (--draft-quant int8)",
      defaults={**CYCLES, "draft_quant": "int8"}, quick={"shapes": "5,1,6", "reps": 20}, needs="cuda")
def cycles_8b_int8(p, ctx):
    return _cycles(p, ctx)


@case("demo-pair-gpu", "the shipped pair end to end on the GPU per tree and dtype: accept length, tok/s, identity",
      defaults={"dtypes": "bfloat16,float32", "shapes": "3,1,4;5,1,6;5,4,8;6,8,48", "max_new_tokens": 128,
                "prompts": 32, "products": "auto", "draft_quant": "auto"},
      quick={"dtypes": "bfloat16", "shapes": "5,1,6", "prompts": 8}, needs="cuda")
def demo_pair_gpu(p, ctx):
    from eaglekit.decoding.compare import compare
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, x) for x in read_prompts(ASSETS / "prompts.jsonl")][:p["prompts"]]
    metrics, identity, det = {}, {}, {}
    dtypes = p["dtypes"] if isinstance(p["dtypes"], list) else str(p["dtypes"]).split(",")
    # (--param draft_quant=none reads as None)
    quants = [str(q or "none") for q in (p["draft_quant"] if isinstance(p["draft_quant"], list)
                                         else str(p["draft_quant"] or "none").split(","))]
    for dtype, dq in [(a, b) for a in dtypes for b in quants]:
        t0 = time.perf_counter()
        t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cuda", dtype=dtype,
                         run=PairRuntime(products=p["products"], draft_quant=dq))
        sfx = "" if dq == "auto" else f"_draft_{dq}"
        det[dtype + sfx] = {"products": str(getattr(t, "products_choice", None)),
                            "draft_precision": getattr(d, "precision", None)}
        for i, s in enumerate(shapes(p["shapes"])):
            shape = TreeShape(*(int(x) for x in s.split(",")))
            cmp = compare(Decoder(t, d, shape), prompts, p["max_new_tokens"], warmup=16)
            if i == 0:  # the first tree's warm-up holds the compile: what a user waits for once
                metrics[f"load_and_warmup_s_{dtype}{sfx}"] = value(time.perf_counter() - t0, "s")
            sm = cmp.summary()
            key = f"{dtype}_{s.replace(',', '_')}{sfx}"
            metrics[f"speedup_{key}"] = value(sm["speedup"], "x")
            metrics[f"tokens_per_s_{key}"] = value(sm["eagle_tokens_per_s"], "tok/s")
            metrics[f"baseline_tokens_per_s_{key}"] = value(sm["baseline_tokens_per_s"], "tok/s")
            metrics[f"accept_length_{key}"] = value(sm["accept_length"], "tokens/verify")
            identity[f"prompts_identical_{key}"] = sum(cmp.same)
            if dtype == "bfloat16" and dq == "auto":
                ctx.setdefault("demo_accept", {})[s] = sm["accept_length"]
        identity["prompts"] = len(prompts)
        del t, d
        torch.cuda.empty_cache()
    return {"metrics": metrics, "identity": identity, "details": det}


@case("peers", "transformers generate (eager), its prompt lookup on the demo target, and generate at the 8B shape",
      defaults={"prompts": 8, "max_new_tokens": 128}, needs="cuda")
def peers(p, ctx):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from eaglekit.demo import ASSETS
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, x) for x in read_prompts(ASSETS / "prompts.jsonl")[:p["prompts"]]]
    hf = AutoModelForCausalLM.from_pretrained(ASSETS / "target", dtype=torch.bfloat16).cuda().eval()
    metrics = {}
    for name, kw in (("transformers_generate_eager", {}),
                     ("transformers_prompt_lookup", {"prompt_lookup_num_tokens": 10})):
        rates = []
        for x in prompts:
            ids = torch.tensor([x], device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                o = hf.generate(ids, max_new_tokens=p["max_new_tokens"], do_sample=False, eos_token_id=None,
                                pad_token_id=0, attention_mask=torch.ones_like(ids), **kw)
            torch.cuda.synchronize()
            rates.append((o.shape[1] - ids.shape[1]) / (time.perf_counter() - t0))
        metrics[f"{name}_demo_target"] = stats(rates, "tok/s")
    del hf
    if "target" in ctx:  # our 8B weights under transformers' own Llama (same names)
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                          rope_theta=500000.0, tie_word_embeddings=False)
        with torch.device("meta"):
            m = LlamaForCausalLM(cfg)
        m.load_state_dict(dict(ctx["target"].net.state_dict()), strict=False, assign=True)
        m.model.rotary_emb = type(m.model.rotary_emb)(config=cfg, device="cuda")  # a buffer, not a weight
        m = m.eval()
        ids = torch.randint(0, 128000, (1, 512), device="cuda")
        with torch.no_grad():
            m.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            o = m.generate(ids, max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
        metrics["transformers_generate_eager_8b"] = value((o.shape[1] - 512) / (time.perf_counter() - t0), "tok/s")
    return {"metrics": metrics}


suite("h200", "one GPU: copy bandwidth, the 8B step and cycles (bf16 and int8 draft), the demo pair, peers",
      ["copy-bandwidth", "step-8b", "demo-pair-gpu", "cycles-8b", "cycles-8b-int8", "peers"], needs="cuda")
suite("h200-8b", "one GPU: copy bandwidth, the 8B step and cycles only (~3 minutes)",
      ["copy-bandwidth", "step-8b", "cycles-8b", "cycles-8b-int8"], needs="cuda")
suite("h200-demo", "the shipped pair on the GPU: default and stored-precision drafts, bf16 and float32, two chains",
      [("demo-pair-gpu", {"shapes": "3,1,4;5,1,6", "draft_quant": "auto,none"})], needs="cuda")
