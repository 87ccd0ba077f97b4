"""Where the shipped demo pair's cycle goes on a GPU: the wall time of a cycle in `generate` against the device time
of each recorded phase replayed on its own, and the kernels of one cycle by device time.

    python benchmarks/lab/demo_gpu_phases.py --out DIR [--steps 5] [--prompts 8]

Writes DIR/demo_gpu_phases.json (and the profiler's kernel table as DIR/demo_gpu_kernels.txt). The pair loads as
`eaglekit demo --device cuda` loads it (bf16, products and draft precision by the chooser, compiled)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.timing import samples_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from eaglekit.decoding.engine import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import ASSETS
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device=a.device, dtype=a.dtype)
    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, x) for x in read_prompts(ASSETS / "prompts.jsonl")][:a.prompts]
    shape = TreeShape.make(a.steps, 1)
    dec = Decoder(t, d, shape)
    dec.generate(prompts[0], 32)  # compile and record
    dec.generate(prompts[0], 32, baseline=True)
    res = {"load_and_warm_s": round(time.perf_counter() - t0, 1), "shape": [shape.steps, 1, shape.draft_tokens],
           "products": str(getattr(t, "products_choice", None)), "draft_precision": getattr(d, "precision", None)}
    spec_s = base_s = 0.0
    cycles = toks = 0
    for p in prompts:
        r = dec.generate(p, 128, eos_ids=())
        b = dec.generate(p, 128, eos_ids=(), baseline=True)
        spec_s += r.metrics.elapsed_s
        base_s += b.metrics.elapsed_s
        cycles += len(r.metrics.accepted)
        toks += r.metrics.new_tokens
    res.update(tokens=toks, cycles=cycles, accept_length=round(toks / cycles, 3),
               wall_ms_per_cycle=round(1000 * spec_s / cycles, 4), wall_ms_per_step=round(1000 * base_s / toks, 4),
               speedup=round(base_s / spec_s, 3))
    # the recorded phases replayed on their own (device time; no host work between)
    c = dec._cycle(True)
    r = dec.generate(prompts[0], 64, eos_ids=())  # leaves the cycle's state mid-generation
    state = [t.committed, d.committed, c.root, c.h, c.dl]
    snap = [x.clone() for x in state]

    def restore():
        for x, v in zip(state, snap):
            x.copy_(v)

    phases = {}
    for ph in ("draft_tree", "verify", "accept", "cache_update", "draft_extend"):
        phases[ph] = round(sorted(samples_ms(lambda ph=ph: c.run(ph), 50, before=restore))[25], 4)

    def whole():
        for ph in ("draft_tree", "verify", "accept", "cache_update", "draft_extend"):
            c.run(ph)

    phases["five_back_to_back"] = round(sorted(samples_ms(whole, 50, before=restore))[25], 4)
    step = dec._steps.get((t.storage_key(), dec.baseline_rows))
    if step is not None:
        phases["plain_step"] = round(sorted(samples_ms(lambda: step[0].replay(), 50))[25], 4)
    res["device_ms"] = phases
    if a.device == "cpu":
        print(json.dumps(res, indent=1))
        return
    # the kernels of ten cycles
    from torch.profiler import ProfilerActivity, profile

    restore()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            restore()
            whole()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    res["kernels_per_cycle"] = round(len(ev) / 10, 1)
    (out / "demo_gpu_kernels.txt").write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40))
    (out / "demo_gpu_phases.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
