"""The demo pair served end to end: `eaglekit serve` with its draft and without it, each loaded by `eaglekit
bench` (streaming completions, the demo prompts, --ignore-eos so every request makes --max-tokens tokens)
at each concurrency level, one after the other in one run. Reports per level the output tok/s with and
without the draft and their ratio, TTFT / TPOT medians, and the server's own acceptance (its vLLM-named
/metrics counters). Greedy, so the two servers' outputs are the same text; the ratio is what the draft buys
under that load.

    python benchmarks/lab/serve_suite.py OUT.json --device cuda                  # GPU (~2 minutes)
    python benchmarks/lab/serve_suite.py OUT.json --device cpu --threads 1 --levels 1,4 --num-prompts 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eaglekit.demo import ASSETS  # noqa: E402
from eaglekit.serve.bench import BenchOptions, render, run_bench  # noqa: E402
from eaglekit.serve.local import LocalServer  # noqa: E402


def serve_and_bench(args, with_draft: bool, log: Path) -> list[dict]:
    serve = ["--target", str(ASSETS / "target"), "--served-model-name", "demo", "--device", args.device,
             "--max-batch", str(args.max_batch), "--max-queue", str(4 * max(args.levels)), "--log-level", "warning"]
    if with_draft:
        serve += ["--draft", str(ASSETS / "draft")]
    if args.dtype:
        serve += ["--dtype", args.dtype]
    if args.threads:
        serve += ["--threads", str(args.threads)]
    t = time.time()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # keep carried packages
    with LocalServer(serve, log=log, env={"PYTHONPATH": path}, startup_s=300) as srv:
        print(f"server {'with' if with_draft else 'without'} draft up in {time.time() - t:.1f}s", flush=True)
        # a short warm-up level: CUDA graphs are recorded per padded batch size on first use
        run_bench(BenchOptions(endpoint=srv.url, num_prompts=max(args.levels), concurrency=(max(args.levels),),
                               max_tokens=8, ignore_eos=True))
        levels = run_bench(BenchOptions(endpoint=srv.url, num_prompts=args.num_prompts, concurrency=args.levels,
                                        max_tokens=args.max_tokens, ignore_eos=True, max_seconds=args.max_seconds))
    render(levels)
    return levels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: the server's (bf16 on a GPU, float32 on a CPU)")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--num-prompts", type=int, default=32, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-seconds", type=float, default=240)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    args.levels = tuple(int(x) for x in args.levels.split(","))
    out = Path(args.out)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": platform.node(), "device": args.device, "dtype": args.dtype, "levels": list(args.levels),
           "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "max_batch": args.max_batch}
    try:
        import torch

        if args.device == "cuda":
            res["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - the name is a label only
        pass
    runs = {}
    for with_draft in (True, False):
        key = "draft" if with_draft else "no_draft"
        runs[key] = serve_and_bench(args, with_draft, out.with_suffix(f".{key}.log"))
    rows = []
    for a, b in zip(runs["draft"], runs["no_draft"]):
        sd = a.get("spec_decode") or {}
        rows.append({"concurrency": a["concurrency"],
                     "tok_s_draft": a["output_throughput"], "tok_s_no_draft": b["output_throughput"],
                     "speedup": (a["output_throughput"] / b["output_throughput"]
                                 if a["output_throughput"] and b["output_throughput"] else None),
                     "tpot_median_ms_draft": a["tpot_ms"]["median"], "tpot_median_ms_no_draft": b["tpot_ms"]["median"],
                     "ttft_median_ms_draft": a["ttft_ms"]["median"], "ttft_median_ms_no_draft": b["ttft_ms"]["median"],
                     "accept_length": sd.get("mean_acceptance_length"), "failed": a["failed"] + b["failed"]})
    res["levels_draft"], res["levels_no_draft"], res["table"] = runs["draft"], runs["no_draft"], rows
    print(f"\n{'conc':>5} {'draft tok/s':>12} {'no draft':>10} {'ratio':>7} {'accept':>7} {'TPOT ms d/nd':>14}")
    for r in rows:
        ratio = f"{r['speedup']:.2f}" if r["speedup"] else "n/a"
        acc = f"{r['accept_length']:.2f}" if r["accept_length"] else "n/a"
        print(f"{r['concurrency']:>5} {r['tok_s_draft']:>12.1f} {r['tok_s_no_draft']:>10.1f} {ratio:>7} {acc:>7} "
              f"{r['tpot_median_ms_draft']:>6.2f}/{r['tpot_median_ms_no_draft']:<6.2f}")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
