"""Batched EAGLE-3 decoding (eaglekit.decoding.batch.BatchEngine): cycle time vs the plain batched step per
batch size, and what that means for output tokens/s.

    a. 8B shape (Llama-3.1-8B: 32 layers, hidden 4096, 32 heads, 8 kv heads, intermediate 14336, vocab
       128256; draft 1 layer 4096 wide, draft vocab 32000), random bf16 weights built on the GPU, chain
       (3, 1, 4). For batch sizes 1..64: the batched baseline step and the batched cycle, each its CUDA
       graphs replayed (medians of CUDA events), at a context of --context tokens per row. Output tok/s
       with the draft is REPLAYED at --accept-length (tokens per cycle, default the demo pair's measured
       2.79 for (3,1,4)): B * accept / cycle, without: B / step. Next to SGLang's published ratios.
       The recommended switch-off (spec_max_batch) is the largest measured batch whose replayed speedup
       is above 1.
    b. the shipped demo pair end to end through BatchEngine at batch 1, 4, 8: tokens/s with and without the
       draft, outputs identical (greedy).

    python benchmarks/batch_suite.py OUT.json                 # GPU, ~3-4 minutes on one H200
    python benchmarks/batch_suite.py OUT.json --tiny          # CPU, tiny random shape (a smoke run)
    python benchmarks/batch_suite.py OUT.json --demo-only --threads 2   # CPU: the demo pair only
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timing import median_ms  # noqa: E402  (benchmarks/timing.py, beside this script)

# SGLang's published EAGLE-3 speedups over no draft (chain of 3, H100), by batch size
SGLANG = {2: 1.81, 4: 1.82, 8: 1.62, 16: 1.48, 24: 1.39, 32: 1.32, 64: 1.38}
RESULTS: dict = {}


PRODUCTS = "auto"  # --products

def build_pair(tiny: bool, device: str):
    from eaglekit.capture import CaptureSpec
    from eaglekit.draft.model import DraftConfig, Eagle3Draft
    from eaglekit.models.config import parse_target_config
    from eaglekit.models.llama import LlamaModel, LlamaTarget
    from eaglekit.train.pretrain import llama_config

    if tiny:
        V, H, L, heads, kvh, inter, Vd, dtype = 512, 64, 4, 4, 2, 128, 256, torch.float32
    else:
        V, H, L, heads, kvh, inter, Vd, dtype = 128256, 4096, 32, 32, 8, 14336, 32000, torch.bfloat16
    raw = llama_config(V, H, L, heads, kvh, inter, max_pos=8192, tie=False, eos_id=V - 1)
    raw["rope_theta"] = 500000.0
    cfg = parse_target_config(raw)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # built in place: no float32 copy of 8B parameters on the way
            net = LlamaModel(cfg)
            spec = CaptureSpec.default(L)
            dcfg = DraftConfig(hidden_size=H, intermediate_size=inter, num_heads=heads, num_kv_heads=kvh,
                               vocab_size=V, draft_vocab_size=Vd, rope=cfg.rope, capture=spec,
                               max_position_embeddings=8192)
            d = Eagle3Draft(dcfg)
    finally:
        torch.set_default_dtype(torch.float32)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in list(net.parameters()) + list(d.parameters()):
            p.normal_(0, 0.02, generator=g)  # timing does not depend on the values, but never time zeros
        d.embed_tokens.weight.copy_(net.model.embed_tokens.weight)
        d.d2t.copy_(torch.arange(Vd, device=device) * (V // Vd) - torch.arange(Vd, device=device))
        d.t2d.zero_()
        d.t2d[torch.arange(Vd, device=device) * (V // Vd)] = True
    t = LlamaTarget(net, device, dtype)
    t.fuse()
    d.fuse()
    return t, d, raw


@torch.inference_mode()  # the engine's state tensors are inference tensors
def cycles(args, cuda: bool, device: str):
    """Section a: per batch size, the plain batched step and the batched cycle (graphs on a GPU)."""
    from eaglekit.decoding.batch import BatchEngine, Request
    from eaglekit.decoding.tree import TreeShape

    t, d, raw = build_pair(args.tiny, device)
    shape = TreeShape(3, 1, 4)
    acc = args.accept_length
    rows = []
    g = torch.Generator().manual_seed(1)
    for B in args.sizes:
        t0 = time.time()
        eng = BatchEngine(t, d, shape, max_batch=B, spec_max_batch=B, graphs=cuda)
        for i in range(B):
            prompt = torch.randint(0, raw["vocab_size"] - 1, (args.context,), generator=g).tolist()
            eng.add(Request(f"r{i}", prompt, args.max_new, eos_ids=()))
        eng.step()  # prefill every row, capture the graphs of this size (GPU), one cycle
        c = eng._rows()
        n = eng.num_running
        state = [c.tk.length, c.dk.length, c.root, c.h, c.dl]
        snap = [x.clone() for x in state]

        def restore():
            for x, v in zip(state, snap):
                x.copy_(v)

        def cycle():
            restore()
            for p in c.SPEC:
                c.run(p)

        def step():
            restore()
            c.run("plain")
            c.run("plain_commit")

        reps = args.reps
        cyc = median_ms(cycle, reps, cuda=cuda)
        base = median_ms(step, reps, cuda=cuda)
        rst = median_ms(restore, reps, cuda=cuda)  # both timings include one state restore: report it, do not subtract
        ratio = cyc / base
        row = {"batch": B, "running": n, "step_ms": round(base, 4), "cycle_ms": round(cyc, 4),
               "cycle_over_step": round(ratio, 4), "restore_ms": round(rst, 4),
               "tok_s_no_draft": round(B * 1e3 / base, 1),
               "tok_s_draft_replayed": round(B * acc * 1e3 / cyc, 1),
               "speedup_replayed": round(acc / ratio, 3), "sglang_speedup": SGLANG.get(B),
               "setup_s": round(time.time() - t0, 1)}
        rows.append(row)
        print(f"   B={B:3d}: step {base:8.3f} ms  cycle {cyc:8.3f} ms  cycle/step {ratio:5.2f}  "
              f"tok/s {row['tok_s_no_draft']:9.1f} -> {row['tok_s_draft_replayed']:9.1f} (replayed x"
              f"{row['speedup_replayed']:.2f}; SGLang {SGLANG.get(B, '-')})  [{row['setup_s']}s]", flush=True)
        del eng, c, state, snap
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    paying = [r["batch"] for r in rows if r["speedup_replayed"] > 1.0]
    first_loss = next((r["batch"] for r in rows if r["speedup_replayed"] <= 1.0), None)
    RESULTS["batch_cycles"] = {
        "shape": "tiny" if args.tiny else "llama-3.1-8b", "dtype": str(t.dtype), "tree": [3, 1, 4],
        "context": args.context, "accept_length_replayed": acc, "graphs": cuda,
        "device": torch.cuda.get_device_name() if cuda else "cpu", "rows": rows,
        # speculation is used up to the last size before the first one where it stops paying
        "recommended_spec_max_batch": (max(b for b in paying if first_loss is None or b < first_loss)
                                       if paying and paying[0] == rows[0]["batch"] else 0),
    }


@torch.inference_mode()
def demo(args, device: str, sizes=(1, 4, 8)):
    """Section b: the demo pair through BatchEngine, with and without its draft (greedy, identical outputs)."""
    from eaglekit.decoding.batch import BatchEngine, Request
    from eaglekit.demo import ASSETS
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import load_tokenizer

    # float32: greedy output identical with and without the draft is then a real check (in bf16 one row and a
    # tree of rows round differently; issue "Fast v2")
    # uncompiled, as `eaglekit serve` runs its batched engine by default (and as results/2026-12-01_* were measured)
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device=device, dtype="float32", compile="off",
                     products=PRODUCTS)[:2]
    tok = load_tokenizer(ASSETS / "target")
    lines = (ASSETS / "prompts.jsonl").read_text().splitlines()
    prompts = [tok.encode(json.loads(x)["prompt"]) for x in lines]
    out = []
    for B in sizes:
        res = {}
        for name, draft in (("draft", d), ("no_draft", None)):
            eng = BatchEngine(t, draft, max_batch=B, spec_max_batch=B)
            # the same waves twice: the first records the CUDA graphs of every padded size and cache span the
            # timed second one meets (a shorter warm-up left span re-recording inside the timed run)
            for rep in range(2):
                got: dict[str, list[int]] = {}
                for i in range(B * args.waves):
                    eng.add(Request(f"r{i}", prompts[i % len(prompts)], args.demo_new, eos_ids=()))
                drafts0, accepted0 = eng.spec_stats["num_drafts"], eng.spec_stats["num_accepted_tokens"]
                t0, c0 = time.perf_counter(), time.process_time()
                steps = 0
                while eng.has_work:
                    for ev in eng.step():
                        got.setdefault(ev.rid, []).extend(ev.token_ids)
                    steps += 1
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            ntok = sum(len(v) for v in got.values())
            st = eng.spec_stats  # cumulative: the timed wave's share is its growth
            drafts, accepted = st["num_drafts"] - drafts0, st["num_accepted_tokens"] - accepted0
            # CPU time as well: on a loaded machine wall time measures the neighbours; with one torch thread,
            # tokens per CPU-second is what an idle core would give
            res[name] = {"tok_s": round(ntok / dt, 2), "tok_per_cpu_s": round(ntok / cpu, 2), "tokens": ntok,
                         "seconds": round(dt, 3), "cpu_seconds": round(cpu, 3), "steps": steps,
                         "accept_length": round(1 + accepted / drafts, 3) if drafts else None, "outputs": got}
        same = res["draft"]["outputs"] == res["no_draft"]["outputs"]
        row = {"batch": B, "tok_s_draft": res["draft"]["tok_s"], "tok_s_no_draft": res["no_draft"]["tok_s"],
               "speedup": round(res["draft"]["tok_s"] / res["no_draft"]["tok_s"], 3),
               "tok_per_cpu_s_draft": res["draft"]["tok_per_cpu_s"],
               "tok_per_cpu_s_no_draft": res["no_draft"]["tok_per_cpu_s"],
               "speedup_cpu_time": round(res["draft"]["tok_per_cpu_s"] / res["no_draft"]["tok_per_cpu_s"], 3),
               "accept_length": res["draft"]["accept_length"], "identical_outputs": same,
               "tokens": res["draft"]["tokens"]}
        out.append(row)
        print(f"   demo B={B}: {row['tok_s_no_draft']} tok/s -> {row['tok_s_draft']} tok/s with the draft "
              f"(x{row['speedup']}; per CPU-second {row['tok_per_cpu_s_no_draft']} -> {row['tok_per_cpu_s_draft']}, "
              f"x{row['speedup_cpu_time']}; accept length {row['accept_length']}), identical outputs: {same}",
              flush=True)
    import os

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    RESULTS.setdefault("demo_pair", {})[device] = {
        "rows": out, "dtype": "float32", "threads": torch.get_num_threads(), "products": t.products,
        "new_tokens": args.demo_new, "waves": args.waves,
        "load_average_1_5_15": load, "cpu_count": os.cpu_count()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="results JSON path")
    ap.add_argument("--tiny", action="store_true", help="tiny random shape on the CPU (a smoke run)")
    ap.add_argument("--accept-length", type=float, default=2.79,
                    help="tokens per cycle to replay (default: the demo pair's measured value for (3,1,4))")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--context", type=int, default=None, help="prompt tokens per row (default 512; tiny 64)")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--products", default="auto", choices=("auto", "aten", "onednn", "smallm"),
                    help="how the demo pair's products run (eaglekit.models.products)")
    ap.add_argument("--demo-only", action="store_true", help="only section b (the demo pair)")
    ap.add_argument("--no-demo", action="store_true")
    ap.add_argument("--demo-new", type=int, default=48, help="new tokens per demo request")
    ap.add_argument("--waves", type=int, default=2, help="demo requests = batch x waves")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global PRODUCTS
    PRODUCTS = args.products
    cuda = torch.cuda.is_available() and not args.tiny
    device = "cuda" if cuda else "cpu"
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.context = args.context or (64 if args.tiny else 512)
    args.reps = args.reps or (30 if cuda else 5)
    if not cuda and not args.tiny and not args.demo_only:
        print("no GPU: pass --tiny for a CPU smoke run of section a, or --demo-only")
        args.demo_only = True
    RESULTS["command"] = " ".join(sys.argv)
    RESULTS["torch"] = torch.__version__
    t0 = time.time()
    for name, fn in (("a. batched cycle vs step", lambda: cycles(args, cuda, device)),
                     ("b. demo pair", lambda: demo(args, device))):
        if (name.startswith("a") and args.demo_only) or (name.startswith("b") and args.no_demo):
            continue
        print(f"\n== {name}", flush=True)
        try:
            fn()
        except Exception as e:  # keep going: the other section still reports
            traceback.print_exc()
            RESULTS.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(RESULTS, indent=1))
    RESULTS["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(RESULTS, indent=1))
    print(f"\nwrote {args.out} ({RESULTS['wall_s']} s)")


if __name__ == "__main__":
    main()
