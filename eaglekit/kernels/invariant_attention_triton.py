"""The Triton kernels of eaglekit.kernels.invariant_attention (its docstring says what they compute and why). A module
of their own because a kernel can call only @triton.jit functions that are globals of its module; imported on first use,
so importing eaglekit never needs Triton."""

import triton
import triton.language as tl


@triton.jit
def fold(q, kt, vt, ok, m_i, l_i, acc, SCALE: tl.constexpr, IEEE: tl.constexpr):
    # one tile of keys into a row's online softmax (m_i, l_i, acc)
    if IEEE:
        s = tl.dot(q, tl.trans(kt), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(kt))
    s = tl.where(ok[None, :], s * SCALE, float("-inf"))  # SCALE carries log2(e): exp2 below
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
    return m_new, l_i, acc


@triton.jit
def pick(cache_ptr, new_ptr, s_idx, base, rd, s_cache, s_new, kv_mask):
    # a tile of keys (or values) at slots s_idx: from the cache below base, from this call's k/v from it on
    fresh = (s_idx >= base)[:, None]
    return tl.where(fresh, tl.load(new_ptr + (s_idx - base)[:, None] * s_new + rd[None, :],
                                   mask=kv_mask & fresh, other=0.0),
                    tl.load(cache_ptr + s_idx[:, None] * s_cache + rd[None, :], mask=kv_mask & ~fresh, other=0.0))


@triton.jit
def attend_part(q_ptr, k_ptr, v_ptr, kn_ptr, vn_ptr, base_ptr, slot_ptr, count_ptr, old_ptr, acc_ptr, ml_ptr, T,
                H, HD, sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, snb, snh, snt, sbb, ssb, sst, scb, sgb,
                SCALE: tl.constexpr, REP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, PARTS: tl.constexpr, IEEE: tl.constexpr,
                DIRECT: tl.constexpr):
    # (SCALE is a constexpr: inductor would pass a float argument as fp64)
    row = tl.program_id(0)  # b * T + t
    g = tl.program_id(1)  # KV head: its REP query heads are the tile's rows
    part = tl.program_id(2)  # takes chunks part, part + PARTS, ... of the row's logical keys
    b = row // T
    t = row % T
    n = tl.load(count_ptr + b * scb + t)
    base = tl.load(base_ptr + b * sbb)  # slots from here on are this call's tokens: read from kn/vn
    rm = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    heads = g * REP + rm
    q = tl.load(q_ptr + b * sqb + heads[:, None] * sqh + t * sqt + rd[None, :],
                mask=(rm[:, None] < REP) & (rd[None, :] < HD), other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    # the first `old` keys are the cache's: whole tiles of them load from it alone, in a loop of their own; the
    # tiles from there on may hold this call's keys: two masked loads and a select (a select of addresses instead
    # loses the loads' vectorization). The split costs no more than a branch per tile; it is
    # what lets the cache's tiles skip the slot table below. Tiles stay where they were (logical positions,
    # multiples of BLOCK_N), so the bits do not move.
    old = tl.load(old_ptr + b * sgb + t)
    split = (old // BLOCK_N) * BLOCK_N
    # a row that sees the whole committed prefix (old == base: every decode row of one sequence) finds key j at slot
    # j: its cache tiles load without the slot table, one dependent load fewer per tile (the kernel is latency-bound)
    ident = old == base
    if not DIRECT:
        ident = old < 0  # never: every tile through the slot table (the sweep's reference)
    kc_ptr = k_ptr + b * skb + g * skh
    vc_ptr = v_ptr + b * svb + g * svh
    kn_ptr = kn_ptr + b * snb + g * snh
    vn_ptr = vn_ptr + b * snb + g * snh
    slot_ptr = slot_ptr + b * ssb + t * sst
    for lo in range(part * CHUNK, n, PARTS * CHUNK):
        hi = tl.minimum(lo + CHUNK, n)
        mid = tl.minimum(tl.maximum(split, lo), hi)
        if ident:
            for j0 in range(lo, mid, BLOCK_N):
                j = j0 + tl.arange(0, BLOCK_N)
                ok = j < hi
                kv_mask = ok[:, None] & (rd[None, :] < HD)
                kt = tl.load(kc_ptr + j[:, None] * sks + rd[None, :], mask=kv_mask, other=0.0)
                vt = tl.load(vc_ptr + j[:, None] * svs + rd[None, :], mask=kv_mask, other=0.0)
                m_i, l_i, acc = fold(q, kt, vt, ok, m_i, l_i, acc, SCALE, IEEE)
        else:
            for j0 in range(lo, mid, BLOCK_N):
                j = j0 + tl.arange(0, BLOCK_N)
                ok = j < hi
                s_idx = tl.load(slot_ptr + j, mask=ok, other=0)
                kv_mask = ok[:, None] & (rd[None, :] < HD)
                kt = tl.load(kc_ptr + s_idx[:, None] * sks + rd[None, :], mask=kv_mask, other=0.0)
                vt = tl.load(vc_ptr + s_idx[:, None] * svs + rd[None, :], mask=kv_mask, other=0.0)
                m_i, l_i, acc = fold(q, kt, vt, ok, m_i, l_i, acc, SCALE, IEEE)
        for j0 in range(mid, hi, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            ok = j < hi
            s_idx = tl.load(slot_ptr + j, mask=ok, other=0)
            kv_mask = ok[:, None] & (rd[None, :] < HD)
            kt = pick(kc_ptr, kn_ptr, s_idx, base, rd, sks, snt, kv_mask)
            vt = pick(vc_ptr, vn_ptr, s_idx, base, rd, svs, snt, kv_mask)
            m_i, l_i, acc = fold(q, kt, vt, ok, m_i, l_i, acc, SCALE, IEEE)
    # partials [B*T, H, PARTS, BLOCK_D] and (max, sum) [B*T, H, PARTS, 2], fp32 (an idle part: -inf, 0, 0)
    hm = rm < REP
    base = (row * H + heads) * PARTS + part
    tl.store(acc_ptr + base[:, None] * BLOCK_D + rd[None, :], acc, mask=hm[:, None])
    tl.store(ml_ptr + base * 2, m_i, mask=hm)
    tl.store(ml_ptr + base * 2 + 1, l_i, mask=hm)


@triton.jit
def attend_merge(acc_ptr, ml_ptr, o_ptr, T, H, HD, sob, soh, sot,
                 BLOCK_D: tl.constexpr, PARTS: tl.constexpr):
    row = tl.program_id(0)
    h = tl.program_id(1)
    b = row // T
    t = row % T
    rd = tl.arange(0, BLOCK_D)
    base = (row * H + h) * PARTS
    m = tl.load(ml_ptr + base * 2)  # part 0 always has keys (a row sees at least itself)
    for c in tl.static_range(1, PARTS):
        m = tl.maximum(m, tl.load(ml_ptr + (base + c) * 2))
    acc = tl.zeros((BLOCK_D,), tl.float32)
    l = m * 0.0
    for c in tl.static_range(0, PARTS):  # in part order: the same sum for every row count
        w = tl.exp2(tl.load(ml_ptr + (base + c) * 2) - m)  # an idle part: exp2(-inf) = 0
        l += tl.load(ml_ptr + (base + c) * 2 + 1) * w
        acc += tl.load(acc_ptr + (base + c) * BLOCK_D + rd) * w
    out = acc / l
    tl.store(o_ptr + b * sob + h * soh + t * sot + rd, out.to(o_ptr.dtype.element_ty), mask=rd < HD)
