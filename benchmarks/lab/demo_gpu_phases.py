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

from benchmarks.timing import OneRow, samples_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from eaglekit.decoding.decoder import Decoder
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
    # a prompt of a length not seen before: its prefill's first call against a second one, and what compiled
    from torch._dynamo.utils import counters

    from eaglekit.decoding import runner as engine_mod

    records = []
    record = engine_mod.record_graphs
    engine_mod.record_graphs = lambda *x, **k: records.append(1) or record(*x, **k)
    frames0 = sum(counters["stats"].values())
    first = {"draft": 0.0, "no_draft": 0.0}
    again = {"draft": 0.0, "no_draft": 0.0}
    for i, p in enumerate(prompts[1:]):
        mode = i % 2 == 0  # alternate which mode sees the new length first
        for m in (mode, not mode):
            k = "no_draft" if m else "draft"
            t1 = time.perf_counter()
            dec.generate(p, 1, eos_ids=(), baseline=m)
            torch.cuda.synchronize() if a.device == "cuda" else None
            first[k] += time.perf_counter() - t1
    for i, p in enumerate(prompts[1:]):
        for m in (False, True):
            k = "no_draft" if m else "draft"
            t1 = time.perf_counter()
            dec.generate(p, 1, eos_ids=(), baseline=m)
            torch.cuda.synchronize() if a.device == "cuda" else None
            again[k] += time.perf_counter() - t1
    n = max(len(prompts) - 1, 1)
    res["new_length_prefill_ms"] = {k: round(1000 * v / n, 2) for k, v in first.items()}
    res["seen_length_prefill_ms"] = {k: round(1000 * v / n, 2) for k, v in again.items()}
    res["dynamo_stats_delta"] = sum(counters["stats"].values()) - frames0
    res["dynamo_stats"] = {k: v for k, v in counters["stats"].items()}
    res["graph_recordings_in_prefills"] = len(records)
    records.clear()
    spec_s = base_s = 0.0
    cycles = toks = 0
    for p in prompts:
        r = dec.generate(p, 128, eos_ids=())
        b = dec.generate(p, 128, eos_ids=(), baseline=True)
        spec_s += r.metrics.elapsed_s
        base_s += b.metrics.elapsed_s
        cycles += len(r.metrics.accepted)
        toks += r.metrics.new_tokens
    res["graph_recordings_in_timed_loop"] = len(records)
    res.update(tokens=toks, cycles=cycles, accept_length=round(toks / cycles, 3),
               wall_ms_per_cycle=round(1000 * spec_s / cycles, 4), wall_ms_per_step=round(1000 * base_s / toks, 4),
               speedup=round(base_s / spec_s, 3))
    # per generate: the prefill alone (one new token) with and without the draft, and the profiler's phases (CUDA
    # events: a phase's figure holds the device's idle time while the host works inside it)

    pre_spec = pre_base = 0.0
    for p in prompts:
        pre_spec += dec.generate(p, 1, eos_ids=()).metrics.elapsed_s
        pre_base += dec.generate(p, 1, eos_ids=(), baseline=True).metrics.elapsed_s
    res["prefill_ms_per_generate"] = {"draft": round(1000 * pre_spec / len(prompts), 3),
                                      "no_draft": round(1000 * pre_base / len(prompts), 3)}
    profiled = Decoder(t, d, shape, profile=True)
    profiled.generate(prompts[0], 32)  # (its engine's graphs)
    profiled.generate(prompts[0], 32, baseline=True)
    ph_spec, ph_base = {}, {}
    t1 = time.perf_counter()
    for p in prompts:
        for k, v in profiled.generate(p, 128, eos_ids=()).metrics.phases.items():
            ph_spec[k] = ph_spec.get(k, 0.0) + v
        for k, v in profiled.generate(p, 128, eos_ids=(), baseline=True).metrics.phases.items():
            ph_base[k] = ph_base.get(k, 0.0) + v
    res["profiled_pass_wall_s"] = round(time.perf_counter() - t1, 3)
    del profiled
    t1 = time.perf_counter()
    s2 = b2 = 0.0
    for p in prompts:  # the timed pass again, every length seen
        s2 += dec.generate(p, 128, eos_ids=()).metrics.elapsed_s
        b2 += dec.generate(p, 128, eos_ids=(), baseline=True).metrics.elapsed_s
    res["second_pass"] = {"wall_ms_per_cycle": round(1000 * s2 / cycles, 4),
                          "wall_ms_per_step": round(1000 * b2 / toks, 4), "speedup": round(b2 / s2, 3)}
    res["profiled_ms_per_cycle"] = {k: round(1000 * v / cycles, 4) for k, v in ph_spec.items()}
    res["profiled_ms_per_step"] = {k: round(1000 * v / toks, 4) for k, v in ph_base.items()}
    # the recorded phases replayed on their own (device time; no host work between): the one engine at one row
    one = OneRow(t, d, shape, torch.as_tensor(prompts[0], device=a.device), graphs=a.device == "cuda")
    restore, whole = one.restore, one.cycle
    phases = {}
    for ph in one.PHASES:
        phases[ph] = round(sorted(samples_ms(lambda ph=ph: one.run(ph), 50, before=restore))[25], 4)
    phases["five_back_to_back"] = round(sorted(samples_ms(whole, 50, before=restore))[25], 4)
    plain = OneRow(t, None, shape, torch.as_tensor(prompts[0], device=a.device), graphs=a.device == "cuda",
                   plain_rows=dec.baseline_rows)
    phases["plain_step"] = round(sorted(samples_ms(plain.step, 50, before=plain.restore))[25], 4)
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
