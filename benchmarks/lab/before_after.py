"""The demo pair at two commits, side by side: whether a change that should not move behaviour moved it.

    git worktree add /tmp/before d6e9d2c        # the tree to hold this one against
    python benchmarks/lab/before_after.py --before /tmp/before [--rounds 3] [--prompts 32] [--out FILE]
                                          [--device cpu] [--dtype float32] [-- extra eaglekit demo flags]

Two measurements, each tree in processes of its own (PYTHONPATH=the tree), the trees taking turns round by round:

- `outputs`: greedy token ids of the demo's held-out prompts, the target alone and with the draft at (5,1,6),
  through each tree's own Decoder; bit-identical or not, per prompt and mode (first round only: greedy output does
  not change between rounds);
- `demo`: `eaglekit demo --json` (its tokens/s both ways, speedup, accept length, warm-up), one run per tree a round;
  the medians and each round's figures, so a difference can be read against the rounds' spread.

Writes one JSON (schema eaglekit-lab/1) with both commits, the machine and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# greedy token ids of the demo prompts through the tree's own Decoder (its module moved between commits)
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
out = {"baseline": [dec.generate(p, new, baseline=True).token_ids for p in ids],
       "draft": [dec.generate(p, new).token_ids for p in ids]}
print(json.dumps(out))
"""


def _commit(tree: Path) -> str:
    def git(*a):
        return subprocess.run(["git", "-C", str(tree), *a], capture_output=True, text=True).stdout.strip()

    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    return sha + ("" if not git("status", "--porcelain", "--untracked-files=no") else " (dirty)")


def _run(tree: Path, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}
    p = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(args[:3])} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def _outputs(tree: Path, a) -> dict:
    return json.loads(_run(tree, ["-c", _OUTPUTS, str(a.prompts), str(a.max_new_tokens), a.device, a.dtype])
                      .strip().splitlines()[-1])


def _demo(tree: Path, a) -> dict:
    flags = ["--device", a.device, "--prompts", str(a.prompts), "--json", *a.extra]
    flags += [] if a.dtype == "auto" else ["--dtype", a.dtype]
    res = json.loads(_run(tree, ["-m", "eaglekit", "demo", *flags]))
    return {k: res.get(k) for k in ("speedup", "identical", "accept_length", "eagle_tokens_per_s",
                                    "baseline_tokens_per_s", "warm_up_s", "shape")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, type=Path, help="a checkout of the commit to compare with")
    ap.add_argument("--after", type=Path, default=ROOT, help="default: this checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", type=Path, default=Path("before_after.json"))
    ap.add_argument("extra", nargs="*", help="after --: more `eaglekit demo` flags")
    a = ap.parse_args(argv)
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    res: dict = {"schema": "eaglekit-lab/1", "date": time.strftime("%Y-%m-%d"),
                 "command": "python benchmarks/lab/before_after.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "commits": {k: _commit(v) for k, v in trees.items()},
                 "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                             "device": a.device},
                 "what": __doc__.split("\n\n")[0]}
    outs = {k: _outputs(v, a) for k, v in trees.items()}
    same = {m: [x == y for x, y in zip(outs["before"][m], outs["after"][m])] for m in ("baseline", "draft")}
    res["outputs"] = {m: {"identical": sum(v), "prompts": len(v)} for m, v in same.items()}
    print("outputs:", json.dumps(res["outputs"]), flush=True)
    rounds: dict = {k: [] for k in trees}
    for r in range(a.rounds):
        for k in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            rounds[k].append(_demo(trees[k], a))
            print(f"round {r + 1} {k}: {json.dumps(rounds[k][-1])}", flush=True)
    res["demo"] = {k: {"rounds": v, **{f"median_{m}": statistics.median(x[m] for x in v)
                                       for m in ("speedup", "eagle_tokens_per_s", "baseline_tokens_per_s")
                                       if all(isinstance(x.get(m), (int, float)) for x in v)}}
                   for k, v in rounds.items()}
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
