"""Does one persistent launch stream a chain of dependent products at the read ceiling? (Fast v2, goal 1)

product_ceiling.py showed every one-kernel-per-weight design losing ~21 us a layer to ramp and tail (a pure read of
each weight as its own kernel: 117 us a layer, against 96 at the big buffer's 4.5 TB/s). A persistent decode kernel
would keep its programs streaming from one weight to the next, with a grid-wide barrier between dependent stages.
This measures that premise before anyone builds it: the same chain (eight layers of the 8B step's q/k/v, o,
gate/up, down at 1 row, each fed the previous one's output) as

    one kernel a product (smallm, the invariant default), and
    one persistent launch: every program takes tiles of stage s, then waits at a counter until all programs have
    finished stage s (atomics, acquire/release), then goes on to stage s + 1; optionally loading its first weight tile
    of stage s + 1 before the wait (weights do not depend on the previous output)

checked against the chain in float32. The grid is sized to be co-resident (a spinning barrier with programs that
never start would hang): `--per-sm` programs an SM, and every wait gives up after a bounded spin, raising a flag.

    python benchmarks/persistent_probe.py OUT
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdl_probe import Chain  # noqa: E402
from timing import graph_ms  # noqa: E402

from eaglekit.models import smallm  # noqa: E402

SPIN_LIMIT = 1 << 20


@triton.jit
def stage_meta(meta_ptr, s):
    # meta[s] = (weight offset, N, K)
    return (tl.load(meta_ptr + 3 * s), tl.load(meta_ptr + 3 * s + 1).to(tl.int32),
            tl.load(meta_ptr + 3 * s + 2).to(tl.int32))


@triton.jit
def arrive(cnt_ptr, s):
    tl.debug_barrier()  # every thread's stores of this stage before the arrival
    tl.atomic_add(cnt_ptr + s, 1, sem="release")


@triton.jit
def wait(cnt_ptr, s, P, flag_ptr, SPIN: tl.constexpr):
    # until all P programs have arrived at stage s, or SPIN polls (then flag[0] counts a timeout); -> polls
    spins = 0
    while (tl.atomic_add(cnt_ptr + s, 0, sem="acquire") < P) & (spins < SPIN):
        spins += 1
    if spins >= SPIN:
        tl.atomic_add(flag_ptr, 1)
    tl.debug_barrier()
    return spins


@triton.jit
def persistent_chain(w_ptr, meta_ptr, x_ptr, cnt_ptr, flag_ptr, S, XS, BN: tl.constexpr, BK: tl.constexpr,
                     PREFETCH: tl.constexpr, BARRIER: tl.constexpr, SPIN: tl.constexpr):
    # meta[s] = (weight offset, N, K); x rows: stage s reads x[s, :K], writes x[s + 1, :N] (fp32)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    for s in range(S):
        off, N, K = stage_meta(meta_ptr, s)
        xin = x_ptr + s * XS
        for t in range(pid, tl.cdiv(N, BN), P):
            rows = t * BN + rn
            wrow = w_ptr + off + rows.to(tl.int64)[:, None] * K
            acc = tl.zeros((BN, BK), dtype=tl.float32)
            for k0 in range(0, K, BK):
                w = tl.load(wrow + (k0 + rk)[None, :], mask=(rows < N)[:, None], other=0.0)
                x = tl.load(xin + k0 + rk, cache_modifier=".cg")
                acc += w.to(tl.float32) * x[None, :]
            tl.store(x_ptr + (s + 1) * XS + rows, tl.sum(acc, axis=1), mask=rows < N)
        if BARRIER:
            arrive(cnt_ptr, s)
            if PREFETCH:
                # the next stage's first tile of this program, loaded while waiting (weights need no x); used only
                # by a branch that never runs, so the load stays
                noff, nN, nK = stage_meta(meta_ptr, tl.minimum(s + 1, S - 1))
                prow = pid * BN + rn
                tile = tl.load(w_ptr + noff + prow.to(tl.int64)[:, None] * nK + rk[None, :],
                               mask=(prow < nN)[:, None], other=0.0)
            spins = wait(cnt_ptr, s, P, flag_ptr, SPIN)
            if PREFETCH:
                if spins > SPIN:
                    tl.store(flag_ptr + 1, tl.sum(tl.sum(tile.to(tl.float32), axis=1), axis=0).to(tl.int32))


@triton.jit
def persistent_dot(w_ptr, meta_ptr, x_ptr, cnt_ptr, flag_ptr, S, XS, BN: tl.constexpr, BK: tl.constexpr,
                   SPIN: tl.constexpr):
    # as persistent_chain, but each tile through tl.dot as smallm does (a 16-row x tile, row 0 real, the rest
    # masked zeros), so Triton software-pipelines the weight loads (num_stages) as it does in smallm; x goes
    # through the weights' dtype (the products' input dtype)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rm = tl.arange(0, 16)
    for s in range(S):
        off, N, K = stage_meta(meta_ptr, s)
        xin = x_ptr + s * XS
        for t in range(pid, tl.cdiv(N, BN), P):
            rows = t * BN + rn
            wrow = w_ptr + off + rows.to(tl.int64)[:, None] * K
            acc = tl.zeros((16, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):
                w = tl.load(wrow + (k0 + rk)[None, :], mask=(rows < N)[:, None], other=0.0)
                xt = tl.load(xin + rm[:, None] * 0 + (k0 + rk)[None, :], mask=(rm == 0)[:, None], other=0.0,
                             cache_modifier=".cg").to(w_ptr.dtype.element_ty)
                acc = tl.dot(xt, tl.trans(w), acc)
            y = tl.sum(tl.where((rm == 0)[:, None], acc, 0.0), axis=0)
            tl.store(x_ptr + (s + 1) * XS + rows, y, mask=rows < N)
        arrive(cnt_ptr, s)
        wait(cnt_ptr, s, P, flag_ptr, SPIN)


class Packed:
    """The chain's weights in one flat buffer with a stage table, and fp32 activations a row a stage."""

    def __init__(self, chain: Chain, dev: str = "cuda"):
        ws = [w for lw in chain.ws for w in lw]
        self.S = len(ws)
        self.flat = torch.cat([w.reshape(-1) for w in ws])
        offs, o = [], 0
        for w in ws:
            offs += [o, w.shape[0], w.shape[1]]
            o += w.numel()
        self.meta = torch.tensor(offs, dtype=torch.int64, device=dev)
        self.XS = max(max(w.shape) for w in ws)
        self.x = torch.zeros(self.S + 1, self.XS, device=dev, dtype=torch.float32)
        self.x[0, : chain.x0.shape[1]] = chain.x0[0].float()
        self.cnt = torch.zeros(self.S, dtype=torch.int32, device=dev)
        self.flag = torch.zeros(2, dtype=torch.int32, device=dev)
        self.ws = ws

    def run_dot(self, grid: int, bn: int, bk: int, warps: int, stages: int):
        self.cnt.zero_()
        persistent_dot[(grid,)](self.flat, self.meta, self.x, self.cnt, self.flag, self.S, self.XS, BN=bn, BK=bk,
                                SPIN=SPIN_LIMIT, num_warps=warps, num_stages=stages)

    def reference(self) -> torch.Tensor:
        x = self.x[0].clone()
        for w in self.ws:
            x = w.float() @ x[: w.shape[1]]
        return x

    def run(self, grid: int, bn: int, bk: int, warps: int, prefetch: bool, barrier: bool = True):
        self.cnt.zero_()
        persistent_chain[(grid,)](self.flat, self.meta, self.x, self.cnt, self.flag, self.S, self.XS, BN=bn, BK=bk,
                                  PREFETCH=prefetch, BARRIER=barrier, SPIN=SPIN_LIMIT, num_warps=warps)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": torch.cuda.get_device_name(), "variants": {}}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chain = Chain(8, 1)
    res["weight_bytes"] = chain.nbytes
    row, _ = chain.measure(lambda x, w, y: smallm.kernels().run(x, w, smallm.config(*w.shape, exact=True)))
    res["variants"]["smallm, one kernel a product"] = row
    print("smallm", row, flush=True)
    pk = Packed(chain)
    ref = pk.reference()
    del chain
    # (block_n, block_k, warps, programs an SM, prefetch, barrier); no barrier = the stream alone (wrong output)
    # the second session's calls measured these elementwise variants (results JSON): best 4x1024 w4 4/SM, 3.21 TB/s
    variants = [(8, 512, 4, 4, False, True), (8, 512, 4, 4, False, False)]
    # tl.dot variants: (block_n, block_k, warps, programs an SM, num_stages) with pre = "dot"
    variants += [(bn, bk, w, per, "dot", st) for bn, bk, w, per, st in
                 ((16, 256, 4, 2, 3), (16, 256, 4, 3, 3), (16, 512, 4, 2, 3), (32, 256, 4, 2, 3), (16, 256, 4, 2, 4),
                  (16, 128, 4, 4, 4), (32, 128, 4, 3, 4), (64, 128, 4, 2, 3), (16, 256, 8, 2, 4))]
    for bn, bk, warps, per_sm, pre, bar in variants:
        dot = pre == "dot"
        name = (f"persistent dot {bn}x{bk} w{warps} {per_sm}/SM stages {bar}" if dot else
                f"persistent {bn}x{bk} w{warps} {per_sm}/SM" + (" prefetch" if pre else "") + ("" if bar else " NO BARRIER"))
        run = ((lambda: pk.run_dot(grid, bn, bk, warps, bar)) if dot else
               (lambda: pk.run(grid, bn, bk, warps, pre, bar)))
        try:
            grid = sms * per_sm
            pk.flag.zero_()
            pk.x[1:].fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            got = pk.x[pk.S, : ref.numel()]
            err = ((got - ref).norm() / ref.norm()).item()
            if (dot or bar) and pk.flag[0].item():
                res["variants"][name] = {"spin_timeouts": int(pk.flag[0].item()), "rel_err_vs_fp32_chain": err}
                print(name, res["variants"][name], flush=True)
                continue
            ms = graph_ms(run)
            res["variants"][name] = {"ms": round(ms, 4), "bandwidth_TBps": round(pk.flat.numel() * 2 / (ms / 1e3) / 1e12, 3),
                                     "rel_err_vs_fp32_chain": float(f"{err:.3g}"), "spin_timeouts": int(pk.flag[0].item())}
        except Exception as e:
            traceback.print_exc()
            res["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[-400:]}"}
        print(name, res["variants"][name], flush=True)
        (out / "persistent_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
