"""Tensor-parallel benchmark for the 2-GPU H200 machine (~5 minutes). Random bf16 weights built directly
sharded on each GPU (no checkpoint). Each section is guarded: one failure does not lose the others.

    0. copy bandwidth of each GPU (bytes read + written by a 2 GiB device copy) and the all-reduce itself:
       NCCL vs torch symmetric memory (one_shot_all_reduce), eager and inside a CUDA graph, 1 and 16 rows
    1. Llama-3.1-8B shape at TP1 (rank 0 alone, same code with a world-1 group): graphed baseline tok/s,
       fraction of the copy-bandwidth roofline, cycle / baseline for trees (3,1,4), (5,1,6), (5,4,8)
    2. the same at TP2: baseline for {symm, nccl} x {lm_head split by vocabulary, replicated}, roofline
       fraction of the 2-GPU roofline (each GPU reads its share at its own bandwidth), cycle table with the
       draft replicated and with the draft layer split like the target's
    3. a 70B-shaped target (80 layers, hidden 8192, 64 heads, 8 kv heads, MLP 28672, vocab 128256) at TP2
       with an 8192-wide EAGLE-3 draft: baseline, roofline fraction, cycle table, replicated vs TP draft

    torchrun --nproc-per-node 2 benchmarks/tp_suite.py --out benchmarks/results/FILE.json
    python benchmarks/tp_suite.py --out FILE.json          (spawns its 2 ranks itself)
    python benchmarks/tp_suite.py --tiny --out /tmp/x.json  (CPU, gloo, tiny shapes: a check of the script)

Goals (issue 11): TP2 >= 1.7x TP1 on the 8B shape; the 70B shape at >= 75% of the 2-GPU roofline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timing import median_ms  # noqa: E402  (benchmarks/timing.py, beside this script)

from eaglekit import distributed  # noqa: E402

R: dict = {}
T0 = time.time()
ARGS = None
SHAPES = [(3, 1, 4), (5, 1, 6), (5, 4, 8)]


def log(msg):
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


def section(name):
    def wrap(fn):
        def run(*a, **k):
            t = time.time()
            log(f"\n== {name}")
            try:
                return fn(*a, **k)
            except Exception as e:
                traceback.print_exc()
                R.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:500]
            finally:
                log(f"   ({time.time() - t:.1f}s, {time.time() - T0:.0f}s total)")
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        return run
    return wrap


def timed_ms(fn, reps, warm=2):
    """Median per-call milliseconds: CUDA events on a GPU, perf_counter on a CPU."""
    return median_ms(fn, reps, warm, cuda=torch.cuda.is_available() and not ARGS.tiny)


# --- shapes ----------------------------------------------------------------------------------------
def target_cfg(size: str):
    from eaglekit.models.config import parse_target_config
    from eaglekit.train.pretrain import llama_config

    if ARGS.tiny:
        dims = {"8b": (512, 64, 4, 4, 2, 128), "70b": (512, 64, 6, 4, 2, 192)}[size]
    else:
        dims = {"8b": (128256, 4096, 32, 32, 8, 14336), "70b": (128256, 8192, 80, 64, 8, 28672)}[size]
    raw = llama_config(*dims, max_pos=8192, tie=False, eos_id=1)
    raw["rope_theta"] = 500000.0
    return parse_target_config(raw)


def draft_cfg(t_cfg):
    from eaglekit.capture import CaptureSpec
    from eaglekit.draft.model import DraftConfig

    return DraftConfig(hidden_size=t_cfg.hidden_size, intermediate_size=t_cfg.intermediate_size,
                       num_heads=t_cfg.num_heads, num_kv_heads=t_cfg.num_kv_heads, head_dim=t_cfg.head_dim,
                       vocab_size=t_cfg.vocab_size, draft_vocab_size=min(32000, t_cfg.vocab_size // 2),
                       rope=t_cfg.rope, capture=CaptureSpec.default(t_cfg.num_layers))


def make_draft(target, group, split: bool):
    """Replicated (the same values on every rank) or with its layer split like the target's."""
    from eaglekit.draft.model import Eagle3Draft
    from eaglekit.models.tp import tp_draft

    c = draft_cfg(target.cfg)
    old = torch.get_default_dtype()
    torch.set_default_dtype(target.dtype)
    try:
        if split:
            d = tp_draft(c, group).to_empty(device=target.device)
        else:
            with torch.device("meta"):
                d = Eagle3Draft(c)
            d = d.to_empty(device=target.device)
    finally:
        torch.set_default_dtype(old)
    from eaglekit.models.layers import Rotary

    d.rotary = Rotary(c.head_dim, c.rope).to(target.device)
    g = torch.Generator(device=target.device)
    with torch.no_grad():
        for i, (name, p) in enumerate(d.named_parameters()):
            sharded = split and ("self_attn" in name or ".mlp." in name) and "norm" not in name
            g.manual_seed(1000 + i + (group.rank * 7919 if sharded else 0))
            p.fill_(1.0) if "norm" in name else p.normal_(0, 0.02, generator=g)
        d.embed_tokens.weight.copy_(target.embed_weight())
        Vd = c.draft_vocab_size
        ar = torch.arange(Vd, device=target.device)
        d.d2t.copy_(ar * (c.vocab_size // Vd) - ar)
        d.t2d.zero_()
        d.t2d[ar * (c.vocab_size // Vd)] = True
    d.fuse()
    return d


# --- measurements ------------------------------------------------------------------------------------
def baseline(target, ctx_len, reps):
    """Graphed (GPU) or eager (CPU) greedy decode step at a context of ctx_len tokens -> ms."""
    from eaglekit.decoding.engine import Decoder

    dev = target.device
    dec = Decoder(target, graphs=dev.type == "cuda")
    target.reset(ctx_len + 512)
    prompt = torch.randint(0, target.cfg.vocab_size, (ctx_len,), generator=torch.Generator().manual_seed(0)).to(dev)
    logits, _ = target.prefill(prompt)
    tok = logits[-1].argmax()
    L = target.committed.clone()
    if dev.type == "cuda":
        g, _ = dec._graphed_step(tok)
        fn = g.replay
    else:
        def fn():
            target.step(tok.view(1))
    ms = timed_ms(lambda: (target.committed.copy_(L), fn()), reps)
    return ms


def cycles(target, draft, ctx_len, reps, base_ms, spec):
    from eaglekit.decoding.engine import PHASES, Cycle
    from eaglekit.decoding.tree import TreeShape

    dev = target.device
    rows = []
    prompt = torch.randint(0, target.cfg.vocab_size, (ctx_len,), generator=torch.Generator().manual_seed(1)).to(dev)
    for steps, topk, dt in SHAPES:
        shape = TreeShape(steps, topk, dt)
        target.reset(ctx_len + 512)
        draft.reset(ctx_len + 512 + 64)
        _, feats = target.prefill(prompt, spec)
        h, dl = draft.extend(feats, torch.cat([prompt[1:], prompt[:1]]))
        L = target.committed.clone()
        c = Cycle(target, draft, shape, spec)
        c.start(prompt[0], h, dl)
        if dev.type == "cuda":
            c.record(greedy=True)

        def one():
            target.committed.copy_(L)
            draft.committed.copy_(L)
            for p in PHASES:
                c.run(p)

        total = timed_ms(one, reps)
        phases = {}
        for p in PHASES:
            def ph():
                target.committed.copy_(L)
                draft.committed.copy_(L)
                c.run(p)
            phases[p] = round(timed_ms(ph, max(reps // 3, 3)), 4)
        rows.append({"steps": steps, "topk": topk, "draft_tokens": dt, "cycle_ms": round(total, 4),
                     "cycle_over_baseline": round(total / base_ms, 4), "phases_ms": phases})
        log(f"   ({steps},{topk},{dt}): cycle {total:.3f} ms = {total / base_ms:.3f} x baseline; {phases}")
    return rows


def roofline(tps, bytes_per_rank, bw):
    return {"tokens_per_s": round(tps, 2), "step_ms": round(1e3 / tps, 4),
            "roofline_tokens_per_s": round(bw / bytes_per_rank, 1),
            "bandwidth_fraction": round(tps * bytes_per_rank / bw, 4), "weight_bytes_per_rank": bytes_per_rank}


# --- sections -----------------------------------------------------------------------------------------
@section("0a. copy bandwidth per rank")
def copy_bw(group):
    n = (2 * 2**30) if not ARGS.tiny else 64 * 2**20
    x = torch.empty(n, dtype=torch.uint8, device=group.device)
    y = torch.empty_like(x)
    ms = timed_ms(lambda: y.copy_(x), 10 if ARGS.tiny else 20)
    bw = 2 * n / (ms / 1e3)
    del x, y
    got = [bw]
    if group.world > 1:
        import torch.distributed as dist

        got = [None] * group.world
        dist.all_gather_object(got, bw, group=group.pg)
    R["copy_bandwidth_bytes_per_s_per_rank"] = got
    log(f"   {[f'{b / 1e12:.2f} TB/s' for b in got]} (read + write)")
    return min(got)


@section("0b. all-reduce: NCCL vs symmetric memory")
def allreduce_micro(group):
    H = 64 if ARGS.tiny else 4096
    dt = torch.float32 if ARGS.tiny else torch.bfloat16
    group.setup_symm(128 * 8192 if not ARGS.tiny else 128 * H, dt)
    out = {"symm_available": bool(group._symm), "note": group.note}
    modes = ["nccl", "symm"] if group._symm else [group.backend]
    saved = group._symm
    for mode in modes:
        group._symm = saved if mode == "symm" else []
        for rows, width in ((1, H), (16, H), (1, 2 * H)):
            x = torch.ones(rows, width, dtype=dt, device=group.device)
            eager = timed_ms(lambda: group.all_reduce(x.clone()), 30)
            rec = {"bytes": x.numel() * x.element_size(), "eager_us": round(eager * 1e3, 1)}
            ok = float(group.all_reduce(x.clone()).float().mean()) == group.world
            rec["correct"] = ok
            if group.device.type == "cuda":
                K = 64
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        y = x.clone()
                        for _ in range(K):
                            y = group.all_reduce(y) * 0.5
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    y = x.clone()
                    for _ in range(K):
                        y = group.all_reduce(y) * 0.5
                rec["graphed_us_per_allreduce"] = round(timed_ms(g.replay, 20) * 1e3 / K, 2)
                del g
            out[f"{mode}_{rows}x{width}"] = rec
            log(f"   {mode} {rows}x{width}: {rec}")
    group._symm = saved
    R["allreduce"] = out


def build(size, group, lm_head="auto"):
    from eaglekit.models.tp import TPLlamaTarget

    dt = torch.float32 if ARGS.tiny else torch.bfloat16
    return TPLlamaTarget.random(target_cfg(size), group, dt, lm_head=lm_head)


@section("1. 8B shape, TP1 (rank 0 alone)")
def tp1_8b(group, bw):
    import torch.distributed as dist

    from eaglekit.capture import CaptureSpec
    from eaglekit.distributed import TPGroup

    if group.rank == 0:
        solo = TPGroup(1, 0, group.device, group.backend, group.timeout_s)
        t = build("8b", solo)
        base = baseline(t, ARGS.ctx, ARGS.reps)
        res = roofline(1e3 / base, t.weight_bytes(), bw)
        log(f"   TP1 baseline {res}")
        d = make_draft(t, solo, split=False)
        res["cycles"] = cycles(t, d, ARGS.ctx, ARGS.reps // 4 + 3, base, CaptureSpec.default(t.cfg.num_layers))
        R["tp1_8b"] = res
        del t, d
    if group.world > 1:
        dist.barrier(group=group.pg)


def tp_section(size, group, bw, key, allreduces=("symm", "nccl"), lm_heads=("vocab", "replicated")):
    from eaglekit.capture import CaptureSpec

    out = {"baseline": {}}
    saved, cands = None, []
    for lm in lm_heads:
        t = build(size, group, lm)
        saved = group._symm
        for ar in allreduces:
            if ar == "symm" and not saved:
                continue
            group._symm = saved if ar == "symm" else []
            base = baseline(t, ARGS.ctx, ARGS.reps)
            res = roofline(1e3 / base, t.weight_bytes(), bw)
            name = f"{ar if group.device.type == 'cuda' else 'gloo'}+lm_head_{lm}"
            out["baseline"][name] = res
            log(f"   {key} {name}: {res}")
            cands.append((base, ar, lm))
        group._symm = saved
        del t
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    # rank 0's timings decide, for every rank: ranks that chose differently would run different collectives
    pick = group.broadcast_int(min(range(len(cands)), key=lambda i: cands[i][0]))
    base_ms, ar, lm = cands[pick]
    out["best"] = {"allreduce": ar if group.device.type == "cuda" else "gloo", "lm_head": lm,
                   "tokens_per_s": round(1e3 / base_ms, 2)}
    t = build(size, group, lm)
    group._symm = saved if ar == "symm" else []
    spec = CaptureSpec.default(t.cfg.num_layers)
    for split in (False, True):
        d = make_draft(t, group, split)
        tag = "draft_split" if split else "draft_replicated"
        log(f"   cycles, {tag}")
        out[f"cycles_{tag}"] = cycles(t, d, ARGS.ctx, ARGS.reps // 4 + 3, base_ms, spec)
        del d
    group._symm = saved
    R[key] = out
    del t


@section("2. 8B shape, TP2")
def tp2_8b(group, bw):
    tp_section("8b", group, bw, "tp2_8b")
    if "tp1_8b" in R and "tp2_8b" in R:
        R["tp2_over_tp1_8b"] = round(R["tp2_8b"]["best"]["tokens_per_s"] / R["tp1_8b"]["tokens_per_s"], 3)
        log(f"   TP2 / TP1 = {R['tp2_over_tp1_8b']}x (goal 1.7x)")


@section("3. 70B shape, TP2")
def tp2_70b(group, bw):
    left = ARGS.budget_s - (time.time() - T0)
    if left < 90:
        R["tp2_70b"] = {"skipped": f"{left:.0f}s left of the budget"}
        return
    # one lm_head layout (split: at 70B it is 2.1 GB that each GPU would otherwise read per token); both
    # all-reduces
    tp_section("70b", group, bw, "tp2_70b", lm_heads=("vocab",))
    b = R["tp2_70b"]["baseline"]
    frac = max(v["bandwidth_fraction"] for v in b.values())
    R["tp2_70b"]["best_bandwidth_fraction"] = frac
    log(f"   70B at TP2: {frac:.1%} of the 2-GPU roofline (goal 75%)")


def write(path):
    R["seconds"] = round(time.time() - T0, 1)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(R, indent=2))
    return p


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="JSON file to write (rank 0)")
    ap.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny shapes: checks the script")
    ap.add_argument("--ctx", type=int, default=512, help="context length of the timed steps")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--budget-s", type=float, default=330, help="skip the 70B section past this")
    ap.add_argument("--one-gpu", action="store_true",
                    help="a 1-GPU machine: one process, the TP1 section only (the TP code path at world 1)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: tp1,tp2,70b,micro")
    ARGS = ap.parse_args()
    if ARGS.tiny:
        ARGS.ctx, ARGS.reps = min(ARGS.ctx, 64), min(ARGS.reps, 6)
    world = 1 if ARGS.one_gpu else 2
    if ARGS.one_gpu:
        ARGS.skip += ",tp2,70b,micro"
    elif "WORLD_SIZE" not in os.environ:  # not under torchrun: start the 2 ranks ourselves
        sys.exit(distributed.launch(2, sys.argv[1:], cmd=[sys.executable, str(Path(__file__).resolve())]))
    torch.set_num_threads(1) if ARGS.tiny else None
    group = distributed.init_tp(world, "cpu" if ARGS.tiny else "cuda", "symm", timeout_s=60 if ARGS.tiny else 600)
    import transformers

    R.update(date=datetime.date.today().isoformat(), tiny=ARGS.tiny, torch=torch.__version__,
             transformers=transformers.__version__, world=group.world, ctx=ARGS.ctx,
             device=torch.cuda.get_device_name(group.device) if group.device.type == "cuda" else "cpu",
             env={k: os.environ.get(k) for k in distributed.ENV_DEFAULTS})
    skip = set(ARGS.skip.split(","))
    bw = copy_bw(group) or 4.2e12
    # the goals first; the micro-benchmark (64 NCCL all-reduces in one graph: reference.md saw one such
    # capture hang) last, each section's results written as soon as it ends
    for name, fn in (("tp1", tp1_8b), ("tp2", tp2_8b), ("70b", tp2_70b), ("micro", allreduce_micro)):
        if name not in skip:
            fn(group) if name == "micro" else fn(group, bw)
        if group.rank == 0:
            write(ARGS.out)
    if group.rank == 0:
        p = write(ARGS.out)
        summary = {k: R.get(k) for k in ("tp2_over_tp1_8b", "errors")}
        summary["tp1_8b_tok_s"] = R.get("tp1_8b", {}).get("tokens_per_s")
        summary["tp2_8b_best"] = R.get("tp2_8b", {}).get("best")
        summary["tp2_70b_fraction"] = R.get("tp2_70b", {}).get("best_bandwidth_fraction")
        print(json.dumps(summary, indent=1))
        print(f"wrote {p}")
    distributed.shutdown()


if __name__ == "__main__":
    main()
