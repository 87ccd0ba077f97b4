"""Where a served prefill's time goes: the shipped demo pair in the engine a server builds, one prompt at a time.

    python benchmarks/lab/prefill_probe.py --device cuda    # one GPU, about a minute; JSON to --out ($OUT, ./out)
    python benchmarks/lab/prefill_probe.py --device cpu     # the same stages on a CPU (a smoke test)

For prompts of --lengths tokens (random ids: the cost depends on shapes, not values), each figure the median wall time
of --n calls, the device synchronized before and after each:
  admit_draft      BatchEngine.admit of one request with the draft (what a served prefill costs: the target's
                   forward capturing features, the finite check's host read, the first token's read, the draft's
                   extend over the prompt)
  admit_no_draft   the same engine built without the draft
  target_capture   the target's forward_rows alone, capturing the draft's features (inside prompt_calls)
  target_plain     the same without the capture
  draft_extend     the draft's extend_rows over the prompt's features alone
  profile          torch.profiler over one admit_draft call: kernels launched, their device time, the call's wall
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.schema import git_sha, machine  # noqa: E402
from eaglekit.decoding.config import EngineOptions  # noqa: E402
from eaglekit.decoding.engine import BatchEngine  # noqa: E402
from eaglekit.decoding.requests import Request  # noqa: E402
from eaglekit.decoding.tree import TreeShape  # noqa: E402
from eaglekit.kernels.compiling import prompt_calls  # noqa: E402
from eaglekit.options import PairRuntime  # noqa: E402
from eaglekit.pair import load_pair  # noqa: E402

DEMO = ROOT / "eaglekit" / "assets" / "demo"


def engine(device: str, with_draft: bool, max_batch: int) -> BatchEngine:
    """The engine `eaglekit serve` builds for the demo pair (serve._engine's options, warm-up left out: a prefill
    replays no graph)."""
    run = dataclasses.replace(
        PairRuntime(), batched=max_batch > 1, rows=max_batch * TreeShape.make().draft_tokens, server=True
    )
    target, draft = load_pair(DEMO / "target", DEMO / "draft" if with_draft else None, device=device, run=run)
    return BatchEngine(target, draft, EngineOptions(max_batch=max_batch, graphs="auto", adaptive=True))


def timed(fn, n: int, sync) -> float:
    out = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def admit(e: BatchEngine, T: int, g: torch.Generator, count: list[int]):
    """One request of T random tokens and one new token through e: it ends at its prefill, its row freed."""

    def call():
        count[0] += 1
        e.add(Request(f"p{count[0]}", torch.randint(100, 8000, (T,), generator=g).tolist(), 1))
        e.admit()
        e.step()  # (returns the finished request's events and frees its row)

    return call


def measure(engines: dict, T: int, n: int, dev: str, sync, g: torch.Generator, count: list[int]) -> dict:
    """One prompt length's figures (the module docstring's list)."""
    row: dict = {}
    for name, eng in engines.items():
        for _ in range(3):
            admit(eng, T, g, count)()
        row[f"admit_{name}_ms"] = timed(admit(eng, T, g, count), n, sync)
    e = engines["draft"]
    st, setup = e.state, e.setup
    ids = torch.randint(100, 8000, (1, T), generator=g).to(dev)
    causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
    depths = torch.arange(T, device=dev)[None]
    kv, dk = st.tk.rows(0, 1), st.dk.rows(0, 1)
    lengths = torch.full((1,), T, dtype=torch.long, device=dev)

    def fwd(capture):
        kv.length.zero_()
        return setup.target.forward_rows(kv, ids, depths, causal, T, capture, last=True)

    with torch.inference_mode(), prompt_calls():
        row["target_capture_ms"] = timed(lambda: fwd(setup.capture), n, sync)
        row["target_plain_ms"] = timed(lambda: fwd(None), n, sync)
        _, feats = fwd(setup.capture)

        def extend():
            dk.length.zero_()
            setup.draft.extend_rows(dk, feats, ids, lengths, T)

        row["draft_extend_ms"] = timed(extend, n, sync)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    call = admit(e, T, g, count)
    sync()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as p:
        call()
        sync()
    wall = (time.perf_counter() - t0) * 1e3
    kernels = [ev for ev in p.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    row["profile"] = {
        "wall_ms_under_profiler": round(wall, 3),
        "kernels": len(kernels),
        "kernel_device_ms": round(sum(ev.device_time for ev in kernels) / 1e3, 3),
        "aten_calls": sum(1 for ev in p.events() if ev.name.startswith("aten::")),
    }
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", default="16,128")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args(argv)
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    g = torch.Generator().manual_seed(0)
    engines = {"draft": engine(dev, True, args.max_batch), "no_draft": engine(dev, False, args.max_batch)}
    res: dict = {"lengths": {}}
    count = [0]  # (request ids stay distinct over the whole run)
    for T in [int(x) for x in args.lengths.split(",")]:
        res["lengths"][str(T)] = measure(engines, T, args.n, dev, sync, g, count)
        print(T, json.dumps(res["lengths"][str(T)]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": "eaglekit-lab/1",
        "date": time.strftime("%Y-%m-%d"),
        "command": "python benchmarks/lab/prefill_probe.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_sha(),
        "machine": machine(),
        "script": "benchmarks/lab/prefill_probe.py",
        "script_text": Path(__file__).read_text(),
        "results": res,
    }
    path = out / f"prefill_probe_{dev.split(':')[0]}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
