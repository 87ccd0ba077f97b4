"""Where the time of a decode step goes, per variant of how the layers are compiled (Fast v2 probe).

One variant per process (dynamo and inductor state do not carry over), on the Llama-3.1-8B shape of
h200_suite (random bf16 weights): compile + capture time, the graphed step, its fraction of the copy
bandwidth, the GPU kernel time by kind (from torch.profiler over eager calls of the same compiled step), and
the EAGLE-3 cycle over the baseline step for a few shapes.

    python benchmarks/fast_probe.py --variant cdt --options '{"coordinate_descent_tuning": true}' --out DIR
    python benchmarks/fast_probe.py --variant graphs --no-compile --out DIR
    python benchmarks/fast_probe.py --variant main --products invariant --gaps "5,1,6" --out DIR   (graph timelines)
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h200_suite as S  # noqa: E402

KINDS = (("smallm", ("smallm_",)),
         ("gemm", ("gemv", "gemm", "nvjet", "cutlass", "sm90_", "splitk", "matmul")),
         ("attention", ("fmha", "flash", "attention", "attn", "attend_")),
         ("norm", ("rms_norm_rows",)),
         ("triton", ("triton_",)))


def kind(name: str) -> str:
    low = name.lower()
    for k, keys in KINDS:
        if any(x in low for x in keys):
            return k
    return "other"


def kernel_table(fn, reps=5, every: bool = False) -> dict:
    """GPU time per kernel kind for `reps` calls of fn (ms per call), and the number of kernels per call; `every`:
    each kernel's name with its count and ms per call, not only the 12 costliest."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    by_kind = collections.defaultdict(float)
    count = collections.Counter()
    top = collections.defaultdict(float)
    calls = collections.Counter()
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t <= 0 or "CUDA" not in str(e.device_type):
            continue
        k = kind(e.key)
        by_kind[k] += t / 1e3 / reps
        count[k] += e.count // reps
        top[e.key[:90]] += t / 1e3 / reps
        calls[e.key[:90]] += e.count // reps
    ranked = sorted(top.items(), key=lambda kv: -kv[1])
    out = {"ms_per_call": {k: round(v, 4) for k, v in by_kind.items()},
           "kernels_per_call": dict(count),
           "top": [[k, round(v, 4)] for k, v in ranked[:12]]}
    if every:
        out["every"] = [[k, calls[k], round(v, 4)] for k, v in ranked]
    return out


def timeline(fn) -> list[tuple[float, float, str]]:
    """(start us, duration us, name) of the kernels, copies and memsets one call of fn puts on the GPU, in order
    (CUPTI reports the kernels inside a CUDA graph's replay one by one)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    return sorted((float(e["ts"]), float(e["dur"]), e["name"]) for e in events
                  if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)


def graph_gaps(fn, reset=None, reps: int = 3) -> dict:
    """Where a CUDA graph's replay time goes between its kernels: the kernels' sum against the span from the first
    start to the last end (median over `reps` replays, each profiled alone), the idle time by gap size, and the
    largest gaps of the median replay with the kernels either side. The probe's kernel tables time eager calls and
    sum kernels only; a phase's CUDA-event time is this span plus the replay's launch. `reset` (outside the profile)
    puts the state back before each call."""
    reset = reset or (lambda: None)
    reset()
    fn()
    runs = []
    for _ in range(reps):
        reset()
        torch.cuda.synchronize()
        ev = timeline(fn)
        gaps = [(ev[i + 1][0] - ev[i][0] - ev[i][1], ev[i][2][:60], ev[i + 1][2][:60]) for i in range(len(ev) - 1)]
        runs.append({"kernels": len(ev), "kernel_sum_us": sum(e[1] for e in ev),
                     "span_us": ev[-1][0] + ev[-1][1] - ev[0][0] if ev else 0.0, "gaps": gaps})
    mid = sorted(runs, key=lambda r: r["span_us"])[len(runs) // 2]
    bins = collections.Counter()
    for g, _, _ in mid["gaps"]:
        bins["<1us" if g < 1 else "1-2us" if g < 2 else "2-5us" if g < 5 else "5-20us" if g < 20 else ">=20us"] += g
    return {"kernels": mid["kernels"], "kernel_sum_ms": round(mid["kernel_sum_us"] / 1e3, 4),
            "span_ms": round(mid["span_us"] / 1e3, 4),
            "span_ms_all": [round(r["span_us"] / 1e3, 4) for r in runs],
            "gap_ms": round(sum(g for g, _, _ in mid["gaps"]) / 1e3, 4),
            "gap_median_us": round(statistics.median([g for g, _, _ in mid["gaps"]]), 3) if mid["gaps"] else None,
            "gap_ms_by_size": {k: round(v / 1e3, 4) for k, v in bins.items()},
            "largest_gaps": [[round(g, 2), a, b] for g, a, b in sorted(mid["gaps"], key=lambda x: -x[0])[:12]]}


def step_gaps(t, rows_list=(1, 6)) -> dict:
    """graph_gaps of the recorded baseline step (the decoder's own graph) at 1 row and at 6 (a (5,1,6) verify's shape
    without the feature capture), from the 512-token prompt; the cache length is put back before each replay."""
    from eaglekit.decoding.engine import Decoder

    dec, out = Decoder(t), {}
    t.reset(1024)
    t.prefill(torch.randint(0, 128000, (512,), device="cuda"))
    L = t.committed.clone()
    tok = torch.zeros((), dtype=torch.long, device="cuda")
    for rows in rows_list:
        g, _ = dec._graphed_step(tok, rows)
        out[f"step{rows}"] = graph_gaps(g.replay, lambda: t.committed.copy_(L))
    return out


def draft_kernels(d) -> dict:
    """GPU time per kernel kind of the draft phase: one (5,1,6) chain and one (5,4,8) tree expansion, and the extend
    of a (5,1,6) cycle, eager calls of the compiled draft layer (as the target's step above), from the draft's state the
    cycles section left."""
    from eaglekit.decoding.tree import TreeShape, expand

    g = torch.Generator(device="cuda").manual_seed(2)
    h = torch.randn(d.hidden_size, device="cuda", generator=g).to(d.dtype)
    logits = torch.randn(d.draft_vocab_size, device="cuda", generator=g)
    root = torch.zeros((), dtype=torch.long, device="cuda")
    out = {}
    with torch.inference_mode():
        for name, shape in (("draft_chain516_kernels", TreeShape(5, 1, 6)),
                            ("draft_tree548_kernels", TreeShape(5, 4, 8))):
            out[name] = kernel_table(lambda s=shape: expand(d, h, logits, root, s), every=True)
        # the draft's extend after a (5,1,6) verify, as the cycle runs it: its path's 6 entries of target features
        # (its 0.35 ms is ~1.7x the 0.21 ms its weights take to read: which kernels?); the length is put back after
        E = TreeShape(5, 1, 6).path_len
        feats = torch.randn(E, d.fc.in_features, device="cuda", generator=g).to(d.dtype)
        ids = torch.randint(0, 1000, (E,), device="cuda", generator=g)
        m0 = d.cache.length.clone()

        def extend():
            d.extend(feats, ids)
            d.cache.length.copy_(m0)

        out["draft_extend516_kernels"] = kernel_table(extend, every=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", required=True)
    ap.add_argument("--options", default=None, help="inductor options as JSON (default: eaglekit's)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--shapes", default="3,1,4;5,1,6;5,4,8")
    ap.add_argument("--small-m", type=int, default=None, help="rows from which products use eaglekit.models.smallm")
    ap.add_argument("--products", default=None, help="the target's products kind (e.g. invariant)")
    ap.add_argument("--attend", default=None,
                    help="the invariant attention's tiling CHUNK,PARTS,BLOCK_N,WARPS,DIRECT (attend_sweep.py)")
    ap.add_argument("--no-fuse", action="store_true",
                    help="invariant products without their epilogues (gate, residual add) in the kernels")
    ap.add_argument("--no-rope-fuse", action="store_true",
                    help="invariant products with their epilogues fused but the rotary embedding in inductor's kernels")
    ap.add_argument("--draft-products", default=None,
                    help="the draft's products kind (default: F.linear, compiled by inductor; e.g. invariant)")
    ap.add_argument("--draft-quant", default=None, choices=["int8"],
                    help="the draft's weights as int8 (eaglekit.models.quant)")
    ap.add_argument("--draft-quant-one-row", default=None, choices=["inductor", "kernel"],
                    help="an int8 draft's one-row products: inductor's GEMV or smallm's kernel "
                    "(default: quant.ONE_ROW)")
    ap.add_argument("--no-cudnn-sdp", action="store_true",
                    help="the draft's attention without cuDNN's SDPA (torch picks flash or memory-efficient at trace "
                    "time; cuDNN's took 27 us a (5,4,8) tree level of 4 rows)")
    ap.add_argument("--draft-attention", default=None, choices=["sdpa", "bulk"],
                    help="the draft's decode attention (Eagle3Draft.set_attention; default: bulk with products bulk, "
                    "as load_pair sets it, else sdpa)")
    ap.add_argument("--bulk-define", action="append", default=[],
                    help="products bulk built with this macro (MACRO=V, repeatable; e.g. EK_ATTN_RS=0): every "
                    "Kernels of the process uses that build")
    ap.add_argument("--torch-picks", action="store_true",
                    help="the draft's picks as before: torch's softmax + top-k (a chain's and a tree's levels; a "
                    "compiled draft's whole tree keeps its top-k op: add --level-tree)")
    ap.add_argument("--level-tree", action="store_true",
                    help="a compiled draft's tree level by level (the layer, the pick and the bookkeeping graphs of "
                    "their own each level), as before the 22nd session's whole-tree graph (Eagle3Draft.grow_tree)")
    ap.add_argument("--top1-two-stage", action="store_true",
                    help="a chain's pick by topk.argmax's two stages (chunk maxima, then the best chunk) instead of one "
                    "reduction over the draft vocabulary (the same token)")
    ap.add_argument("--torch-tree-topk", action="store_true",
                    help="the tree's small top-k (16 children, the final selection) by torch's topk and sort")
    ap.add_argument("--gaps", default=None,
                    help="shapes whose recorded phases (and the step graphs) get a timeline of gaps, e.g. '5,1,6'")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from eaglekit.models.products import Invariant
    Invariant.fuses = not args.no_fuse
    Invariant.fuses_rope = not args.no_rope_fuse
    S.SMALL_M = args.small_m
    S.PRODUCTS = args.products
    S.DRAFT_PRODUCTS = args.draft_products
    S.DRAFT_QUANT = args.draft_quant
    S.DRAFT_ATTENTION = args.draft_attention or ("bulk" if args.products == "bulk" else "sdpa")
    S.LEVEL_TREE = args.level_tree
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.bulk_define:  # (bulk.library() hands out _LIB once loaded: the variant becomes every Kernels' library)
        from eaglekit.models import bulk
        bulk._LIB = bulk.library(tuple(args.bulk_define))
    from eaglekit.models import quant
    quant.ONE_ROW = args.draft_quant_one_row or quant.ONE_ROW
    if args.torch_picks:
        from eaglekit.decoding import topk, tree
        tree.top_probs = topk.torch_top_probs
        topk.top1 = lambda logits: topk.torch_top_probs(logits, 1).indices
    if args.top1_two_stage:
        from eaglekit.decoding import topk
        topk.top1 = lambda logits: topk.argmax(logits).unsqueeze(-1)
    if args.torch_tree_topk:
        from eaglekit.decoding import topk
        topk.small_topk = lambda v, k: v.topk(k)
        topk.small_top_sorted = lambda v, k: v.topk(k).indices.sort().values
    if args.attend:
        from eaglekit.models import attend
        c = [int(x) for x in args.attend.split(",")]
        attend.CHUNK, attend.PARTS, attend.BLOCK_N, attend.WARPS, attend.DIRECT = c[:4] + [bool(c[4])]
    S.COMPILE = not args.no_compile
    S.COMPILE_OPTIONS = json.loads(args.options) if args.options else None
    S.SHAPES = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    res = {"variant": args.variant, "compiled": S.COMPILE, "options": S.COMPILE_OPTIONS, "small_m": S.SMALL_M,
           "products": S.PRODUCTS, "draft_products": S.DRAFT_PRODUCTS, "attend": args.attend,
           "draft_quant": args.draft_quant, "cudnn_sdp": not args.no_cudnn_sdp, "bulk_defines": args.bulk_define,
           "draft_attention": S.DRAFT_ATTENTION, "draft_tree_graph": "levels" if args.level_tree else "whole",
           "draft_quant_one_row": quant.ONE_ROW if args.draft_quant else None,
           "draft_picks": "torch softmax + topk" if args.torch_picks else "argmax (chain), topk kernels (tree)",
           "tree_topk": "torch" if args.torch_tree_topk else "pairwise comparisons",
           "top1": "two stages" if args.top1_two_stage else "one reduction",
           "fused_epilogues": not args.no_fuse,
           "rope_in_product": not (args.no_fuse or args.no_rope_fuse)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():  # after each section: a run cut by its time limit keeps what it measured
        (out / f"probe_{args.variant}.json").write_text(json.dumps(res, indent=1))

    S.copy_bandwidth()
    ctx: dict = {}
    t0 = time.time()
    S.baseline_8b(ctx)
    res["baseline_section_s"] = round(time.time() - t0, 1)  # build + compile + capture + timing
    res.update({k: S.RESULTS[k] for k in ("copy_bandwidth_bytes_per_s", "baseline_8b", "weight_bytes_non_embedding")
                if k in S.RESULTS})
    t = ctx["target"]
    tok = torch.zeros(1, dtype=torch.long, device="cuda")
    t.reset(1024)
    t.prefill(torch.randint(0, 128000, (512,), device="cuda"))
    with torch.inference_mode():
        res["step_kernels"] = kernel_table(lambda: t.step(tok))
        res["verify6_kernels"] = kernel_table(lambda: t.step(tok, 6))
    print(json.dumps(res["step_kernels"], indent=1))
    if args.gaps:
        res["graph_gaps"] = step_gaps(t)
        print(json.dumps({k: {x: v[x] for x in ("kernels", "kernel_sum_ms", "span_ms", "gap_ms")}
                          for k, v in res["graph_gaps"].items()}))
        want = {tuple(int(x) for x in g.split(",")) for g in args.gaps.split(";")}

        def on_cycle(shape, c, reset):
            if shape in want:
                res["graph_gaps"][",".join(map(str, shape))] = {p: graph_gaps(g.replay, reset)
                                                                for p, g in c.recorded.items()}
        S.ON_CYCLE = on_cycle
        save()
    else:  # each shape's row saved as it comes
        S.ON_CYCLE = lambda shape, c, reset: (res.update(cycles=S.RESULTS["cycles"]), save())
    t1 = time.time()
    S.cycles_8b(ctx)
    res["cycles_section_s"] = round(time.time() - t1, 1)
    res["cycles"] = S.RESULTS.get("cycles")
    save()
    res.update(draft_kernels(ctx["draft8b"]))
    res["errors"] = S.RESULTS.get("errors")
    save()
    print(json.dumps({k: res[k] for k in ("baseline_8b", "cycles") if k in res}, indent=1))


if __name__ == "__main__":
    main()
