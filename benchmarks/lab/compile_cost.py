"""What a compiled decoder's first generation pays: compile seconds and graphs per tree shape, cold.

The shipped demo pair, compiled (`compile="on"`), with an empty inductor cache of its own (a temporary folder,
unless --cache-dir): for each shape in order a new Decoder's first generation (16 tokens: the graphs it compiles, its
wall time) and its second (what a compiled run costs once warm). Shapes share what they can (a later shape that
compiles nothing new shows 0 graphs). On a CPU this measures graph counts and compile time of the same code a GPU
compiles (inductor's C++ backend, not Triton: the seconds differ, the counts do not).

    python benchmarks/lab/compile_cost.py OUT.json [--device cuda] [--shapes "3,1,4;5,1,6;5,4,8"]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", default="3,1,4;5,1,6;5,4,8")
    ap.add_argument("--cache-dir", default=None, help="inductor's cache (default: a new empty folder)")
    args = ap.parse_args()
    # before eaglekit (compiling.cache_dir) or torch's inductor read it
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="eaglekit-compile-cost-")

    import torch
    from torch._dynamo.utils import counters

    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    dtype = "bfloat16" if args.device == "cuda" else "float32"
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device=args.device, dtype=dtype,
                     run=PairRuntime(compile="on"))
    prompt = encode(load_tokenizer(ASSETS / "target"), read_prompts(ASSETS / "prompts.jsonl")[0])

    def run(dec) -> tuple[float, int]:
        graphs = counters["stats"]["unique_graphs"]
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dec.generate(prompt, 16, eos_ids=())
        if args.device == "cuda":
            torch.cuda.synchronize()
        return round(time.perf_counter() - t0, 2), counters["stats"]["unique_graphs"] - graphs

    rows = []
    base_s, base_graphs = run(Decoder(t))
    rows.append({"shape": None, "first_s": base_s, "graphs": base_graphs})
    print(f"baseline: first generation {base_s} s, {base_graphs} graphs", flush=True)
    for spec in args.shapes.split(";"):
        shape = TreeShape(*(int(x) for x in spec.split(",")))
        dec = Decoder(t, d, shape)
        first_s, graphs = run(dec)
        second_s, again = run(dec)
        rows.append({"shape": [shape.steps, shape.topk, shape.draft_tokens], "first_s": first_s, "graphs": graphs,
                     "second_s": second_s, "graphs_second": again})
        print(f"{spec}: first generation {first_s} s, {graphs} graphs; second {second_s} s, {again} graphs",
              flush=True)
    res = {"device": args.device, "torch": torch.__version__, "cache_dir": os.environ["TORCHINDUCTOR_CACHE_DIR"],
           "rows": rows, "total_first_s": round(sum(r["first_s"] for r in rows), 2),
           "total_graphs": sum(r["graphs"] for r in rows)}
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"total: {res['total_first_s']} s, {res['total_graphs']} graphs -> {args.out}")


if __name__ == "__main__":
    main()
