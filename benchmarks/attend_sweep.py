"""The invariant decode attention alone (eaglekit.models.attend), per tiling, on the Llama-3.1-8B attention shape.

The kernel is latency-bound at decode contexts (a layer's keys are 2 MB at 512 positions: 0.5 us of bandwidth,
~10 us measured), so its cost is the chain of dependent loads per program and how many programs share the keys.
For each configuration (CHUNK, PARTS, BLOCK_N, warps, DIRECT) this times 32 calls in one CUDA graph (one per
layer, each on its own cache, as in a step) for the baseline step (1 row) and the (5,1,6) verify (a chain of 6
rows), and checks, bit for bit, that each verify row equals the same token attended alone, and that DIRECT
(keys without the slot table) equals the slot table's path of the same tiling.

    python benchmarks/attend_sweep.py OUT.json [--ctx 512,2048]          (GPU, ~1 minute)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from timing import median_ms  # noqa: E402

# (CHUNK, PARTS, BLOCK_N, warps, DIRECT); the first is the tiling before this sweep
CONFIGS = [(128, 16, 64, 4, False), (128, 16, 64, 4, True), (64, 16, 64, 4, True), (64, 32, 64, 4, True),
           (64, 16, 64, 2, True), (64, 16, 64, 8, True), (32, 32, 32, 4, True), (64, 16, 32, 4, True),
           (256, 16, 64, 4, True), (64, 16, 64, 4, False)]
H, HKV, HD, LAYERS, ROWS = 32, 8, 128, 32, 6
DEVICE = "cuda"
DTYPE = torch.bfloat16  # --smoke: float16 (the interpreter has no bf16 arithmetic)


def set_config(cfg):
    from eaglekit.models import attend
    attend.CHUNK, attend.PARTS, attend.BLOCK_N, attend.WARPS, attend.DIRECT = cfg


def chain_inputs(ctx: int, gen: torch.Generator):
    """Per layer: a cache of ctx committed keys (junk after them), this call's 6 chain rows, and for row t alone
    a cache that holds the committed keys and rows < t."""
    from eaglekit.models import attend

    S = ctx + 64
    dev = DEVICE
    layers = []
    for _ in range(LAYERS):
        k_all = torch.randn(1, HKV, S, HD, generator=gen, device=dev).to(DTYPE)
        v_all = torch.randn(1, HKV, S, HD, generator=gen, device=dev).to(DTYPE)
        q = torch.randn(1, H, ROWS, HD, generator=gen, device=dev).to(DTYPE)
        junk_k, junk_v = k_all.clone(), v_all.clone()
        junk_k[:, :, ctx:], junk_v[:, :, ctx:] = -k_all[:, :, ctx:], 2 * v_all[:, :, ctx:]
        layers.append((q, k_all, v_all, junk_k, junk_v))
    mask = torch.zeros(1, ROWS, S, dtype=torch.bool, device=dev)
    mask[..., :ctx] = True
    for t in range(ROWS):
        mask[0, t, ctx:ctx + t + 1] = True  # a chain: every earlier row is an ancestor
    base = torch.tensor([ctx], device=dev)
    tree_vis = attend.visible(mask, base)
    alone = []
    for t in range(ROWS):
        m1 = torch.zeros(1, 1, S, dtype=torch.bool, device=dev)
        m1[..., :ctx + t + 1] = True
        b1 = torch.tensor([ctx + t], device=dev)
        alone.append((attend.visible(m1, b1), b1))
    return layers, tree_vis, base, alone


def time_calls(calls, reps: int) -> float:
    """us per call: all calls in one CUDA graph, replayed."""
    if DEVICE != "cuda":  # --smoke: Triton's interpreter, no timing
        return float("nan")
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return median_ms(g.replay, reps, warm=5, cuda=True) * 1e3 / len(calls)


def sweep(ctx: int, reps: int, gen: torch.Generator) -> list[dict]:
    from eaglekit.models import attend

    run = attend.kernels().run
    layers, (slots, count, old), base, alone = chain_inputs(ctx, gen)
    rows, outs = [], {}
    for cfg in CONFIGS:
        set_config(cfg)
        tree = [run(q, jk, jv, ka[:, :, ctx:ctx + ROWS], va[:, :, ctx:ctx + ROWS], base, slots, count, old)
                for q, ka, va, jk, jv in layers]
        same = True
        for li, (q, ka, va, jk, jv) in enumerate(layers[:4]):
            for t, ((s1, c1, o1), b1) in enumerate(alone):
                one = run(q[:, :, t:t + 1], ka, va, ka[:, :, ctx + t:ctx + t + 1], va[:, :, ctx + t:ctx + t + 1],
                          b1, s1, c1, o1)
                same &= torch.equal(one[:, :, 0], tree[li][:, :, t])
        # the reference: SDPA over each row's keys, in fp32
        q, ka, va = layers[0][:3]
        kk = ka[:, :, :ctx + ROWS].float().repeat_interleave(H // HKV, 1)
        vv = va[:, :, :ctx + ROWS].float().repeat_interleave(H // HKV, 1)
        m = torch.ones(ROWS, ctx + ROWS, dtype=torch.bool, device=DEVICE).tril(ctx)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=m)
        err = (tree[0].float() - ref).abs().max().item()
        key = cfg[:4]
        direct_equal = None
        if key in outs:
            direct_equal = all(torch.equal(a, b) for a, b in zip(outs[key], tree))
        outs[key] = tree
        vis1, b1 = alone[0]
        step = time_calls([lambda q=q, ka=ka, va=va: run(q[:, :, :1], ka, va, ka[:, :, ctx:ctx + 1],
                                                         va[:, :, ctx:ctx + 1], b1, *vis1)
                           for q, ka, va, _, _ in layers], reps)
        verify = time_calls([lambda q=q, ka=ka, va=va, jk=jk, jv=jv:
                             run(q, jk, jv, ka[:, :, ctx:ctx + ROWS], va[:, :, ctx:ctx + ROWS], base, slots, count,
                                 old) for q, ka, va, jk, jv in layers], reps)
        row = {"ctx": ctx, "chunk": cfg[0], "parts": cfg[1], "block_n": cfg[2], "warps": cfg[3], "direct": cfg[4],
               "step_us_per_layer": round(step, 2), "verify6_us_per_layer": round(verify, 2),
               "rows_equal_alone": same, "direct_equals_slot_table": direct_equal, "max_err_vs_fp32": err}
        rows.append(row)
        print(f"   ctx {ctx} {cfg}: step {step:6.2f} us, verify6 {verify:6.2f} us per layer; rows == alone "
              f"{same}; direct == table {direct_equal}; err {err:.2e}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ctx", default="512,2048")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--configs", default=None, help="'CHUNK,PARTS,BLOCK_N,WARPS,DIRECT;...' (default: CONFIGS)")
    ap.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1: two layers, no timing")
    args = ap.parse_args()
    global DEVICE, DTYPE, LAYERS
    if args.configs:
        CONFIGS[:] = [tuple(int(x) for x in c.split(","))[:4] + (bool(int(c.split(",")[4])),)
                      for c in args.configs.split(";")]
    if args.smoke:
        DEVICE, DTYPE, LAYERS = "cpu", torch.float16, 2
        CONFIGS[:] = [CONFIGS[0], CONFIGS[1], CONFIGS[6]]
    from eaglekit.models import attend

    saved = (attend.CHUNK, attend.PARTS, attend.BLOCK_N, attend.WARPS, attend.DIRECT)
    t0 = time.time()
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    dev = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter)"
    res = {"device": dev, "torch": torch.__version__, "default": list(saved),
           "shape": {"heads": H, "kv_heads": HKV, "head_dim": HD, "layers": LAYERS, "verify_rows": ROWS},
           "rows": []}
    with torch.no_grad():
        for ctx in (int(c) for c in args.ctx.split(",")):
            res["rows"] += sweep(ctx, args.reps, gen)
    set_config(saved)
    res["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out} ({res['wall_s']} s)")


if __name__ == "__main__":
    main()
