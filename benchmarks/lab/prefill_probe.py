"""Where a served request's first token goes: the engine's admitting step (the prefill of the target and the draft,
which returns the first token) and the decode step after it, timed per request on a warmed engine for prompts of one
length and of varied lengths, and the kernels and host operations of a few prefills under torch.profiler.

    python benchmarks/lab/prefill_probe.py --out DIR [--pairs demo,8b] [--max-batch 1,64] [--requests 12]
                                           [--prompt-graphs]

`demo` is the shipped pair (the serve-demo suite's), `8b` the random 8B shape with its int8 draft and the products
`eaglekit serve --max-batch N` picks (benchmarks.cases.batch.build_pair). Per pair and max batch: the admitting
step's median wall time (the engine's part of a TTFT) and the next step's, the prefill phase per request (the engine's
profiler), the host operations' and the device's time per profiled prefill, and
DIR/prefill_<pair>_b<N>_<variant>_kernels.txt (device time by kernel, host time by operation). `--prompt-graphs`:
each variant again with the prompts through one compiled graph for every length (compile_prompts()).
Writes DIR/prefill_probe.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _pair(name: str, device: str, max_batch: int, shape):
    """The pair as `eaglekit serve --max-batch max_batch` loads it, its prompt length and vocabulary size."""
    from benchmarks.cases.serve import as_served

    if name == "demo":
        from eaglekit.demo import demo_paths
        from eaglekit.options import PairRuntime
        from eaglekit.pair import load_pair

        tdir, ddir, _ = demo_paths()
        t, d = load_pair(tdir, ddir, device=device,
                         run=PairRuntime(batched=max_batch > 1, rows=max_batch * shape.draft_tokens))
        return t, d, 40, t.info.vocab_size
    from benchmarks.cases.batch import build_pair

    t, d, raw = build_pair(device != "cuda", device)
    if device == "cuda":
        as_served(t, d, device, max_batch, shape)
    return t, d, 128, raw["vocab_size"]


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _admit_ms(eng, prompts, max_new: int, cuda: bool) -> tuple[list[float], list[float]]:
    """Each prompt alone through the engine: the wall time of the step that admits it (its prefill, up to its first
    token) and of the step after it (its first decode step), then the rest of the request run out."""
    from eaglekit.decoding.engine import Request

    admit, after = [], []
    for i, p in enumerate(prompts):
        eng.add(Request(f"p{i}", p, max_new, eos_ids=()))
        for times in (admit, after):
            _sync(cuda)
            t0 = time.perf_counter()
            if eng.has_work:
                eng.step()
            _sync(cuda)
            times.append(1e3 * (time.perf_counter() - t0))
        while eng.has_work:
            eng.step()
    return admit, after


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="./out")
    ap.add_argument("--pairs", default="demo,8b")
    ap.add_argument("--max-batch", default="1,64")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--prompt-graphs", action="store_true",
                    help="each variant again with the prompts through the graphs of compile_prompts()")
    a = ap.parse_args()
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.kernels.products import compiles_any_length

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = TreeShape(5, 1, 6) if cuda else TreeShape(4, 1, 5)
    res = {"what": "the admitting step and prefill of one request on a warmed engine", "device": device,
           "machine": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "runs": {}}
    for name in a.pairs.split(","):
        for mb in (int(x) for x in a.max_batch.split(",")):
            t0 = time.perf_counter()
            t, d, plen, V = _pair(name, device, mb, shape)
            rng = random.Random(0)
            fixed = [[rng.randrange(V) for _ in range(plen)] for _ in range(a.requests)]
            varied = [[rng.randrange(V) for _ in range(plen - 8 + 3 * i)] for i in range(a.requests)]
            run = {"products": str(getattr(t, "products_choice", None)), "prompt_len": plen}
            variants = [("draft", d, False), ("no_draft", None, False)]
            if a.prompt_graphs:
                run["prompt_graphs_run"] = compiles_any_length(t.net.products)  # (else their prompts stay eager)
                variants += [("draft_prompt_graphs", d, True), ("no_draft_prompt_graphs", None, True)]
            for variant, draft, graphs in variants:
                t.compile_prompts(graphs)
                d.compile_prompts(graphs)
                eng = BatchEngine(t, draft, EngineOptions(shape=shape, max_batch=mb, graphs=cuda, profile=True,
                                                          adaptive=False))
                w = eng.warm_up(plen + 3 * a.requests + a.max_new + 64, sizes=[1])
                t1 = time.perf_counter()
                _admit_ms(eng, fixed[:2], a.max_new, cuda)  # a first request of each kind past warm-up
                r = {"warm_up_s": w["seconds"], "span": w["span"],
                     "first_two_requests_s": round(time.perf_counter() - t1, 2)}  # (the prompt graphs compile here)
                base = eng.profile()  # (the phases below count from here: the prompt graphs' compile is not a prefill)
                for kind, ps in (("fixed", fixed), ("varied", varied)):
                    ms, nxt = _admit_ms(eng, ps, a.max_new, cuda)
                    r[f"admit_ms_{kind}"] = {"median": round(statistics.median(ms), 3),
                                             "all": [round(x, 2) for x in ms]}
                    r[f"next_step_ms_{kind}"] = round(statistics.median(nxt), 3)
                r["phases_ms_per_step"] = eng.profile(since=base)["ms_per_step"]
                r["prefill_ms_per_request"] = r["phases_ms_per_step"].get("prefill")
                acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
                with torch.profiler.profile(activities=acts) as pr:
                    _admit_ms(eng, fixed[:3], 1, cuda)
                ka = pr.key_averages()
                # host time against device time of a prefill: whether it waits on the GPU or the GPU on Python
                dev_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in ka)
                r["profiled_prefill_ms"] = {"host_ops": round(sum(e.self_cpu_time_total for e in ka) / 3e3, 3),
                                            "device": round(dev_us / 3e3, 3) if cuda else None}
                txt = out / f"prefill_{name}_b{mb}_{variant}_kernels.txt"
                txt.write_text("3 requests, max_new 1, by device time\n"
                               + ka.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                          row_limit=40, max_name_column_width=110)
                               + "\nby host time\n"
                               + ka.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=110))
                run[variant] = r
                print(name, mb, variant, json.dumps(r)[:400], flush=True)
                del eng
            run["seconds"] = round(time.perf_counter() - t0, 1)
            res["runs"][f"{name}_b{mb}"] = run
            (out / "prefill_probe.json").write_text(json.dumps(res, indent=1))
            del t, d
            if cuda:
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
