"""The benchmark suite, one run on one GPU (~5 minutes on an H200). Every ratio is measured side by side
in this run; medians of CUDA-event timings; each section is guarded so one failure does not lose the rest.

    a. batch-1 decode of a Llama-3.1-8B-shaped target (random bf16 weights): tokens/s, and its fraction of
       the copy bandwidth measured here (bytes of non-embedding weights per token)
    b. the EAGLE-3 cycle at that shape (draft: 1 layer, hidden 4096, draft vocab 32000) for (3,1,4), (5,4,8),
       (6,8,48): cycle time over the baseline step, per-phase times, and tokens/s at the demo pair's accept
       length for that shape (labelled replayed)
    c. the shipped demo pair end to end: accept length, tokens/s, speedup over our baseline, identity (the default
       GPU path since 2026-12-01: compiled layers)
    d. peers: transformers generate (eager) and transformers assisted generation by prompt lookup on the
       demo target; transformers generate at the 8B shape

    python benchmarks/h200_suite.py [--out DIR] [--budget-s 420] [--products invariant]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timing import median_ms  # noqa: E402  (benchmarks/timing.py, beside this script)

RESULTS: dict = {}
T0 = time.time()
COMPILE = False
COMPILE_OPTIONS = None  # inductor options for the compiled layers (None: eaglekit's DECODE_OPTIONS)
SMALL_M = None  # rows from which products go through eaglekit.models.smallm (None: F.linear)
PRODUCTS = None  # a target products kind instead (e.g. "invariant": batch-invariant products and attention)
DRAFT_PRODUCTS = None  # the draft's products kind in section b (None: F.linear, what inductor makes of it)
DRAFT_QUANT = None  # "int8": the draft's weights quantized (eaglekit.models.quant) in sections b and c
DRAFT_ATTENTION = None  # the 8B draft's decode attention in section b (Eagle3Draft.set_attention; None: as load_pair)
LEVEL_TREE = False  # the 8B draft's tree level by level in section b (compiled_tree None; fast_probe --level-tree)
SHAPES = [(3, 1, 4), (5, 1, 6), (5, 4, 8), (6, 8, 48)]
ON_CYCLE = None  # called as ON_CYCLE(shape tuple, recorded Cycle, reset) after a shape's cycle is timed (fast_probe)


def section(name):
    def wrap(fn):
        def run(*a, **k):
            t = time.time()
            print(f"\n== {name}", flush=True)
            try:
                return fn(*a, **k)
            except Exception as e:  # keep going: the other sections still report
                traceback.print_exc()
                RESULTS.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
            finally:
                print(f"   ({time.time() - t:.1f}s)", flush=True)
        return run
    return wrap


def gpu_state() -> dict:
    """The GPU's clocks, power, temperature and active throttle reasons now (nvidia-smi; {} where it fails): the
    draft's latency-bound phases ran 0.05-0.1 ms apart between processes on one machine (NOTES, twenty-second
    session), and the SM clock is the first suspect."""
    import subprocess

    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}
    return dict(zip(q.split(","), (v.strip() for v in out.split(","))))


def events_ms(fn, reps=50, warm=3, before=None):
    return median_ms(fn, reps, warm, cuda=True, before=before)


@section("copy bandwidth")
def copy_bandwidth():
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = events_ms(lambda: y.copy_(x), reps=20)
    RESULTS["copy_bandwidth_bytes_per_s"] = 2 * x.numel() / (ms / 1e3)
    print(f"   {RESULTS['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s (read + write)")


def on_gpu_bf16(build):
    """Build a module directly on the GPU in bf16 (no float32 copy of 8B parameters on the way)."""
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            return build()
    finally:
        torch.set_default_dtype(torch.float32)


def llama8b():
    from eaglekit.models.config import parse_target_config
    from eaglekit.models.llama import LlamaModel, LlamaTarget
    from eaglekit.train.pretrain import llama_config

    raw = llama_config(128256, 4096, 32, 32, 8, 14336, max_pos=8192, tie=False, eos_id=128001)
    raw["rope_theta"] = 500000.0
    cfg = parse_target_config(raw)
    net = on_gpu_bf16(lambda: LlamaModel(cfg))
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.02, generator=g)  # timing does not depend on the values, but never time zeros
    t = LlamaTarget(net, "cuda", torch.bfloat16)
    t.fuse()
    t.set_small_m(SMALL_M)
    if PRODUCTS:
        t.set_products(PRODUCTS)
    if COMPILE:
        t.compile(COMPILE_OPTIONS)
    return t, raw


@section("a. baseline decode, Llama-3.1-8B shape")
def baseline_8b(ctx):
    from eaglekit.decoding.engine import Decoder

    t, _ = llama8b()
    ctx["target"] = t
    emb = t.net.model.embed_tokens.weight
    nbytes = sum(p.numel() * p.element_size() for p in t.net.parameters()) - emb.numel() * emb.element_size()
    RESULTS["weight_bytes_non_embedding"] = nbytes
    dec = Decoder(t)
    t.reset(1024)
    prompt = torch.randint(0, 128000, (512,), device="cuda")
    logits, _ = t.prefill(prompt)
    g, buf = dec._graphed_step(logits[-1].argmax())
    ms = events_ms(g.replay, reps=200, warm=5)
    t.reset(1024)
    t.prefill(prompt)
    tok = logits[-1].argmax()
    state = gpu_state()  # (right after the graphed steps were timed)
    eager = events_ms(lambda: t.step(tok.view(1)), reps=10, warm=2)
    tps = 1e3 / ms
    bw = RESULTS.get("copy_bandwidth_bytes_per_s", 4.25e12)
    RESULTS["baseline_8b"] = {"tokens_per_s": round(tps, 2), "step_ms": round(ms, 4),
                              "bandwidth_fraction": round(tps * nbytes / bw, 4), "eager_step_ms": round(eager, 3),
                              "roofline_tokens_per_s": round(bw / nbytes, 1), "context": 512, "graphs": True,
                              "gpu_state": state}
    print(f"   graphed step {ms:.3f} ms = {tps:.1f} tok/s = {tps * nbytes / bw:.1%} of copy bandwidth "
          f"(roofline {bw / nbytes:.0f} tok/s); eager {eager:.2f} ms")
    ctx["step_ms"] = ms


@section("b. EAGLE-3 cycle, Llama-3.1-8B shape")
def cycles_8b(ctx):
    from eaglekit.capture import CaptureSpec
    from eaglekit.decoding.engine import PHASES, Cycle
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.draft.model import DraftConfig, Eagle3Draft

    t = ctx["target"]
    spec = CaptureSpec.default(32)
    cfg = DraftConfig(hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, vocab_size=128256,
                      draft_vocab_size=32000, rope=t.cfg.rope, capture=spec)
    d = on_gpu_bf16(lambda: Eagle3Draft(cfg))
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.normal_(0, 0.02, generator=g)
        d.embed_tokens.weight.copy_(t.embed_weight())
        d.d2t.copy_(torch.arange(32000, device="cuda") * 3 - torch.arange(32000, device="cuda"))
    d.fuse()
    if DRAFT_QUANT:
        d.quantize(DRAFT_QUANT)
    d.set_small_m(SMALL_M)
    if DRAFT_PRODUCTS:
        d.set_products(DRAFT_PRODUCTS)
    kind = DRAFT_ATTENTION or ("bulk" if PRODUCTS == "bulk" else "sdpa")
    RESULTS["draft_attention"] = "bulk" if d.set_attention(kind) else "sdpa"
    if COMPILE:
        d.compile(COMPILE_OPTIONS)
        if LEVEL_TREE:  # a tree level by level (each level's layer, pick and bookkeeping graphs of their own)
            d.compiled_tree = None
    RESULTS["draft_tree_graph"] = "levels" if LEVEL_TREE or d.compiled_tree is None else "whole"
    ctx["draft8b"] = d
    prompt = torch.randint(0, 128000, (512,), device="cuda")
    rows = RESULTS["cycles"] = []  # (filled shape by shape: a run cut by its time limit keeps what it measured)
    for steps, topk, dt in SHAPES:
        shape = TreeShape(steps, topk, dt)
        t.reset(1024)
        d.reset(1024 + 64)
        _, feats = t.prefill(prompt, spec)
        h, dl = d.extend(feats, torch.cat([prompt[1:], prompt[:1]]))
        L = t.length
        c = Cycle(t, d, shape, spec)
        c.start(prompt[0], h, dl)
        c.record(greedy=True, whole=True)  # the phases' graphs (what Decoder replays) and the cycle as one graph

        def reset():
            t.committed.fill_(L)
            d.committed.fill_(L)

        def by_phase():  # five graph launches a cycle, as the Decoder runs it
            for p in PHASES:
                c.recorded[p].replay()

        # timed as the baseline step is: events around the graph launches alone (the lengths' reset before the first
        # event); until the 22nd session the reset's two kernels were inside the span: "cycle_ms_as_before". Beside
        # it the cycle as one graph ("cycle_ms_one_graph": slower on the H200 in the 22nd session, not the Decoder's)
        total = events_ms(by_phase, before=reset)
        state = gpu_state()  # (right after the cycles ran: the clocks they ran at)
        one_graph = events_ms(c.recorded["cycle"].replay, before=reset)
        as_before = events_ms(lambda: (reset(), by_phase()), reps=50)
        phases = {}
        for p in PHASES:
            reset()
            phases[p] = round(events_ms(c.recorded[p].replay, reps=20), 4)
        row = {"steps": steps, "topk": topk, "draft_tokens": dt, "cycle_ms": round(total, 4),
               "cycle_over_baseline": round(total / ctx["step_ms"], 4), "cycle_ms_one_graph": round(one_graph, 4),
               "cycle_ms_as_before": round(as_before, 4), "phases_ms": phases, "gpu_state": state}
        rows.append(row)
        if ON_CYCLE is not None:
            ON_CYCLE((steps, topk, dt), c, reset)
        print(f"   ({steps},{topk},{dt}): cycle {total:.3f} ms = {total / ctx['step_ms']:.3f} x the baseline step "
              f"(one graph: {one_graph:.3f} ms = {one_graph / ctx['step_ms']:.3f}; the reset inside the span, as "
              f"before: {as_before:.3f} = {as_before / ctx['step_ms']:.3f}); phases {phases}")


@section("c. demo pair end to end")
def demo_pair(ctx):
    from eaglekit.decoding.engine import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import ASSETS
    from eaglekit.observe.metrics import aggregate
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, p) for p in read_prompts(ASSETS / "prompts.jsonl")]
    out = {}
    for dtype in ("bfloat16", "float32"):
        t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cuda", dtype=dtype, products=PRODUCTS or "auto",
                         draft_quant=DRAFT_QUANT)
        base_dec = Decoder(t)
        base_dec.generate(prompts[0], 16, baseline=True)
        base_runs = [base_dec.generate(p, 128, baseline=True) for p in prompts]
        B = aggregate([r.metrics for r in base_runs])
        rows = []
        for shape in [(3, 1, 4), (5, 1, 6), (5, 4, 8), (6, 8, 48)]:
            dec = Decoder(t, d, TreeShape(*shape))
            dec.generate(prompts[0], 16)
            runs = [dec.generate(p, 128) for p in prompts]
            E = aggregate([r.metrics for r in runs])
            same = sum(a.token_ids == b.token_ids for a, b in zip(runs, base_runs))
            rows.append({"steps": shape[0], "topk": shape[1], "draft_tokens": shape[2],
                         "accept_length": round(E.accept_length, 4), "per_position": [round(x, 4) for x in
                                                                                       E.per_position],
                         "tokens_per_s": round(E.tokens_per_s, 1), "speedup": round(E.tokens_per_s / B.tokens_per_s, 4),
                         "identical_prompts": same, "prompts": len(prompts)})
            print(f"   {dtype} {shape}: accept {E.accept_length:.2f}, {E.tokens_per_s:.0f} tok/s vs "
                  f"{B.tokens_per_s:.0f}, {E.tokens_per_s / B.tokens_per_s:.2f}x, identical {same}/{len(prompts)}")
        out[dtype] = {"baseline_tokens_per_s": round(B.tokens_per_s, 1), "rows": rows,
                      "products": getattr(t, "products", None)}
        del t, d
    best = max(out["bfloat16"]["rows"], key=lambda r: r["tokens_per_s"])
    RESULTS["demo_pair"] = {"accept_length": best["accept_length"], "speedup": best["speedup"],
                            "shape": [best["steps"], best["topk"], best["draft_tokens"]], "dtype": "bfloat16",
                            "by_dtype": out}
    ctx["demo_accept"] = {(r["steps"], r["topk"], r["draft_tokens"]): r["accept_length"]
                          for r in out["bfloat16"]["rows"]}


@section("d. peers")
def peers(ctx):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from eaglekit.demo import ASSETS
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, p) for p in read_prompts(ASSETS / "prompts.jsonl")[:8]]
    hf = AutoModelForCausalLM.from_pretrained(ASSETS / "target", dtype=torch.bfloat16).cuda().eval()
    res = {}
    for name, kw in (("transformers_generate_eager", {}), ("transformers_prompt_lookup", {"prompt_lookup_num_tokens": 10})):
        n, secs = 0, 0.0
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                o = hf.generate(ids, max_new_tokens=128, do_sample=False, eos_token_id=None, pad_token_id=0,
                                attention_mask=torch.ones_like(ids), **kw)
            torch.cuda.synchronize()
            secs += time.perf_counter() - t0
            n += o.shape[1] - ids.shape[1]
        res[name] = {"model": "demo target", "tokens_per_s": round(n / secs, 1)}
        print(f"   {name} (demo target): {n / secs:.1f} tok/s")
    del hf
    if "target" in ctx:
        t = ctx["target"]
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                          rope_theta=500000.0, tie_word_embeddings=False)
        with torch.device("meta"):
            m = LlamaForCausalLM(cfg)
        # share our weights (same names); the rotary buffer is not a weight: rebuild it on the GPU
        m.load_state_dict({k: v for k, v in t.net.state_dict().items()}, strict=False, assign=True)
        m.model.rotary_emb = type(m.model.rotary_emb)(config=cfg, device="cuda")
        m = m.eval()
        ids = torch.randint(0, 128000, (1, 512), device="cuda")
        with torch.no_grad():
            m.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            o = m.generate(ids, max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
        tps = (o.shape[1] - 512) / (time.perf_counter() - t0)
        res["transformers_generate_eager_8b"] = {"model": "Llama-3.1-8B shape, random bf16", "tokens_per_s": round(tps, 2)}
        print(f"   transformers generate (eager), 8B shape: {tps:.1f} tok/s")
    RESULTS["peers"] = res


@section("e. compiled decoder layers (torch.compile inside our CUDA graph)")
def compiled_step(ctx, budget_s):
    from eaglekit.decoding.engine import Decoder

    left = budget_s - (time.time() - T0)
    if left < 150 or "target" not in ctx:
        print(f"   skipped: {left:.0f}s left of the budget")
        RESULTS["compiled_8b"] = {"skipped": f"{left:.0f}s left"}
        return
    t = ctx["target"]
    t.compile(COMPILE_OPTIONS)  # eaglekit's own compile path (prompts longer than COMPILE_MAX_TOKENS run plain)
    t0 = time.time()
    dec = Decoder(t)
    t.reset(1024)
    prompt = torch.randint(0, 128000, (512,), device="cuda")
    logits, _ = t.prefill(prompt)
    g, buf = dec._graphed_step(logits[-1].argmax())
    compile_s = time.time() - t0
    ms = events_ms(g.replay, reps=200, warm=5)
    tps = 1e3 / ms
    bw = RESULTS.get("copy_bandwidth_bytes_per_s", 4.25e12)
    frac = tps * RESULTS["weight_bytes_non_embedding"] / bw
    RESULTS["compiled_8b"] = {"tokens_per_s": round(tps, 2), "step_ms": round(ms, 4),
                              "bandwidth_fraction": round(frac, 4), "compile_and_capture_s": round(compile_s, 1)}
    print(f"   compiled + graphed step {ms:.3f} ms = {tps:.1f} tok/s = {frac:.1%} of copy bandwidth "
          f"(compile + capture {compile_s:.0f}s)")


def write(out):
    RESULTS["seconds"] = round(time.time() - T0, 1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"h200_{RESULTS['date']}{'_compiled' if COMPILE else ''}.json"
    path.write_text(json.dumps(RESULTS, indent=2))
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--budget-s", type=float, default=420, help="skip the compile section past this")
    ap.add_argument("--compile", action="store_true", help="sections a and b with the compiled decoder layer")
    ap.add_argument("--only-8b", action="store_true", help="sections a and b only")
    ap.add_argument("--products", default=None, help="the products kind of every section (default: F.linear in a "
                    "and b, load_pair's auto in c, which is invariant for bf16 on a GPU)")
    ap.add_argument("--draft-quant", default=None, choices=["int8"], help="the draft's weights as int8 (b and c)")
    args = ap.parse_args()
    global COMPILE, PRODUCTS, DRAFT_QUANT
    COMPILE, PRODUCTS, DRAFT_QUANT = args.compile, args.products, args.draft_quant
    import transformers

    RESULTS.update(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(0),
                   torch=torch.__version__, transformers=transformers.__version__, compiled_layers=args.compile,
                   products=args.products or "aten in a/b, auto in c", draft_quant=args.draft_quant)
    ctx: dict = {}
    copy_bandwidth()
    baseline_8b(ctx)
    if "step_ms" in ctx:
        cycles_8b(ctx)
    if args.only_8b:
        print(json.dumps({k: RESULTS[k] for k in ("baseline_8b", "cycles", "errors") if k in RESULTS}, indent=1))
        print(f"wrote {write(args.out)}")
        return
    demo_pair(ctx)
    if "cycles" in RESULTS and "demo_accept" in ctx:
        for r in RESULTS["cycles"]:
            a = ctx["demo_accept"].get((r["steps"], r["topk"], r["draft_tokens"]))
            if a:
                r["replayed_accept_length"] = a
                r["replayed_tokens_per_s"] = round(a * 1e3 / r["cycle_ms"], 1)
                r["replayed_speedup"] = round(a / r["cycle_over_baseline"], 3)
                r["replay_source"] = "demo pair, bf16 on this GPU, 32 held-out prompts"
    peers(ctx)
    write(args.out)  # the results so far survive a compile that runs out of time
    compiled_step(ctx, args.budget_s)
    path = write(args.out)
    print("\n" + json.dumps({k: RESULTS[k] for k in ("baseline_8b", "compiled_8b", "cycles", "demo_pair", "peers",
                                                      "errors") if k in RESULTS}, indent=1)[:7000])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
