"""`eaglekit serve` end to end under `eaglekit bench` (a client in its own process), at the Llama-3.1-8B shape with
random bf16 weights on a GPU (`tiny=true`: a tiny float32 shape on a CPU).

    serve-e2e   output tok/s, TTFT, TPOT per concurrency level, with the draft (acceptance SYNTHETIC: each position
                of the tree's top-1 branch accepted at the rate that gives `accept_length`, SGLang's published 3.52
                for (5,1,6) on Llama-3.1-8B) and without it, the same server code, one process each variant.

Random weights accept nothing, so the draft's figures here measure the serving machinery at a given accept length:
every result of this case says so (`details.synthetic_acceptance`). Prompts are `prompt_len` random words of a
word-level tokenizer over the whole vocabulary (the server detokenizes what it sends, as with a real tokenizer).
Every padded batch size's graphs are recorded before the clock starts (a warm-up wave per size).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from ..registry import as_list, case, suite
from ..schema import value
from .batch import build_pair


def word_tokenizer(vocab: int):
    """A word-level tokenizer whose token i is the word "t{i}" (every id decodes: the server can stream anything)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0")


def _serve(engine, tok, context, max_batch):
    import uvicorn

    from eaglekit.serve.app import build_app

    info = {"synthetic_acceptance": None if engine.synthetic is None else {"rate": engine.synthetic}}
    app = build_app(engine, tok, ["bench"], context, max_batch, 1024, info=info, speculative=engine.draft is not None,
                    positions=engine.shape.path_len - 1)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    while not srv.started:
        time.sleep(0.05)
    return srv, th, srv.servers[0].sockets[0].getsockname()[1]


def _warm(engine, sizes, prompt_len, max_tokens, vocab):
    """One wave of B requests per padded size (as long as the bench's): every graph and span recorded before timing."""
    from eaglekit.decoding.batch import Request

    rng = random.Random(5)
    for B in sizes:
        for i in range(B):
            engine.add(Request(f"w{B}-{i}", [rng.randrange(vocab) for _ in range(prompt_len)], max_tokens,
                               eos_ids=()))
        while engine.has_work:
            engine.step()


@case("serve-e2e", "serve + bench end to end per concurrency, draft (synthetic acceptance) and no draft",
      defaults={"tiny": False, "shape": [5, 1, 6], "accept_length": 3.52, "concurrency": [1, 4, 16, 64],
                "requests_per_level": 2, "min_requests": 8, "max_tokens": 128, "prompt_len": 128, "max_seconds": 60},
      quick={"concurrency": [1, 16], "max_tokens": 64, "min_requests": 4})
def serve_e2e(p, ctx):
    from eaglekit.decoding.batch import BatchEngine
    from eaglekit.decoding.tree import TreeShape

    cuda = torch.cuda.is_available() and not p["tiny"]
    if not cuda and not p["tiny"]:
        raise RuntimeError("the 8B shape needs a CUDA GPU; on a CPU pass --param tiny=true")
    device = "cuda" if cuda else "cpu"
    t, d, raw = build_pair(p["tiny"], device)
    if cuda:
        from eaglekit.pair import set_pair_products

        set_pair_products(t, d, "auto", device, batched=True)  # what serve does: batch-invariant products
    V = raw["vocab_size"]
    tok = word_tokenizer(V)
    shape = TreeShape(*as_list(p["shape"]))
    conc = as_list(p["concurrency"])
    max_batch = max(conc)
    sizes = sorted({min(1 << (c - 1).bit_length(), max_batch) for c in conc} | {1})
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": " ".join(f"t{rng.randrange(V)}" for _ in
                                                                   range(p["prompt_len"]))}) + "\n"
                                   for _ in range(64)))
        metrics, levels_out = {}, {}
        for name, draft in (("draft", d), ("no_draft", None)):
            eng = BatchEngine(t, draft, shape, max_batch=max_batch, tokenizer=tok, graphs=cuda,
                              synthetic_accept_length=p["accept_length"] if draft is not None else None)
            _warm(eng, sizes, p["prompt_len"], p["max_tokens"], V)
            srv, th, port = _serve(eng, tok, raw["max_position_embeddings"], max_batch)
            out = Path(tmp) / f"{name}.json"
            try:
                n = max(p["min_requests"], p["requests_per_level"] * max(conc))
                cmd = [sys.executable, "-m", "eaglekit.cli", "bench", "--endpoint", f"http://127.0.0.1:{port}",
                       "--prompts", str(prompts), "--max-tokens", str(p["max_tokens"]), "--num-prompts", str(n),
                       "--ignore-eos", "--max-seconds", str(p["max_seconds"]), "--json", str(out),
                       "--concurrency", ",".join(str(c) for c in conc)]
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
                        "products": str(getattr(t, "products_choice", None)),
                        "device": torch.cuda.get_device_name() if cuda else "cpu", "levels": levels_out}}


suite("h200-serve", "eaglekit serve + eaglekit bench at the 8B shape, synthetic acceptance 3.52 for (5,1,6)",
      ["serve-e2e"], needs="cuda")
suite("cpu-serve", "the serve-e2e machinery on a tiny float32 shape on this machine (the CPU check of h200-serve)",
      [("serve-e2e", {"tiny": True, "prompt_len": 16, "max_tokens": 32, "concurrency": [1, 4]})])
