"""The Triton kernels of eaglekit.kernels.invariant_gemm (its docstring says what they compute and why). A module of
their own because a kernel can call only @triton.jit functions that are globals of its module; imported on first use, so
importing eaglekit never needs Triton."""

import triton
import triton.language as tl


@triton.jit
def finish(acc, acc_up, r_ptrs, mask, dtype: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr):
    # rounded as the unfused ops would see their inputs: the product's output in the model's dtype first
    y = acc.to(dtype)
    if GATED:
        g = y.to(tl.float32)
        y = (g * tl.sigmoid(g) * acc_up.to(dtype).to(tl.float32)).to(dtype)
    if RESIDUAL:
        y = (tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32) + y.to(tl.float32)).to(dtype)
    return y


@triton.jit
def rotate(acc, acc_pair, rm, rn, c_ptr, s_ptr, stride_c, rope_cols, mask, dtype: tl.constexpr, HALF: tl.constexpr):
    # rotary embedding of a head's column pair (d, d + HALF), as layers.apply_rope: the product rounded to the
    # model's dtype first, then x * cos + rotate_half(x) * sin in fp32 and one rounding; columns from rope_cols on
    # (v) pass through
    a = acc.to(dtype).to(tl.float32)
    b = acc_pair.to(dtype).to(tl.float32)
    d = rn % (2 * HALF)
    on = (rn < rope_cols)[None, :]
    c1 = tl.load(c_ptr + rm[:, None] * stride_c + d[None, :], mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(s_ptr + rm[:, None] * stride_c + d[None, :], mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(c_ptr + rm[:, None] * stride_c + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(s_ptr + rm[:, None] * stride_c + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
    first = tl.where(on, a * c1 - b * s1, a).to(dtype)
    second = tl.where(on, b * c2 + a * s2, b).to(dtype)
    return first, second


@triton.jit
def tile_dot(x_ptr, rm, rk, stride_xm, M, K, wt, wu, acc, acc_up, UP: tl.constexpr):
    # one 16-row tile's share of a K step: the rows of x against the weight tile (and its up/partner tile where UP).
    # The same dot of the same shapes whatever else the program does: a row's arithmetic is this, step by step
    xt = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    acc = tl.dot(xt, tl.trans(wt), acc)
    if UP:
        acc_up = tl.dot(xt, tl.trans(wu), acc_up)
    return acc, acc_up


@triton.jit
def tile_out(acc, acc_up, rm, rn, pid_k, part_ptr, r_ptr, c_ptr, s_ptr, q_ptr, stride_c, rope_cols, M, N, pair,
             DIRECT: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr, HALF: tl.constexpr,
             SCALED: tl.constexpr):
    # one 16-row tile's result: scaled (int8), rotated (rotary), finished (one slice of K: the epilogue) or stored as
    # a partial sum
    if SCALED:
        acc = acc * tl.load(q_ptr + rn, mask=rn < N, other=0.0)[None, :]
        if GATED:
            acc_up = acc_up * tl.load(q_ptr + pair + rn, mask=rn < N, other=0.0)[None, :]
    omask = (rm[:, None] < M) & (rn[None, :] < N)
    if HALF > 0:
        first, second = rotate(acc, acc_up, rm, rn, c_ptr, s_ptr, stride_c, rope_cols, omask,
                               part_ptr.dtype.element_ty, HALF)
        tl.store(part_ptr + rm[:, None] * N + rn[None, :], first, mask=omask)
        tl.store(part_ptr + rm[:, None] * N + HALF + rn[None, :], second, mask=omask)
    elif DIRECT:  # one slice of K: part_ptr is the output itself, the epilogue runs here
        y = finish(acc, acc_up, r_ptr + rm[:, None] * N + rn[None, :], omask, part_ptr.dtype.element_ty,
                   GATED, RESIDUAL)
        tl.store(part_ptr + rm[:, None] * N + rn[None, :], y, mask=omask)
    else:  # partial sums [split, M, N] (GATED: [split, M, 2N], gate columns then up columns)
        width = 2 * N if GATED else N
        out = part_ptr + pid_k * M * width + rm[:, None] * width + rn[None, :]
        tl.store(out, acc, mask=omask)
        if GATED:
            tl.store(out + N, acc_up, mask=omask)


@triton.jit
def smallm_partial(x_ptr, w_ptr, part_ptr, r_ptr, c_ptr, s_ptr, q_ptr, stride_c, rope_cols, M, N, K, stride_xm,
                   stride_wn, k_slice, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DIRECT: tl.constexpr,
                   GATED: tl.constexpr, RESIDUAL: tl.constexpr, HALF: tl.constexpr, SCALED: tl.constexpr,
                   UP: tl.constexpr, TILES: tl.constexpr):
    # N: the output's width. GATED: w is [gate; up] (2N rows), a program multiplies the same columns of both.
    # HALF > 0 (rotary; one slice of K): columns come in heads of 2 * HALF, a program takes BLOCK_N columns of one
    # head's first half and their partners HALF further on, and rotates the pairs (`rotate`) before storing.
    # SCALED (eaglekit.kernels.int8): w holds int8 rows and q_ptr a float32 scale per row: the tiles are widened to
    # x's dtype as they are read (integers up to 127: exact) and each column's sum is scaled before the epilogue.
    # UP (= GATED or HALF > 0): a second accumulator, the up half's columns or the rotary partners.
    # TILES (1, 2 or 4): 16-row tiles a program takes, each its own dot against the weight tile read once for all of
    # them: a row's arithmetic is its tile's (tile_dot), the same for every TILES, and the weight is read once per
    # TILES tiles instead of once per tile
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.program_id(2) * 16 * TILES + tl.arange(0, 16)  # 16-row tiles: rows never share one's order
    if HALF > 0:
        per_head = HALF // BLOCK_N
        rn = (pid_n // per_head) * 2 * HALF + (pid_n % per_head) * BLOCK_N + tl.arange(0, BLOCK_N)
        pair = HALF
    else:
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        pair = N
    k0 = pid_k * k_slice
    acc0 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    up0 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    if TILES > 1:
        acc1 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        up1 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    if TILES > 2:
        acc2 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        up2 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        acc3 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        up3 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_slice, BLOCK_K):
        rk = k0 + kk + tl.arange(0, BLOCK_K)
        wmask = (rn[:, None] < N) & (rk[None, :] < K)
        wt = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=wmask, other=0.0).to(x_ptr.dtype.element_ty)
        wu = wt
        if UP:
            wu = tl.load(w_ptr + (pair + rn[:, None]) * stride_wn + rk[None, :], mask=wmask,
                         other=0.0).to(x_ptr.dtype.element_ty)
        acc0, up0 = tile_dot(x_ptr, rm, rk, stride_xm, M, K, wt, wu, acc0, up0, UP)
        if TILES > 1:
            acc1, up1 = tile_dot(x_ptr, rm + 16, rk, stride_xm, M, K, wt, wu, acc1, up1, UP)
        if TILES > 2:
            acc2, up2 = tile_dot(x_ptr, rm + 32, rk, stride_xm, M, K, wt, wu, acc2, up2, UP)
            acc3, up3 = tile_dot(x_ptr, rm + 48, rk, stride_xm, M, K, wt, wu, acc3, up3, UP)
    tile_out(acc0, up0, rm, rn, pid_k, part_ptr, r_ptr, c_ptr, s_ptr, q_ptr, stride_c, rope_cols, M, N, pair,
             DIRECT, GATED, RESIDUAL, HALF, SCALED)
    if TILES > 1:
        tile_out(acc1, up1, rm + 16, rn, pid_k, part_ptr, r_ptr, c_ptr, s_ptr, q_ptr, stride_c, rope_cols, M, N,
                 pair, DIRECT, GATED, RESIDUAL, HALF, SCALED)
    if TILES > 2:
        tile_out(acc2, up2, rm + 32, rn, pid_k, part_ptr, r_ptr, c_ptr, s_ptr, q_ptr, stride_c, rope_cols, M, N,
                 pair, DIRECT, GATED, RESIDUAL, HALF, SCALED)
        tile_out(acc3, up3, rm + 48, rn, pid_k, part_ptr, r_ptr, c_ptr, s_ptr, q_ptr, stride_c, rope_cols, M, N,
                 pair, DIRECT, GATED, RESIDUAL, HALF, SCALED)


@triton.jit
def smallm_sum(part_ptr, r_ptr, y_ptr, M, N, SPLIT: tl.constexpr, BLOCK: tl.constexpr, GATED: tl.constexpr,
               RESIDUAL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < M * N
    width = 2 * N if GATED else N
    src = (offs // N) * width + offs % N
    acc = tl.load(part_ptr + src, mask=m, other=0.0)
    acc_up = tl.zeros((BLOCK,), dtype=tl.float32)
    if GATED:
        acc_up = tl.load(part_ptr + src + N, mask=m, other=0.0)
    for s in tl.static_range(1, SPLIT):  # in order: the same sum for every M
        acc += tl.load(part_ptr + s * M * width + src, mask=m, other=0.0)
        if GATED:
            acc_up += tl.load(part_ptr + s * M * width + src + N, mask=m, other=0.0)
    y = finish(acc, acc_up, r_ptr + offs, m, y_ptr.dtype.element_ty, GATED, RESIDUAL)
    tl.store(y_ptr + offs, y, mask=m)
