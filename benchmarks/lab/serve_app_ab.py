"""The HTTP layer's own cost per streamed step: the serve app of a git revision against the working tree's, both
over one engine of the tiny float32 shape (4 layers, hidden 64: its step is a fraction of a millisecond, so what the
app does per step shows), one request at a time, in alternating rounds.

    python benchmarks/lab/serve_app_ab.py --base HEAD [--rounds 8] [--requests 24] [--tokens 96] [--out DIR]

Per variant (`base`: eaglekit/serve/app.py as of --base, loaded as a module of its own; `tree`: the working tree's)
and per engine (with the draft at SYNTHETIC acceptance 3.52 for (5,1,6), and without): eaglekit bench's TPOT, TTFT
and output tok/s, medians over the rounds and each round's tok/s. The engine uses one torch thread (the bench client
and the server's threads share the machine's cores). Writes DIR/serve_app_ab.json (schema eaglekit-lab/1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.cases.batch import build_pair  # noqa: E402
from benchmarks.cases.serve import _serve, _warm, bench_command, word_prompts, word_tokenizer  # noqa: E402
from benchmarks.schema import cpu_name, git_sha  # noqa: E402


def app_module(rev: str, tmp: Path):
    """eaglekit/serve/app.py as of `rev`, imported under a name of its own (its relative imports resolve in the
    installed package)."""
    src = subprocess.run(["git", "show", f"{rev}:eaglekit/serve/app.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    path = tmp / "app_base.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("eaglekit.serve.app_base", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--out", default="./out")
    a = ap.parse_args()
    import eaglekit.serve.app as tree_app
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine
    from eaglekit.decoding.tree import TreeShape

    torch.set_num_threads(1)
    t, d, raw = build_pair(True, "cpu")
    V = raw["vocab_size"]
    tok = word_tokenizer(V)
    rng = random.Random(0)
    runs: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        apps = {"base": app_module(a.base, tmp), "tree": tree_app}
        prompts = word_prompts(tmp / "prompts.jsonl", V, a.requests, a.prompt_len, rng)
        for name, draft in (("draft", d), ("no_draft", None)):
            opts = EngineOptions(shape=TreeShape(5, 1, 6), max_batch=1,
                                 synthetic_accept_length=3.52 if draft is not None else None)
            eng = BatchEngine(t, draft, opts, tokenizer=tok)
            _warm(eng, [1], a.prompt_len, a.tokens, V)
            # two apps over one engine, each with its scheduler thread: only the one under load steps it
            servers = {v: _serve(eng, tok, raw["max_position_embeddings"], 1, build_app=m.build_app)
                       for v, m in apps.items()}
            try:
                for r in range(a.rounds):
                    for v in (("base", "tree") if r % 2 else ("tree", "base")):
                        out = tmp / "bench.json"
                        subprocess.run(bench_command(servers[v][2], prompts, a.tokens, a.requests, out, 1),
                                       capture_output=True, check=True)
                        lv = json.loads(out.read_text())["levels"][0]
                        runs.setdefault(name, {}).setdefault(v, []).append(
                            [round(lv["tpot_ms"]["median"], 4), round(lv["ttft_ms"]["median"], 3),
                             round(lv["output_throughput"], 1)])
            finally:
                for srv, th, _ in servers.values():
                    srv.should_exit = True
                    th.join(30)
    summary = {name: {v: {"tpot_ms_median": statistics.median(x[0] for x in rows),
                          "ttft_ms_median": statistics.median(x[1] for x in rows),
                          "output_tok_s_median": statistics.median(x[2] for x in rows)}
                      for v, rows in by.items()} for name, by in runs.items()}
    for name, by in summary.items():
        for v, s in by.items():
            print(f"{name:9s} {v:5s} TPOT {s['tpot_ms_median']:.3f} ms  TTFT {s['ttft_ms_median']:.2f} ms  "
                  f"{s['output_tok_s_median']:.1f} tok/s")
    res = {"schema": "eaglekit-lab/1", "date": time.strftime("%Y-%m-%d"),
           "machine": f"cpu ({cpu_name()}, {torch.get_num_threads()} torch thread), torch {torch.__version__}",
           "commit": git_sha(),
           "command": "python benchmarks/lab/serve_app_ab.py " + " ".join(sys.argv[1:]),
           "what": f"serve app of {a.base} ('base') against the working tree's ('tree') over one tiny-shape engine, "
                   f"concurrency 1, {a.requests} requests x {a.tokens} tokens a round, {a.rounds} rounds alternating "
                   "which goes first; draft figures at SYNTHETIC acceptance 3.52",
           "columns": ["tpot_ms_median", "ttft_ms_median", "output_tok_s"], "runs": runs, "summary": summary}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_app_ab.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
