"""The Triton kernels of eaglekit.kernels.moe_gemv (its docstring says what they compute and why). A module of their own
because a kernel can call only @triton.jit functions that are globals of its module; imported on first use, so
importing eaglekit never needs Triton."""

import triton
import triton.language as tl


@triton.jit
def gate_up_act(x_ptr, w_ptr, idx_ptr, act_ptr, I, D, TOPK, stride_we, stride_wr, BLOCK_I: tl.constexpr,
                BLOCK_D: tl.constexpr):
    # program (pair p, rows i0..i0+BLOCK_I of the expert's intermediate): act[p, i] = silu(gate . x) * (up . x), the
    # gate rows i and up rows I + i of expert idx[p] against token p // TOPK
    p = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    e = tl.load(idx_ptr + p).to(tl.int64)
    x_row = x_ptr + (p // TOPK).to(tl.int64) * D
    w_e = w_ptr + e * stride_we
    acc_g = tl.zeros((BLOCK_I,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_I,), dtype=tl.float32)
    on = i < I
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        xv = tl.load(x_row + d, mask=dm, other=0.0).to(tl.float32)
        m = on[:, None] & dm[None, :]
        g = tl.load(w_e + i[:, None] * stride_wr + d[None, :], mask=m, other=0.0).to(tl.float32)
        u = tl.load(w_e + (I + i)[:, None] * stride_wr + d[None, :], mask=m, other=0.0).to(tl.float32)
        acc_g += tl.sum(g * xv[None, :], axis=1)
        acc_u += tl.sum(u * xv[None, :], axis=1)
    # rounded as the unfused ops round: each product in the model's dtype, silu(gate) in it, then the product
    dtype = act_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    a = (g * tl.sigmoid(g)).to(dtype).to(tl.float32) * acc_u.to(dtype).to(tl.float32)
    tl.store(act_ptr + p.to(tl.int64) * I + i, a.to(dtype), mask=on)


@triton.jit
def down_sum(act_ptr, w_ptr, idx_ptr, wt_ptr, y_ptr, I, D, TOPK, stride_we, stride_wr, BLOCK_R: tl.constexpr,
             BLOCK_K: tl.constexpr):
    # program (token n, output rows r0..r0+BLOCK_R): y[n, r] = sum over its TOPK experts j, in order, of
    # wt[n, j] * (down rows r of expert idx[n, j]) . act[n * TOPK + j]
    n = tl.program_id(0)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    on = r < D
    out = tl.zeros((BLOCK_R,), dtype=tl.float32)
    dtype = y_ptr.dtype.element_ty
    for j in range(0, TOPK):
        p = n * TOPK + j
        e = tl.load(idx_ptr + p).to(tl.int64)
        a_row = act_ptr + p.to(tl.int64) * I
        w_e = w_ptr + e * stride_we
        acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            km = k < I
            av = tl.load(a_row + k, mask=km, other=0.0).to(tl.float32)
            wv = tl.load(w_e + r[:, None] * stride_wr + k[None, :], mask=on[:, None] & km[None, :], other=0.0)
            acc += tl.sum(wv.to(tl.float32) * av[None, :], axis=1)
        # the expert's output in the model's dtype, weighted and summed in float32 (as moe.Experts.gather)
        out += tl.load(wt_ptr + p) * acc.to(dtype).to(tl.float32)
    tl.store(y_ptr + n.to(tl.int64) * D + r, out.to(dtype), mask=on)
