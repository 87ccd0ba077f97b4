"""Where an engine with a draft loses to one without, below the server (no HTTP, no scheduler thread): the shipped
target with no draft, an untrained draft under the adaptive policy, the same draft held to plain steps (what carrying
a draft costs a plain step), and the shipped draft; one request at a time (concurrency 1), the engine built as
`eaglekit serve` builds it (load_pair, BatchEngine, warm_up). Every engine is built first; then `--rounds` rounds each
run every variant over the prompts in turn (the order rotated), so that each round's ratio to no draft compares runs
minutes apart at most (separate processes of one variant differ by up to 8% on a GPU: the plain step's median
0.407-0.440 ms in benchmarks/results/2026-12-05h_h100_engine_gap*.json).

    python benchmarks/lab/engine_gap.py [--prompts 16] [--max-tokens 128] [--max-batch 4] [--rounds 3]
                                        [--prompt-graphs] [--trace-catch-up] [--scheduler]
                                        [--variants no_draft,random_draft,random_pinned,draft] [--out DIR]

With `--scheduler` the requests go through the server's Scheduler (its engine thread, and an asyncio loop consuming
each request's events, as `eaglekit serve` runs them less HTTP), to tell the engine's cost from the server's.

Per variant, in DIR/engine_gap.json: tokens/s per round and their median, each round's ratio to no draft and its
median; the steps by kind over all rounds (a prefill, a plain step, a cycle in a run of cycles,
the first cycle after plain steps, which carries the draft's catch-up) with count, total and median wall ms, each step
ending at its one host read; the catch-ups' count and wall ms with the device synchronized around each (their true
cost); the policy's summary; and the host's top functions by own time from cProfile over a second, shorter pass.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _prompts(tok, n: int) -> list[list[int]]:
    """The demo's held-out prompts, tokenized as the demo does, repeated to `n`."""
    from eaglekit.demo import ASSETS
    from eaglekit.tokenizer import encode, read_prompts

    texts = read_prompts(ASSETS / "prompts.jsonl")
    return [encode(tok, texts[i % len(texts)]) for i in range(n)]


def _engine(variant: str, draft_dir, device: str, max_batch: int, prompt_graphs: bool):
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import load_tokenizer

    tok = load_tokenizer(ASSETS / "target")
    shape = TreeShape.make()  # (serve's default, and the rows its products are chosen for: serve.server.serve)
    target, draft = load_pair(ASSETS / "target", draft_dir, "auto", device, None,
                              run=PairRuntime(compile="off", batched=max_batch > 1, prompt_graphs=prompt_graphs,
                                              rows=max_batch * (shape.draft_tokens if draft_dir else 1)))
    eng = BatchEngine(target, draft, EngineOptions(shape=shape, max_batch=max_batch), tokenizer=tok)
    if variant == "random_pinned":  # the draft carried (features kept per plain step), never run
        eng.policy.choose = lambda rows, drafting=1.0: (0, "held to plain steps")
    t0 = time.perf_counter()
    eng.warm_up(512)
    return eng, tok, time.perf_counter() - t0


def _timed_steps(eng) -> dict:
    """Wrap eng.step to time each step by kind (a prefill, a plain step, a cycle in a run of cycles, the first cycle
    after plain steps) into rec["times"] while it is a dict (None: not recorded); works on whichever thread steps."""
    inner, st, rec = eng.step, eng.spec_stats, {"times": None, "last": "prefill"}

    def step():
        before = (st["plain_steps"], st["spec_cycles"])
        t0 = time.perf_counter()
        events = inner()
        dt = time.perf_counter() - t0
        if (st["plain_steps"], st["spec_cycles"]) == before:
            kind = "prefill"
        elif st["plain_steps"] > before[0]:
            kind = "plain"
        else:
            kind = "cycle_after_plain" if rec["last"] == "plain" else "cycle"
        rec["last"] = kind if kind != "prefill" else rec["last"]
        if rec["times"] is not None:
            rec["times"].setdefault(kind, []).append(dt)
        return events
    eng.step = step
    return rec


def _pass(eng, prompts, max_tokens: int, sync, scheduler: bool) -> int:
    """Every prompt one after another, stepped here or (`scheduler`) through the server's Scheduler: its engine thread
    and an asyncio loop here consuming each request's events, as `eaglekit serve` runs them (less HTTP). -> tokens."""
    from eaglekit.decoding.engine import Request

    reqs = [Request(f"r{i}", ids, max_tokens, eos_ids=()) for i, ids in enumerate(prompts)]
    tokens = 0
    if not scheduler:
        for r in reqs:
            eng.add(r)
            while eng.has_work:
                tokens += sum(len(e.token_ids) for e in eng.step())
    else:
        import asyncio

        from eaglekit.serve.metrics import ServerMetrics
        from eaglekit.serve.scheduler import Scheduler

        m = ServerMetrics("engine_gap", eng.draft is not None, eng.shape.steps if eng.draft is not None else 0)
        sched = Scheduler(eng, m, eng.max_batch, 4)

        async def run():
            n = 0
            sched.start()
            for r in reqs:
                async for ev in sched.submit(r):
                    n += len(ev.token_ids)
            await sched.close()
            return n
        tokens = asyncio.run(run())
    sync()
    return tokens


def _timed_catch_up(inner, catch: dict, sync, device: str, trace_one: bool):
    """engine._catch_up with its wall time, the device synchronized around it, added to `catch`; with `trace_one`
    the second one (warm) runs under torch.profiler instead, its tables kept in `catch`."""
    def timed(c):
        sync()
        if trace_one and catch["n"] == 1 and "table" not in catch:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
            with profile(activities=acts) as pr:
                inner(c)
                sync()
            key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
            catch["table"] = pr.key_averages().table(sort_by=key, row_limit=30).splitlines()
            catch["table_cpu"] = pr.key_averages().table(sort_by="self_cpu_time_total", row_limit=20).splitlines()
            return
        t0 = time.perf_counter()
        inner(c)
        sync()
        catch["n"] += 1
        catch["s"] += time.perf_counter() - t0
    return timed


def main(argv=None) -> int:
    import torch

    from benchmarks.cases.serve import demo_drafts
    from benchmarks.schema import git_sha

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--prompt-graphs", action="store_true")
    ap.add_argument("--trace-catch-up", action="store_true", help="torch.profiler tables of one warm catch-up")
    ap.add_argument("--scheduler", action="store_true", help="step through the server's Scheduler (engine thread)")
    ap.add_argument("--variants", default="no_draft,random_draft,random_pinned,draft")
    ap.add_argument("--out", default=os.environ.get("OUT", "./out"))
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {"schema": "eaglekit-lab/1", "what": "engine-level steps by kind, catch-ups and host time per variant, "
           "concurrency 1", "scheduler": a.scheduler, "command": "python benchmarks/lab/engine_gap.py "
           + " ".join(argv if argv is not None else sys.argv[1:]), "commit": git_sha(), "device": device,
           "machine": torch.cuda.get_device_name() if device == "cuda" else "cpu", "variants": {}}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    dest = Path(a.out) / "engine_gap.json"
    with tempfile.TemporaryDirectory() as tmp:
        drafts = demo_drafts(Path(tmp))
        drafts["random_pinned"] = drafts["random_draft"]
        variants = a.variants.split(",")
        run: dict = {}
        for v in variants:  # every engine built and warmed first: the rounds then take turns
            eng, tok, warm = _engine(v, drafts[v], device, a.max_batch, a.prompt_graphs)
            catch = {"n": 0, "s": 0.0}
            if eng.draft is not None:
                eng._catch_up = _timed_catch_up(eng._catch_up, catch, sync, device, a.trace_catch_up)
            prompts = _prompts(tok, a.prompts)
            rec = _timed_steps(eng)
            _pass(eng, prompts[:2], 16, sync, a.scheduler)  # first calls out of the way
            catch.update(n=0, s=0.0)
            catch.pop("table", None)
            run[v] = {"eng": eng, "prompts": prompts, "warm": warm, "catch": catch, "rec": rec, "times": {},
                      "tok_s": [], "st0": {k: x for k, x in eng.spec_stats.items() if isinstance(x, int)}}
        for r in range(a.rounds):  # the variants in turn, the order rotated each round (the machine drifts)
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                x = run[v]
                x["rec"]["times"] = x["times"]
                t0 = time.perf_counter()
                tokens = _pass(x["eng"], x["prompts"], a.max_tokens, sync, a.scheduler)
                x["tok_s"].append(tokens / (time.perf_counter() - t0))
                x["rec"]["times"] = None
        for v in variants:
            x = run[v]
            eng, catch = x["eng"], x["catch"]
            stats = {k: n - x["st0"].get(k, 0) for k, n in eng.spec_stats.items() if isinstance(n, int)}
            prof = cProfile.Profile()
            prof.enable()
            _pass(eng, x["prompts"][:4], a.max_tokens, sync, False)  # (stepped here: cProfile sees this thread)
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
            steps = {k: {"n": len(t), "ms": round(1e3 * sum(t), 3), "median_ms": round(1e3 * statistics.median(t), 4)}
                     for k, t in x["times"].items()}
            res = {"warm_up_s": round(x["warm"], 2), "tok_s_rounds": [round(t, 2) for t in x["tok_s"]],
                   "tok_s": round(statistics.median(x["tok_s"]), 2), "steps": steps,
                   "catch_up": {"n": catch["n"], "ms": round(1e3 * catch["s"], 3),
                                "ms_each": round(1e3 * catch["s"] / catch["n"], 4) if catch["n"] else None,
                                "profile": catch.get("table"), "profile_host": catch.get("table_cpu")},
                   "stats": stats, "policy": eng.policy.summary() if eng.policy is not None else None,
                   "host_top": s.getvalue().splitlines()[:60]}
            if "no_draft" in run:  # each round's ratio to no draft's in the same round, and their median
                res["ratio_rounds"] = [round(t / b, 4) for t, b in zip(x["tok_s"], run["no_draft"]["tok_s"])]
                res["ratio"] = round(statistics.median(res["ratio_rounds"]), 4)
            out["variants"][v] = res
            print(v, json.dumps({k: res.get(k) for k in ("tok_s", "ratio", "ratio_rounds", "steps", "catch_up",
                                                          "stats")}), flush=True)
    dest.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
