"""Decode attention whose result for a query row is the same bits whether the row comes alone (a baseline step) or
as one of k rows of a verify tree: the attention half of bf16 losslessness (issue "Fast v2", item 4).

Why: SDPA picks other kernels and other key splits for 1 query row and for k, so a token verified in a tree rounds
differently from the same token stepped alone; in bf16 that flips a greedy choice now and then
(docs/performance.md#d17). Batch-invariant products (eaglekit.kernels.invariant_gemm) are the other
half.

How: each (query row, KV head, part) is its own program, so rows never share a reduction. A row's visible keys are taken
in *logical* order: the committed prefix, then its tree ancestors and itself (`visible`: the True slots of its mask
row, ascending), so a tree token at depth d walks the same key sequence as the baseline token at that position,
whose keys sit in consecutive slots. Keys go in chunks of CHUNK logical positions dealt round-robin to PARTS
programs (a long context still spreads over the GPU), each by blocks of BLOCK_N with an online softmax, and
`attend_merge` adds a row's parts in order. Chunk and block boundaries are logical positions, the tile shapes depend
on the model's heads only: nothing depends on how many rows there are or where a row's keys lie in the cache. A row
that sees the whole committed prefix (every decode row of one sequence) finds its k-th key at slot k and reads the
cache without the slot table, one dependent load fewer per tile; the keys and their order are the same. Masked
keys of a partial block contribute exact zeros, which leaves every sum's bits unchanged. Grids and buffers do not
depend on the span either (under torch.compile it is a symbolic size, and CUDA graphs keep a launch's grid).

GPU (or Triton's interpreter in tests) only; fp32 inputs use IEEE products (no tf32 rounding).
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import torch

from .invariant_gemm import HAVE_TRITON

CHUNK = 128  # logical keys per chunk: fixed, so a row's split does not depend on the rows beside it
PARTS = 16  # programs per (row, KV head): part p takes chunks p, p + PARTS, ...; the parts are merged in order
BLOCK_N = 64  # keys per inner step
WARPS = 4  # per attend_part program
# rows that see the whole committed prefix read its keys without the slot table (invariant_attention_triton)
DIRECT = True
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def usable(x: torch.Tensor, head_dim: int) -> bool:
    """Whether `attend` can run a model whose activations look like x (Triton on CUDA, or its interpreter in tests;
    bf16/fp16/fp32; a head_dim up to 256)."""
    if not HAVE_TRITON or x.dtype not in _DTYPES or head_dim > 256:
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def visible(
    mask: torch.Tensor, base: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """mask [B, T, S] bool -> (slots [B, T, S] int32: each row's visible slots first, ascending; count [B, T] int32;
    old [B, T] int32: how many of them lie below base [B|1], i.e. are read from the cache when `attend` gets this
    call's keys apart; None without base). Fixed shapes, no host sync (CUDA graphs record it). Compute it once per
    forward: every layer shares it."""
    B, T, S = mask.shape
    rank = mask.cumsum(-1, dtype=torch.int32)
    dst = torch.where(mask, rank.long() - 1, S)  # hidden slots land in a spare column, dropped below
    slots = torch.zeros(B, T, S + 1, dtype=torch.int32, device=mask.device)
    slots.scatter_(-1, dst, torch.arange(S, dtype=torch.int32, device=mask.device).expand(B, T, S))
    count = rank[..., -1].contiguous()
    if base is None:
        return slots[..., :S], count, None
    below = torch.arange(S, device=mask.device) < base.view(-1, 1, 1)
    return slots[..., :S], count, (mask & below).sum(-1, dtype=torch.int32)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
    count: torch.Tensor,
    old: torch.Tensor | None = None,
    new: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Softmax attention of q [B, H, T, hd] over k, v [B, Hkv, S, hd] (H a multiple of Hkv), each row t reading the
    keys at slots[b, t, :count[b, t]] in that order (`visible`; slots/count/old may have batch 1 for all rows).
    `new` = (k_new, v_new [B, Hkv, T, hd], base [B|1]): slots from base[b] on are read from k_new/v_new at slot - base
    instead of k/v (this call's tokens, not yet written to the cache); `old` must then come from visible(mask, base).
    q, k_new and v_new may be strided views (head_dim innermost; v_new laid out as k_new), as a verify's q/k/v product
    gives them: read in place. Returns [B, H, T, hd] in q's dtype, over [B, T, H, hd] memory."""
    if new is None:  # every slot from the cache
        new = (k[:, :, :1], v[:, :, :1], torch.full((1,), k.shape[2], dtype=torch.long, device=k.device))
        old = count
    elif old is None:
        raise ValueError("attend: with `new` keys, pass `old` from visible(mask, base) (which keys the cache holds)")
    return kernels().op(q, k, v, *new, slots, count, old)


_KERNELS = None


def kernels():
    """`.op` (torch.library.triton_op: torch.compile sees its kernels, CUDA graphs record them); built on first use,
    so importing eaglekit never needs Triton."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _build()
    return _KERNELS


def _build():
    import triton
    from torch.library import triton_op, wrap_triton

    from . import invariant_attention_triton
    from .compiling import op_name
    from .invariant_attention_triton import attend_merge, attend_part

    def run(q, k, v, k_new, v_new, base, slots, count, old, wrap=lambda f: f):
        B, H, T, hd = q.shape
        rep = H // k.shape[1]
        block_d = max(16, triton.next_power_of_2(hd))
        block_m = max(16, triton.next_power_of_2(rep))
        # nothing here depends on the span S (a symbolic size under torch.compile): grids and buffers are static
        q, new, seen = _as_read(q, k, v, (k_new, v_new, base), (slots, count, old))
        acc = torch.empty(B * T, H, PARTS, block_d, device=q.device, dtype=torch.float32)
        ml = torch.empty(B * T, H, PARTS, 2, device=q.device, dtype=torch.float32)
        # [B, H, T, hd] over [B, T, H, hd] memory: the caller's transpose back to [B, T, H * hd] is a view
        out = torch.empty(B, T, H, hd, device=q.device, dtype=q.dtype).transpose(1, 2)
        _attend_parts(wrap(attend_part), q, k, v, new, seen, (acc, ml), (block_m, block_d))
        wrap(attend_merge)[(B * T, H)](
            acc,
            ml,
            out,
            T,
            H,
            hd,
            out.stride(0),
            out.stride(1),
            out.stride(2),
            BLOCK_D=block_d,
            PARTS=PARTS,
            num_warps=1,
        )
        return out

    @triton_op(op_name("invariant_attention", __file__, invariant_attention_triton.__file__), mutates_args=())
    def invariant_attention(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        base: torch.Tensor,
        slots: torch.Tensor,
        count: torch.Tensor,
        old: torch.Tensor,
    ) -> torch.Tensor:
        return run(q, k, v, k_new, v_new, base, slots, count, old, wrap_triton)

    return SimpleNamespace(op=invariant_attention, run=run)


# run's helpers stay in this file: the op's name carries its digest (compiling.op_name), so a change to them renames it
def _as_read(q, k, v, new, seen):
    """q, new = (k_new, v_new, base) and seen = (slots, count, old) laid out as the kernels read them."""
    k_new, v_new, base = new
    slots, count, old = seen
    # q, k_new and v_new are strided views of the q/k/v product's output in a verify (T > 1): the kernels take
    # their strides, so no copy of them runs (three kernels a layer fewer: docs/performance.md#d18); only head_dim
    # must be innermost and v_new laid out as k_new (one set of strides for both)
    q = q if q.stride(-1) == 1 else q.contiguous()
    if k_new.stride(-1) != 1 or v_new.stride() != k_new.stride():
        k_new, v_new = k_new.contiguous(), v_new.contiguous()
    slots = slots if slots.stride(-1) == 1 else slots.contiguous()
    count, old, base = count.contiguous(), old.contiguous(), base.contiguous()
    assert k.stride(-1) == 1 and v.stride(-1) == 1, "the KV cache's head_dim must be its innermost dimension"
    return q, (k_new, v_new, base), (slots, count, old)


def _attend_parts(kernel, q, k, v, new, seen, partials, blocks) -> None:
    """Launches `kernel` (attend_part) over every (query row, KV head, part): each writes its part's accumulator and
    softmax (max, sum) to partials = (acc, ml), which attend_merge adds in order. new and seen as _as_read gives them;
    blocks = (BLOCK_M, BLOCK_D)."""
    B, H, T, hd = q.shape
    Hkv = k.shape[1]
    rep = H // Hkv
    k_new, v_new, base = new
    slots, count, old = seen
    acc, ml = partials
    block_m, block_d = blocks
    # a batch of 1 serves every row: stride 0 along the batch
    ssb = slots.stride(0) if slots.shape[0] > 1 else 0
    scb = count.stride(0) if count.shape[0] > 1 else 0
    sbb = 1 if base.shape[0] > 1 else 0
    sgb = old.stride(0) if old.shape[0] > 1 else 0
    kernel[(B * T, Hkv, PARTS)](
        q,
        k,
        v,
        k_new,
        v_new,
        base,
        slots,
        count,
        old,
        acc,
        ml,
        T,
        H,
        hd,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        k_new.stride(0),
        k_new.stride(1),
        k_new.stride(2),
        sbb,
        ssb,
        slots.stride(1),
        scb,
        sgb,
        SCALE=(1.0 / math.sqrt(hd)) * 1.4426950408889634,
        REP=rep,
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_D=block_d,
        CHUNK=CHUNK,
        PARTS=PARTS,
        IEEE=q.dtype == torch.float32,
        DIRECT=DIRECT,
        num_warps=WARPS,
    )
