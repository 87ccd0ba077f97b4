"""The demo pair at two commits side by side: whether a change that should not move behaviour moved it.

    git worktree add /tmp/before d6e9d2c
    python -m benchmarks run cpu-before-after --param before=/tmp/before [--param rounds=3]

On a lent GPU (gpu-before-after: bf16 on CUDA) the other checkout travels as code alone, the demo pair's weights
being the same files (benchmarks/device.sh carries it with the serving wheels: run(carry=[".whl", ".before"])):

    # here: the commit's code, named in COMMIT (schema.git_head reads it)
    mkdir .before && git archive d6e9d2c -- . ':!eaglekit/assets' ':!benchmarks/results' | tar -x -C .before
    echo d6e9d2c > .before/COMMIT
    # there: the shipped pair under it, then the suite
    mkdir -p .before/eaglekit/assets && ln -s ../../../eaglekit/assets/demo .before/eaglekit/assets/demo
    bash benchmarks/device.sh gpu-before-after --param before=.before

Each checkout runs in processes of its own (PYTHONPATH = the checkout), the two taking turns round by round:

- greedy token ids of the demo's held-out prompts, the target alone and with the draft at (5,1,6), through each
  checkout's own Decoder: identical or not, per prompt (once: greedy output does not change between rounds);
- `eaglekit demo --json` once per checkout a round: its speedup and tokens/s both ways, after / before per round, and
  the rounds whose demo found its outputs with and without the draft identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..registry import case, suite
from ..schema import ROOT, git_head, stats, value

# greedy token ids of the demo prompts through the checkout's own Decoder (its module moved between commits)
_OUTPUTS = """
import json, sys
from eaglekit.demo import demo_paths
from eaglekit.pair import load_pair
from eaglekit.tokenizer import encode, load_tokenizer, read_prompts
from eaglekit.decoding.tree import TreeShape
try:
    from eaglekit.decoding.decoder import Decoder
except ImportError:
    from eaglekit.decoding.engine import Decoder
n, new, device, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
tdir, ddir, pfile = demo_paths()
tok = load_tokenizer(tdir)
ids = [encode(tok, p) for p in read_prompts(pfile)[:n]]
t, d = load_pair(tdir, ddir, device=device, dtype=None if dtype == "auto" else dtype)
dec = Decoder(t, d, TreeShape(5, 1, 6))
print(json.dumps({"baseline": [dec.generate(p, new, baseline=True).token_ids for p in ids],
                  "draft": [dec.generate(p, new).token_ids for p in ids]}))
"""
DEMO_KEYS = ("speedup", "eagle_tokens_per_s", "baseline_tokens_per_s")


def _run(tree: Path, args: list[str], ok: tuple[int, ...] = (0,)) -> str:
    """args run by this Python with `tree` on the path -> its stdout; an exit status outside `ok` raises."""
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}
    p = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode not in ok:
        raise RuntimeError(f"{tree}: {' '.join(args[:3])} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


@case("before-after", "the demo pair at this checkout and at `before` (another checkout): greedy output identical or "
      "not, and eaglekit demo's speedup and tokens/s, the two in turns",
      defaults={"before": None, "rounds": 3, "prompts": 32, "max_new_tokens": 128, "device": "cpu", "dtype": "auto"},
      quick={"rounds": 1, "prompts": 4, "max_new_tokens": 32})
def before_after(p, ctx):
    if not p["before"]:
        raise ValueError("before-after needs --param before=PATH (a checkout of the commit to compare with)")
    trees = {"before": Path(p["before"]).resolve(), "after": ROOT}
    outs = {k: json.loads(_run(t, ["-c", _OUTPUTS, str(p["prompts"]), str(p["max_new_tokens"]), p["device"],
                                   p["dtype"]]).strip().splitlines()[-1]) for k, t in trees.items()}
    metrics = {f"identical_{m}": value(sum(x == y for x, y in zip(outs["before"][m], outs["after"][m])), "prompts")
               for m in ("baseline", "draft")}
    flags = ["--device", p["device"], "--prompts", str(p["prompts"]), "--json"]
    flags += [] if p["dtype"] == "auto" else ["--dtype", p["dtype"]]
    rounds: dict[str, list[dict]] = {k: [] for k in trees}
    for r in range(p["rounds"]):
        for k in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            # (the demo exits 1 where its outputs with and without the draft differ: a figure to keep, not a crash)
            res = json.loads(_run(trees[k], ["-m", "eaglekit", "demo", *flags], ok=(0, 1)))
            rounds[k].append({m: res[m] for m in (*DEMO_KEYS, "identical")})
    for k, rs in rounds.items():
        metrics[f"demo_identical_{k}"] = value(sum(bool(x["identical"]) for x in rs), "rounds")
        metrics[f"speedup_{k}"] = stats([x["speedup"] for x in rs], "x")
        metrics[f"eagle_tok_s_{k}"] = stats([x["eagle_tokens_per_s"] for x in rs], "tok/s")
        metrics[f"baseline_tok_s_{k}"] = stats([x["baseline_tokens_per_s"] for x in rs], "tok/s")
    metrics["eagle_tok_s_after_over_before"] = stats(
        [a["eagle_tokens_per_s"] / b["eagle_tokens_per_s"] for a, b in zip(rounds["after"], rounds["before"])], "x")
    return {"metrics": metrics,
            "details": {"commits": {k: git_head(t) for k, t in trees.items()}, "prompts": p["prompts"],
                        "rounds": rounds}}


suite("cpu-before-after", "the demo pair at this checkout beside another (--param before=PATH) on this machine",
      ["before-after"])
suite("gpu-before-after", "the same on one GPU in bf16 (greedy bf16 output bit-identical or not, demo speedups)",
      [("before-after", {"device": "cuda", "dtype": "bfloat16"})], needs="cuda")
