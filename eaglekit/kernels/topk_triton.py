"""The Triton kernels of eaglekit.kernels.topk (its docstring says what they compute and why). A module of their own, as
eaglekit.kernels.invariant_gemm_triton: torch.compile's wrap_triton reads a kernel's source, and a kernel defined at
module level is one it can always find; imported on first use, so importing eaglekit never needs Triton."""

import triton
import triton.language as tl


@triton.jit
def chunk_top(x_ptr, v_ptr, i_ptr, m_ptr, s_ptr, V, CH: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    valid = offs < V
    x = tl.load(x_ptr + r.to(tl.int64) * V + offs, mask=valid, other=float("-inf")).to(tl.float32)
    mc = tl.max(x, 0)
    # a chunk of -inf logits adds nothing (and computes no exp(-inf - -inf))
    shift = tl.where(mc > float("-inf"), mc, 0.0)
    s = tl.sum(tl.where(valid & (x > float("-inf")), tl.exp(x - shift), 0.0), 0)
    tl.store(m_ptr + r * CH + c, mc)
    tl.store(s_ptr + r * CH + c, s)
    alive = valid
    base = (r * CH + c) * K
    for j in tl.static_range(K):
        xa = tl.where(alive, x, float("-inf"))
        best = tl.max(xa, 0)
        # the smallest id among the best; none left alive (a chunk shorter than K) -> V - 1 at -inf, never picked
        # over a finite logit in the merge
        idx = tl.minimum(tl.min(tl.where(alive & (xa == best), offs, V), 0), V - 1)
        alive = alive & (offs != idx)
        tl.store(v_ptr + base + j, best)
        tl.store(i_ptr + base + j, idx)


@triton.jit
def merge_top(v_ptr, i_ptr, m_ptr, s_ptr, p_ptr, o_ptr, V, CH: tl.constexpr, K: tl.constexpr, CB: tl.constexpr,
              NB: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, CB)
    cm = c < CH
    mc = tl.load(m_ptr + r * CH + c, mask=cm, other=float("-inf"))
    sc = tl.load(s_ptr + r * CH + c, mask=cm, other=0.0)
    M = tl.max(mc, 0)
    M = tl.where(M > float("-inf"), M, 0.0)  # a row of -inf logits: S = 0, probabilities 0/0 as softmax's NaN
    S = tl.sum(tl.where(cm & (mc > float("-inf")), sc * tl.exp(mc - M), 0.0), 0)
    n = tl.arange(0, NB)
    nm = n < CH * K
    v = tl.load(v_ptr + r * CH * K + n, mask=nm, other=float("-inf"))
    ix = tl.load(i_ptr + r * CH * K + n, mask=nm, other=0)
    alive = nm
    for j in tl.static_range(K):
        va = tl.where(alive, v, float("-inf"))
        best = tl.max(va, 0)
        tie = alive & (va == best)
        pick = tl.min(tl.where(tie, ix, V), 0)
        pos = tl.min(tl.where(tie & (ix == pick), n, NB), 0)  # one candidate, even if two chunks named the same id
        alive = alive & (n != pos)
        tl.store(p_ptr + r * K + j, tl.exp(best - M) / S)
        tl.store(o_ptr + r * K + j, tl.minimum(pick, V - 1).to(tl.int64))
