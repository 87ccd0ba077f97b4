"""A draft tree's pick on a GPU: the top k of softmax(logits) over the draft vocabulary, in two Triton kernels.

Why: torch's softmax + top-k on the tree's [k, 32000] logits runs about ten kernels a level (a softmax, a radix select
over several blocks with its counts and scans, a sort of the k found); these two take a quarter of that time on an
H200 (docs/performance.md#d27). A level is two kernels:
  1. each row is cut into chunks; a program takes one chunk: its top k by repeated max (k is small), its max m_c and
     its sum s_c of exp(x - m_c);
  2. a program per row merges the row's chunks: the top k of the chunks' candidates, and the row's softmax
     denominator S = sum_c s_c exp(m_c - M) with M = max_c m_c, so a pick's probability is exp(x - M) / S, what
     softmax computes (its sums in another order: within a few ulps of torch's).
Ties between equal logits go to the smaller token id. The probabilities only rank candidates (the target verifies
every drafted token), so a few ulps never touch the output.
"""

from __future__ import annotations

import importlib.util

import torch

HAVE_TRITON = importlib.util.find_spec("triton") is not None
BLOCK = 2048  # a chunk: 16 programs a row for a 32000-token draft vocabulary
MAX_K = 32  # the top k is unrolled k times in each kernel; a wider pick goes to torch


def top_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities [..., k] float32, ids [..., k] int64) of the k most likely tokens of softmax(logits), most
    likely first: the Triton kernels on a GPU, torch elsewhere (a CPU, k over MAX_K)."""
    if logits.is_cuda and HAVE_TRITON and k <= MAX_K and k <= logits.shape[-1]:
        return kernel_top_probs(logits, k)
    return torch_top_probs(logits, k)


def top1(logits: torch.Tensor) -> torch.Tensor:
    """A chain's pick, [..., Vd] -> [..., 1]: the top 1 of the softmax, taken as the argmax of the logits (softmax is
    monotone): one reduction kernel where softmax + top-k ran six (a fifth of their time on an H200:
    docs/performance.md#d28). Between logits that tie exactly it may take
    another than top-k took: both are drafts the target checks."""
    return logits.argmax(-1, keepdim=True)


def argmax(logits: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """torch.argmax over the last dimension ([..., V] -> [...]: the first of equal maxima), in two stages where V is a
    multiple of `chunk`: each chunk's max and its first index, then the first chunk holding the largest. Why: the
    target's greedy pick over an 8B model's 128256 logits is one program walking the row in torch's one-stage
    reduction, several times slower than two stages (docs/performance.md#d29)."""
    V = logits.shape[-1]
    if V < 8 * chunk or V % chunk:
        return logits.argmax(-1)
    m, i = logits.unflatten(-1, (V // chunk, chunk)).max(-1)
    j = m.argmax(-1, keepdim=True)
    return (j * chunk + i.gather(-1, j)).squeeze(-1)


def ranks(v: torch.Tensor) -> torch.Tensor:
    """Each entry's place in v [n] sorted descending, ties by index (0 the largest): by comparing all pairs, for the
    tree's small vectors (16 children a level, ~70 candidates), where torch's topk and sort are two or three kernels
    each (~10 us a level on an H200) and these comparisons fuse into the bookkeeping's own kernels when compiled."""
    idx = torch.arange(v.numel(), device=v.device)
    before = (v[None, :] > v[:, None]) | ((v[None, :] == v[:, None]) & (idx[None, :] < idx[:, None]))
    return before.sum(1)


def _index_at(places: torch.Tensor, k: int) -> torch.Tensor:
    """For r in 0..k-1 the index i with places[i] == r (each r held by exactly one entry)."""
    at = places[None, :] == torch.arange(k, device=places.device)[:, None]  # [k, n]
    return (at * torch.arange(places.numel(), device=places.device)).sum(1)


def small_topk(v: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """v.topk(k) for a small vector v [n]: (values, indices), largest first, ties by index."""
    pick = _index_at(ranks(v), k)
    return v[pick], pick


def small_top_sorted(v: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of v's k largest (ties by index) in increasing order: v.topk(k).indices.sort().values."""
    chosen = ranks(v) < k
    return _index_at(torch.where(chosen, chosen.cumsum(0) - 1, -1), k)  # a chosen entry's place among the chosen


def torch_top_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """top_probs in torch: a softmax over the vocabulary, then its top k (the CPU's pick; the kernels' reference)."""
    return torch.softmax(logits.float(), -1).topk(k, dim=-1)


def kernel_top_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """top_probs through the kernels, whatever the device (tests run them in Triton's interpreter on the CPU)."""
    return _launch(logits, k)


def _launch(logits: torch.Tensor, k: int, wrap=lambda kernel: kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """The two kernels on logits [..., V]; `wrap`: torch.library.wrap_triton inside the registered op."""
    import triton

    from . import topk_triton

    lead, V = logits.shape[:-1], logits.shape[-1]
    x = logits.reshape(-1, V).contiguous()
    R, CH = x.shape[0], triton.cdiv(V, BLOCK)
    dev = x.device
    vals = torch.empty(R, CH, k, dtype=torch.float32, device=dev)
    ids = torch.empty(R, CH, k, dtype=torch.int32, device=dev)
    m = torch.empty(R, CH, dtype=torch.float32, device=dev)
    s = torch.empty(R, CH, dtype=torch.float32, device=dev)
    p_out = torch.empty(R, k, dtype=torch.float32, device=dev)
    i_out = torch.empty(R, k, dtype=torch.int64, device=dev)
    wrap(topk_triton.chunk_top)[(R, CH)](x, vals, ids, m, s, V, CH=CH, K=k, BLOCK=BLOCK, num_warps=4)
    wrap(topk_triton.merge_top)[(R,)](
        vals,
        ids,
        m,
        s,
        p_out,
        i_out,
        V,
        CH=CH,
        K=k,
        CB=triton.next_power_of_2(CH),
        NB=triton.next_power_of_2(CH * k),
        num_warps=1,
    )
    return p_out.view(*lead, k), i_out.view(*lead, k)


_OP = None


def probs_op():
    """top_probs as a registered op (torch.library.triton_op): inside torch.compile's graphs (a draft's whole tree,
    Eagle3Draft.tree_rows) inductor keeps its two kernels and fuses the bookkeeping around them, and CUDA graphs
    record them. Fetch it before any trace (as invariant_gemm.kernels: the registration reads its files). Returns
    op(logits [R, V], k) -> (probabilities [R, k] float32, ids [R, k] int64), what kernel_top_probs returns."""
    global _OP
    if _OP is None:
        from torch.library import triton_op

        from . import topk_triton
        from .compiling import op_name

        @triton_op(op_name("top_probs", __file__, topk_triton.__file__), mutates_args=())
        def top_probs_kernels(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
            from torch.library import wrap_triton

            return _launch(logits, k, wrap_triton)

        _OP = top_probs_kernels
    return _OP
