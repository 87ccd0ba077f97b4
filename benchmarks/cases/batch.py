"""Batched EAGLE-3 decoding (eaglekit.decoding.engine.BatchEngine, what `eaglekit serve` runs).

    batch-cycles   per batch size, the plain batched step and the batched cycle of the chain (3,1,4) and of its
                   shorter prefixes (the draft lengths the engine's policy picks from), each its CUDA graphs
                   replayed, at the 8B shape (random bf16 weights; `tiny=true`: a tiny float32 shape, runs on a CPU).
                   Output tok/s with the draft is REPLAYED at `accept_length` (default the demo pair's 2.79 for
                   (3,1,4); each position accepted at the rate that gives it, so a prefix of j accepts
                   1 + r + ... + r^j): B x accept / cycle; without: B / step. `speedup_replayed`: the whole chain;
                   `speedup_policy`: the best length at that batch size (what the policy runs once it has timed
                   them). SGLang's published ratios beside them. The invariant products run once per `gemm_tiles`
                   (16-row tiles a program, invariant_gemm.SHARED_TILES); `*_step_cost_b*`, `*_cycle_cost_b*`: their
                   step and cycle over cuBLAS's (what batch invariance costs).
    batch-demo     the shipped pair through BatchEngine at batch 1, 4, 8: tok/s with and without the draft, greedy
                   outputs identical, tokens per CPU-second too (on a loaded CPU, wall time measures the neighbours).
    policy-burst   the policy after a burst of load: one request at a time through BatchEngine (as `serve` at
                   concurrency 1), the first `burst` requests of each pass under `hogs` busy processes, then `timed`
                   requests on the quiet machine; tok/s of those over no draft's (per wall and per CPU second), and
                   the share of their steps that were cycles. A losing draft must be off once the load is gone
                   (adaptive.SpecPolicy's plain probes).
"""

from __future__ import annotations

import functools
import gc
import time

import torch

from ..registry import as_list, case, suite
from ..schema import stats, value
from ..timing import StoodRows, samples_ms

# SGLang's published EAGLE-3 speedups over no draft (chain of 3, H100), by batch size
SGLANG = {2: 1.81, 4: 1.82, 8: 1.62, 16: 1.48, 24: 1.39, 32: 1.32, 64: 1.38}


def build_pair(tiny: bool, device: str):
    from eaglekit.capture import CaptureSpec
    from eaglekit.draft.model import DraftConfig, Eagle3Draft
    from eaglekit.models.config import parse_target_config
    from eaglekit.models.llama import LlamaModel, LlamaTarget
    from eaglekit.train.pretrain import LlamaShape, llama_config

    if tiny:
        V, H, L, heads, kvh, inter, Vd, dtype = 512, 64, 4, 4, 2, 128, 256, torch.float32
    else:
        V, H, L, heads, kvh, inter, Vd, dtype = 128256, 4096, 32, 32, 8, 14336, 32000, torch.bfloat16
    raw = llama_config(LlamaShape(V, H, L, heads, kvh, inter), max_pos=8192, tie=False, eos_id=V - 1)
    raw["rope_theta"] = 500000.0
    cfg = parse_target_config(raw)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # built in place: no float32 copy of 8B parameters on the way
            net = LlamaModel(cfg)
            dcfg = DraftConfig(hidden_size=H, intermediate_size=inter, num_heads=heads, num_kv_heads=kvh,
                               vocab_size=V, draft_vocab_size=Vd, rope=cfg.rope, capture=CaptureSpec.default(L),
                               max_position_embeddings=8192)
            d = Eagle3Draft(dcfg)
    finally:
        torch.set_default_dtype(torch.float32)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for w in list(net.parameters()) + list(d.parameters()):
            w.normal_(0, 0.02, generator=g)  # timing does not depend on the values, but never time zeros
        d.embed_tokens.weight.copy_(net.model.embed_tokens.weight)
        d.d2t.copy_(torch.arange(Vd, device=device) * (V // Vd) - torch.arange(Vd, device=device))
        d.t2d.zero_()
        d.t2d[torch.arange(Vd, device=device) * (V // Vd)] = True
    t = LlamaTarget(net, device, dtype)
    t.fuse()
    d.fuse()
    return t, d, raw


@case("batch-cycles", "batched step and cycle per batch size and draft length (chain (3,1,4) and its prefixes), "
      "replayed tok/s and speedup",
      defaults={"tiny": False, "sizes": [1, 2, 4, 8, 16, 32, 64], "context": 512, "max_new": 256, "reps": 30,
                "accept_length": 2.79, "products": ["aten", "invariant"], "gemm_tiles": [1]},
      quick={"sizes": [1, 8, 64], "reps": 10})
@torch.inference_mode()  # the engine's state tensors are inference tensors
def batch_cycles(p, ctx):
    from eaglekit.decoding.accept import synthetic_rate
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.kernels import invariant_gemm

    cuda = torch.cuda.is_available() and not p["tiny"]
    if not cuda and not p["tiny"]:
        raise RuntimeError("the 8B shape needs a CUDA GPU; on a CPU pass --param tiny=true")
    device = "cuda" if cuda else "cpu"
    context = min(p["context"], 64) if p["tiny"] else p["context"]
    rate = synthetic_rate(p["accept_length"], 3)
    t, d, raw = build_pair(p["tiny"], device)
    metrics, rows = {}, []
    g = torch.Generator().manual_seed(1)
    sizes = as_list(p["sizes"])
    kinds = [k for k in as_list(p["products"]) if cuda or k in ("aten", "onednn")]
    # the invariant products once per gemm_tiles (invariant_gemm.SHARED_TILES: 16-row tiles a program)
    runs = [(k, tl) for k in kinds for tl in (as_list(p["gemm_tiles"]) if k == "invariant" else [None])]
    shared = invariant_gemm.SHARED_TILES
    for (kind, tiles), B in [(r, b) for r in runs for b in sizes]:
        if tiles is not None:
            invariant_gemm.SHARED_TILES = tiles  # (kernels() names a new op for it)
        t.set_products(kind)  # aten: F.linear (cuBLAS); invariant: what serve runs in bf16 (batch-invariant)
        prompts = [torch.randint(0, raw["vocab_size"] - 1, (context,), generator=g) for _ in range(B)]
        stood = StoodRows(t, d, TreeShape(3, 1, 4), prompts, graphs=cuda, max_new=p["max_new"], spec_max_batch=B)
        base = stats(samples_ms(stood.step, p["reps"], cuda=cuda, before=stood.restore), "ms")
        sfx = ("" if kind == "aten" else f"_{kind}") + (f"_t{tiles}" if tiles not in (None, 1) else "")
        metrics[f"step_ms_b{B}{sfx}"] = base
        row = {"products": kind, "gemm_tiles": tiles, "batch": B, "step_ms": base["median"],
               "sglang_speedup": SGLANG.get(B)}
        best = (0.0, None)
        for j, shape in sorted(stood.engine.shapes.items(), reverse=True):
            stood.rows(shape)  # records this length's graphs (GPU), outside the timed span
            cycle = functools.partial(stood.cycle, shape)
            cyc = stats(samples_ms(cycle, p["reps"], cuda=cuda, before=stood.restore), "ms")
            accept = sum(rate ** i for i in range(j + 1))  # this prefix's accept length at the same per-position rate
            speedup = accept * base["median"] / cyc["median"]
            name = f"b{B}{sfx}" if j == 3 else f"b{B}_len{j}{sfx}"
            metrics[f"cycle_ms_{name}"] = cyc
            metrics[f"speedup_replayed_{name}"] = value(speedup, "x")
            row[f"cycle_ms_len{j}"] = cyc["median"]
            row[f"speedup_len{j}"] = round(speedup, 3)
            best = max(best, (speedup, j))
        metrics[f"policy_length_b{B}{sfx}"] = value(best[1], "draft tokens")
        row.update(cycle_ms=row["cycle_ms_len3"], speedup_replayed=row["speedup_len3"],
                   speedup_policy=round(best[0], 3), policy_length=best[1])
        rows.append(row)
        del stood
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    invariant_gemm.SHARED_TILES = shared  # (as it was: a later case of the run sees the process's setting)
    for B in sizes:  # what batch invariance costs: the invariant kernels' step and cycle over cuBLAS's, per batch size
        for sfx in ["_invariant"] + [f"_invariant_t{x}" for x in as_list(p["gemm_tiles"]) if x != 1]:
            if f"step_ms_b{B}{sfx}" in metrics and f"step_ms_b{B}" in metrics:
                metrics[f"{sfx[1:]}_step_cost_b{B}"] = value(metrics[f"step_ms_b{B}{sfx}"]["median"] /
                                                             metrics[f"step_ms_b{B}"]["median"], "x")
                metrics[f"{sfx[1:]}_cycle_cost_b{B}"] = value(metrics[f"cycle_ms_b{B}{sfx}"]["median"] /
                                                              metrics[f"cycle_ms_b{B}"]["median"], "x")
    return {"metrics": metrics,
            "details": {"shape": "tiny" if p["tiny"] else "llama-3.1-8b", "dtype": str(t.dtype), "tree": [3, 1, 4],
                        "rate_per_position": round(rate, 4),
                        "device": torch.cuda.get_device_name() if cuda else "cpu", "rows": rows, "context": context}}


def _demo_pair(device: str, products="auto"):
    """-> (the shipped target, its draft, an untrained draft wired as it is, the demo prompts' ids), for the engine:
    float32 (identical greedy outputs with and without a draft are then a real check), uncompiled, as `serve`. The
    untrained draft (new_draft seed 7) is what the adaptive policy must switch off."""
    from eaglekit.demo import ASSETS
    from eaglekit.draft import new_draft
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    # (outside inference mode: oneDNN's packs keep the weights' version counters)
    with torch.inference_mode(False):
        t, d = load_pair(ASSETS / "target", ASSETS / "draft", device=device, dtype="float32",
                         run=PairRuntime(compile="off", products=products, batched=True))
        rand = new_draft(t, seed=7, dtype=torch.float32, capture=d.config.capture).to(device)
    tok = load_tokenizer(ASSETS / "target")
    return t, d, rand, [encode(tok, x) for x in read_prompts(ASSETS / "prompts.jsonl")]


@case("batch-demo", "the shipped pair through BatchEngine at batch 1, 4, 8: tok/s with and without the draft, identity",
      defaults={"sizes": [1, 4, 8], "new_tokens": 48, "waves": 2, "products": "auto", "threads": None,
                "variants": ["draft", "draft_always", "random_draft"], "reps": 3, "warm_up": True},
      quick={"sizes": [1, 4], "new_tokens": 24, "waves": 1, "reps": 1})
@torch.inference_mode()  # (the pair loads outside it: _demo_pair)
def batch_demo(p, ctx):
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request

    if p["threads"]:
        torch.set_num_threads(p["threads"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t, d, rand, prompts = _demo_pair(device, p["products"])
    # draft: the trained draft, speculation when it pays (the default); draft_always: speculation on every step
    kinds = {"draft": (d, True), "draft_always": (d, False), "random_draft": (rand, True)}
    variants = [v for v in as_list(p["variants"]) if v in kinds]
    metrics, identity = {}, {}
    sizes = as_list(p["sizes"])
    for B in sizes:
        names = variants + ["no_draft"]
        engines = {v: BatchEngine(t, kinds[v][0], EngineOptions(max_batch=B, spec_max_batch=B, adaptive=kinds[v][1]))
                   for v in variants}
        engines["no_draft"] = BatchEngine(t, None, EngineOptions(max_batch=B, spec_max_batch=B))
        if p["warm_up"]:  # as `eaglekit serve` does before it listens: graphs and the policy's timings per size
            span = max(len(x) for x in prompts) + p["new_tokens"] + 8
            for eng in engines.values():
                eng.warm_up(span)
        runs: dict[str, list[dict]] = {v: [] for v in names}
        # ratios side by side: a warm pass each, then `reps` passes with the order rotating, medians of each
        for r in range(1 + p["reps"]):
            for v in names[r % len(names):] + names[:r % len(names)]:
                eng = engines[v]
                got: dict[str, list[int]] = {}
                for i in range(B * p["waves"]):
                    eng.add(Request(f"r{i}", prompts[i % len(prompts)], p["new_tokens"], eos_ids=()))
                st0 = dict(eng.spec_stats)
                t0, c0 = time.perf_counter(), time.process_time()
                while eng.has_work:
                    for ev in eng.step():
                        got.setdefault(ev.rid, []).extend(ev.token_ids)
                if device == "cuda":
                    torch.cuda.synchronize()
                dt, cpu = time.perf_counter() - t0, time.process_time() - c0
                if r == 0:
                    continue
                ntok = sum(len(x) for x in got.values())
                st = {k: eng.spec_stats[k] - st0[k] for k in ("num_drafts", "num_accepted_tokens", "spec_cycles",
                                                             "plain_steps")}
                runs[v].append({"tok_s": ntok / dt, "tok_cpu_s": ntok / cpu, "outputs": got, **st})
        base = [x["tok_s"] for x in runs["no_draft"]]
        base_cpu = [x["tok_cpu_s"] for x in runs["no_draft"]]
        metrics[f"tokens_per_s_b{B}_no_draft"] = stats(base, "tok/s")
        for v in variants:
            sfx = "" if v == "draft" else f"_{v}"
            rs = runs[v]
            metrics[f"tokens_per_s_b{B}{sfx or '_draft'}"] = stats([x["tok_s"] for x in rs], "tok/s")
            # each pass over the no-draft pass of the same round
            metrics[f"speedup_b{B}{sfx}"] = stats([x["tok_s"] / b for x, b in zip(rs, base)], "x")
            metrics[f"speedup_cpu_time_b{B}{sfx}"] = stats([x["tok_cpu_s"] / b for x, b in zip(rs, base_cpu)], "x")
            metrics[f"spec_cycles_b{B}{sfx}"] = stats([x["spec_cycles"] for x in rs], "cycles")
            metrics[f"plain_steps_b{B}{sfx}"] = stats([x["plain_steps"] for x in rs], "steps")
            drafts = sum(x["num_drafts"] for x in rs)
            if drafts:
                metrics[f"accept_length_b{B}{sfx}"] = value(1 + sum(x["num_accepted_tokens"] for x in rs) / drafts,
                                                            "tokens/verify")
            identity[f"outputs_identical_b{B}{sfx}"] = all(x["outputs"] == b["outputs"]
                                                          for x, b in zip(rs, runs["no_draft"]))
    return {"metrics": metrics, "identity": identity,
            "details": {"device": device, "dtype": "float32", "threads": torch.get_num_threads(),
                        "products": str(getattr(t, "products_choice", None))}}


@case("policy-burst", "one request at a time through the engine after a burst of load: each draft's tok/s over no "
      "draft's on the quiet machine, and the share of its steps that were cycles",
      defaults={"burst": 6, "timed": 10, "hogs": 2, "new_tokens": 128, "reps": 3, "max_batch": 1,
                "variants": ["draft", "random_draft"]},
      quick={"burst": 3, "timed": 3, "new_tokens": 48, "reps": 1})
@torch.inference_mode()  # (the pair loads outside it: _demo_pair)
def policy_burst(p, ctx):
    import subprocess
    import sys

    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t, d, rand, prompts = _demo_pair(device)
    drafts = {"no_draft": None, "draft": d, "random_draft": rand}
    names = ["no_draft"] + [v for v in as_list(p["variants"]) if v in drafts and v != "no_draft"]
    # one engine per variant for the whole run: the policy's figures carry from pass to pass, as a server's do
    engines = {v: BatchEngine(t, drafts[v], EngineOptions(max_batch=p["max_batch"])) for v in names}
    for eng in engines.values():
        eng.warm_up(max(len(x) for x in prompts) + p["new_tokens"] + 8)

    def requests(eng, start, n):
        ntok = 0
        for i in range(start, start + n):
            eng.add(Request(f"r{i}", prompts[i % len(prompts)], p["new_tokens"]))
            while eng.has_work:
                ntok += sum(len(ev.token_ids) for ev in eng.step())
        return ntok

    runs: dict[str, list[dict]] = {v: [] for v in names}
    for r in range(p["reps"]):
        for v in names[r % len(names):] + names[:r % len(names)]:
            eng = engines[v]
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(p["hogs"])]
            try:
                requests(eng, 0, p["burst"])
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            st0 = dict(eng.spec_stats)
            t0, c0 = time.perf_counter(), time.process_time()
            ntok = requests(eng, p["burst"], p["timed"])
            if device == "cuda":
                torch.cuda.synchronize()
            steps = {k: eng.spec_stats[k] - st0[k] for k in ("spec_cycles", "plain_steps")}
            runs[v].append({"tok_s": ntok / (time.perf_counter() - t0), "tok_cpu_s": ntok / (time.process_time() - c0),
                            **steps})
    metrics = {"tokens_per_s_no_draft": stats([x["tok_s"] for x in runs["no_draft"]], "tok/s")}
    for v in names[1:]:
        rs = runs[v]
        metrics[f"tokens_per_s_{v}"] = stats([x["tok_s"] for x in rs], "tok/s")
        metrics[f"speedup_{v}"] = stats([x["tok_s"] / b["tok_s"] for x, b in zip(rs, runs["no_draft"])], "x")
        # tokens per CPU-second of the process: less of what a neighbour does to the wall clock (batch-demo's too)
        metrics[f"speedup_cpu_time_{v}"] = stats([x["tok_cpu_s"] / b["tok_cpu_s"]
                                                  for x, b in zip(rs, runs["no_draft"])], "x")
        metrics[f"cycle_share_{v}"] = stats([x["spec_cycles"] / max(1, x["spec_cycles"] + x["plain_steps"])
                                             for x in rs], "of steps")
    return {"metrics": metrics,
            "details": {"device": device, "dtype": "float32", "threads": torch.get_num_threads(),
                        "passes": {v: [{k: round(x[k], 2) if isinstance(x[k], float) else x[k] for k in x}
                                       for x in runs[v]] for v in names},
                        "policy": {v: e.policy.summary() for v, e in engines.items() if e.policy is not None}}}


suite("h200-batch", "batched decoding: the 8B shape's batched step and cycle per batch size, the demo pair batched",
      ["batch-cycles", "batch-demo"])
suite("cpu-batch", "the demo pair through the batched engine on this machine", ["batch-demo"])
suite("cpu-policy-burst", "the adaptive policy on this machine after a burst of load (one request at a time)",
      ["policy-burst"])
