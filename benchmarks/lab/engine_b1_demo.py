"""The shipped demo pair, one request at a time, through the Decoder and through a bare BatchEngine(max_batch=1)
side by side in one process: tokens/s of each (the median of `--passes` passes over the prompts), the target alone
beside them, and whether every output equals the target's.

    python benchmarks/lab/engine_b1_demo.py --device cuda --out DIR [--prompts 12 --new 128 --passes 3]

The Decoder drives a one-row engine itself, so the two columns differ only by the Decoder's interface around the
engine (prompt checks, metrics, the trace's cycle numbers) and by the policy (the Decoder runs the whole tree every
cycle). On the tiny pair a GPU is host-bound, so this measures host work per cycle as much as kernels.
Writes DIR/engine_b1_demo.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: the demo's (bfloat16 on a GPU, float32 on a CPU)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="the chain's length (default 5 on a GPU, 4 on a CPU)")
    a = ap.parse_args()
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.engine import BatchEngine, Request
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import demo_paths
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    cuda = a.device == "cuda"
    dtype = a.dtype or ("bfloat16" if cuda else "float32")
    tdir, ddir, pfile = demo_paths()
    t0 = time.perf_counter()
    t, d = load_pair(tdir, ddir, device=a.device, dtype=dtype, run=PairRuntime(batched=True))
    print(f"[{time.perf_counter() - t0:6.1f}s] loaded: {t.products_choice}", flush=True)
    tok = load_tokenizer(tdir)
    prompts = [encode(tok, p) for p in read_prompts(pfile)][:a.prompts]
    shape = TreeShape.make(a.steps or (5 if cuda else 4), 1)
    dec = Decoder(t, d, shape)
    engines = {"engine": BatchEngine(t, d, EngineOptions(shape=shape, max_batch=1, adaptive=False)),
               "engine_policy": BatchEngine(t, d, EngineOptions(shape=shape, max_batch=1, adaptive=True))}

    def run_engine(e, p):
        e.add(Request("r", p, a.new, eos_ids=()))
        out = []
        while e.rows or e.waiting:
            for ev in e.step():
                out += ev.token_ids
        return out

    runs = {"target_alone": lambda p: dec.generate(p, a.new, baseline=True, eos_ids=()).token_ids,
            "decoder": lambda p: dec.generate(p, a.new, eos_ids=()).token_ids,
            **{k: (lambda p, e=e: run_engine(e, p)) for k, e in engines.items()}}
    with torch.inference_mode():  # (after loading: the products pack their weights outside it)
        res = _measure(a, cuda, dtype, shape, t, d, prompts, runs, engines, t0)
    print(json.dumps(res, indent=1))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_b1_demo.json").write_text(json.dumps(res, indent=1))


def _measure(a, cuda, dtype, shape, t, d, prompts, runs, engines, t0) -> dict:
    """Warm-up, then `a.passes` passes of every run over the prompts -> the result object."""
    for k, f in runs.items():  # warm-up: compiles, graphs, the policy's timings
        for p in prompts[:2]:
            f(p)
        print(f"[{time.perf_counter() - t0:6.1f}s] warmed up: {k}", flush=True)
    warm_s = time.perf_counter() - t0
    tps = {k: [] for k in runs}
    same = {k: True for k in runs}
    ref = None
    for _ in range(a.passes):
        for k, f in runs.items():
            if cuda:
                torch.cuda.synchronize()
            s = time.perf_counter()
            outs = [f(p) for p in prompts]
            if cuda:
                torch.cuda.synchronize()
            tps[k].append(sum(map(len, outs)) / (time.perf_counter() - s))
            print(f"[{time.perf_counter() - t0:6.1f}s] {k}: {tps[k][-1]:.1f} tok/s", flush=True)
            if k == "target_alone":
                ref = outs
            else:
                same[k] = same[k] and outs == ref
    med = {k: round(statistics.median(v), 1) for k, v in tps.items()}
    res = {"command": "python3 benchmarks/lab/engine_b1_demo.py " + " ".join(sys.argv[1:]),
           "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": dtype,
           "shape": [shape.steps, shape.topk, shape.draft_tokens],
           "products": str(getattr(t, "products_choice", None)), "draft_precision": getattr(d, "precision", None),
           "prompts": len(prompts), "new_tokens": a.new, "passes": a.passes, "load_and_warm_s": round(warm_s, 1),
           "tokens_per_s_median": med, "tokens_per_s_passes": {k: [round(x, 1) for x in v] for k, v in tps.items()},
           "speedup_over_target_alone": {k: round(v / med["target_alone"], 3) for k, v in med.items()},
           "engine_over_decoder": round(med["engine"] / med["decoder"], 3),
           "identical_to_target_alone": same, "policy": engines["engine_policy"].spec_stats}
    return res


if __name__ == "__main__":
    main()
