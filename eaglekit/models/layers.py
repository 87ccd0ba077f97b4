"""Building blocks shared by the target decoder and the EAGLE-3 draft.

Shapes: activations are [B, T, D]. A KV cache for one layer is a pair of tensors [B, Hkv, S_max, hd];
new keys are written at `slots` (one slot per new token, shared across the batch; or [B, T], one per row,
for batched decoding over a RowKV) and attention reads
the first S slots, S being the width of the boolean `mask` [B|1, T, S] (True = may attend). So the
caller picks the span: on a CPU it passes S = committed + new (no wasted work), a compiled GPU path
passes S = S_max (fixed shapes, no recompiles).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import GenerationError
from ..kernels import invariant_attention, invariant_gemm, invariant_norm, products
from ..kernels.int8 import Int8Linear
from .config import RopeConfig

# torch.compile'd layers serve calls of at most this many tokens (decode steps, trees, a path's extend);
# longer ones (prompts) run the plain module, so compiling never sees a prompt-length shape
COMPILE_MAX_TOKENS = 64

# cached calls of up to this many tokens fold grouped query heads into query rows (sdpa_folded; folds_gqa says
# which); 0: off
FOLD_GQA_MAX_TOKENS = 64


def folds_gqa(q: torch.Tensor, T: int) -> bool:
    """Whether a cached attention call of T tokens folds grouped query heads into query rows (sdpa_folded). On a GPU
    2..FOLD_GQA_MAX_TOKENS tokens: one token a row stays with enable_gqa (folded, the 8B plain step at 64 rows took
    11.2 ms against 10.6: docs/performance.md#d30). On a CPU in bfloat16 1..FOLD_GQA_MAX_TOKENS: torch's CPU SDPA with
    enable_gqa spends 233 us on one bfloat16 row at the SmolLM2 shape against 48 folded (D63). float32 on a CPU keeps
    enable_gqa: faster there at one row, and the float32 identity rests on its rounding (D60)."""
    if T > FOLD_GQA_MAX_TOKENS:
        return False
    if q.is_cuda:
        return T >= 2
    return q.dtype == torch.bfloat16


def sdpa_folded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention with the query heads that share a kv head folded into the query rows: q [B, H, T, hd]
    runs as [B, Hkv, rep * T, hd] against k, v [B, Hkv, S, hd], the mask [B|1, 1, T, S] repeated for each head of a
    group. The same sums as SDPA's enable_gqa (query head h reads kv head h // rep), but the attention kernel reads
    each kv head once instead of once per query head, and a decode call's few tokens fill its query tiles rep times
    better. With enable_gqa, cuDNN's attention over 64 rows x 1024 slots took 57% of a batched 8B cycle on an H200;
    folded, that cycle ((3,1,4), 64 rows) went from 25.0 to 17.2 ms
    (docs/performance.md#d30). The kernel's output may be strided: reshaped, not viewed."""
    B, H, T, hd = q.shape
    Hkv = k.shape[1]
    rep = H // Hkv
    qf = q.reshape(B, Hkv, rep * T, hd)
    m = None
    if attn_mask is not None:
        Bm, _, _, S = attn_mask.shape
        m = attn_mask[:, :, None].expand(Bm, 1, rep, T, S).reshape(Bm, 1, rep * T, S)
    return F.scaled_dot_product_attention(qf, k, v, attn_mask=m).reshape(B, H, T, hd)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.invariant = False  # products "invariant": one Triton program per row (eaglekit.kernels.invariant_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.invariant and invariant_norm.runs(x):
            return invariant_norm.rms_norm(x, self.weight, self.eps)
        # statistics in float32, as the reference implementations do; weight applied in the input dtype
        dtype = x.dtype
        xf = x if dtype == torch.float32 else x.float()  # (no cast op where there is nothing to cast)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (xf if dtype == torch.float32 else xf.to(dtype))


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "linear":
        inv = inv / rope.factor
    elif rope.kind == "llama3":
        old = rope.original_max_position_embeddings
        low_wl = old / rope.low_freq_factor
        high_wl = old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Rotary(nn.Module):
    """cos / sin for arbitrary (tree) positions, computed per call: T is small, no table to outgrow."""

    inv_freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, head_dim: int, rope: RopeConfig):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, rope), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, T, hd]; cos/sin: [T, hd], [B, T, hd] or already [B, 1, T, hd]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    pending_kernel: Callable[..., torch.Tensor] | None  # (set in __init__)

    def __init__(
        self,
        in_dim: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        out_dim: int,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: bool = False,
        eps: float = 1e-6,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(in_dim, num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(in_dim, num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, out_dim, bias=o_bias)
        self.q_norm: RMSNorm | None
        self.k_norm: RMSNorm | None
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        else:
            self.q_norm = self.k_norm = None
        # set by fuse(): one matmul instead of three (an int8.Int8Linear after a draft's quantize())
        self.qkv_weight: torch.Tensor | nn.Module | None = None
        self.qkv_bias: torch.Tensor | None = None
        self.products = None  # a policy of eaglekit.kernels.products (set_products); None: F.linear
        # the decode attention for calls that pass `pending` (a draft's): an op as
        # eaglekit.kernels.hopper.pending_attention (hopper.pending_op(), set by Eagle3Draft.set_attention); None: SDPA
        self.pending_kernel = None

    def fuse(self) -> None:
        """Inference only: q/k/v weights become row views of one [q; k; v] matrix (no extra memory)."""
        self.qkv_weight = _fuse_rows([self.q_proj, self.k_proj, self.v_proj])
        if self.q_proj.bias is not None:
            self.qkv_bias = _fuse_rows([self.q_proj, self.k_proj, self.v_proj], "bias")

    def forward(
        self, x, cos, sin, kv=None, slots=None, mask=None, extra_kv=None, visible=None, residual=None, pending=None
    ):
        """x [B, T, in] -> (o_proj(attention) + `residual` (if given; added in o's kernel where the policy fuses),
        this call's (k, v)). kv: (k_cache, v_cache) each [B, Hkv, S_max, hd] or None. `visible`:
        eaglekit.kernels.invariant_attention's (slots, count, old) for `mask` and this call's first slot, base: then the
        batch-invariant attention kernel runs instead of SDPA. `pending` = (base [1], block [T, C] bool): `mask` in
        the form a cached call of one sequence has, every slot below base[0] and the pending slots base[0] + c where
        block[t, c], this call's tokens at consecutive slots among them; with `pending_kernel` set (and T, C <= 64)
        that op (bulk's attention) runs on it instead of SDPA (the draft's calls).

        Without a cache, attention is over the T new tokens with `mask` [B|1, T, T] (None = causal).
        `extra_kv` (training only) is a list of earlier (k, v) blocks the queries may also see; the
        mask then spans [T, T * (1 + len(extra_kv))] in the order (extra..., new).
        """
        B, T, _ = x.shape
        q, k, v = self._qkv(x, cos, sin)
        new_kv = (k, v)
        if kv is not None:
            k_cache, v_cache = kv
            S = mask.shape[-1]
            # what the cache stores (and attend reads); no cast op where the dtypes already agree
            k_in = k if k.dtype == k_cache.dtype else k.to(k_cache.dtype)
            v_in = v if v.dtype == v_cache.dtype else v.to(v_cache.dtype)
            # the pending form serves a call without `visible` only (the batch-invariant kernel comes first)
            if visible is None and pending is not None and self.pending_kernel is not None:
                out = self._pending_attention(q, k_in, v_in, kv, S, slots, pending)
                return product_module(self.products, self.o_proj, out, residual), new_kv
            out = None
            if visible is not None:
                # batch-invariant attention, before this call's keys reach the cache: the committed ones are read
                # from the cache, the new ones from k/v, so compiled code need not copy the cache for the op.
                *vis, base = visible
                out = invariant_attention.attend(q, k_cache[:, :, :S], v_cache[:, :, :S], *vis, new=(k_in, v_in, base))
            _write_cache(k_cache, v_cache, slots, k_in, v_in)
            if out is not None:
                out = out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
                return product_module(self.products, self.o_proj, out, residual), new_kv
            k, v = k_cache[:, :, :S], v_cache[:, :, :S]
        elif extra_kv:
            k = torch.cat([e[0] for e in extra_kv] + [k], dim=2)
            v = torch.cat([e[1] for e in extra_kv] + [v], dim=2)
        out = self._sdpa(q, k, v, mask, cached=kv is not None)
        return product_module(self.products, self.o_proj, out, residual), new_kv

    def _qkv(self, x, cos, sin):
        """x [B, T, in] -> q [B, H, T, hd], k and v [B, Hkv, T, hd], q and k rotated (and normed with qk_norm). The
        fused product rotates q and k inside its kernel where its policy takes the rope (takes_rope): then
        apply_rope is skipped, so each of q and k is rotated exactly once either way."""
        B, T, _ = x.shape
        H, Hkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        rope = None
        if self.qkv_weight is not None:
            if (
                self.products is not None
                and self.q_norm is None
                and self.products.takes_rope(x, self.qkv_weight, self.qkv_bias, hd)
            ):
                # the product rotates q and k itself: cos/sin one row per token, as x's rows
                rope = (
                    *((c[:, 0] if c.dim() == 4 else c).expand(B, T, hd).reshape(B * T, hd) for c in (cos, sin)),
                    (H + Hkv) * hd,
                )
            qkv = product(self.products, x, self.qkv_weight, self.qkv_bias, rope=rope)
            if rope is None and self.q_norm is None:
                # q and k rotated in one pass over their heads side by side: the same elementwise products as two
                # apply_rope calls (bit for bit), half the ops (a step's host work is per op where kernels are small)
                qk = qkv[..., : (H + Hkv) * hd].view(B, T, H + Hkv, hd).transpose(1, 2)
                q, k = apply_rope(qk, cos, sin).split([H, Hkv], dim=1)
                return q, k, qkv[..., (H + Hkv) * hd :].view(B, T, Hkv, hd).transpose(1, 2)
            q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = q.view(B, T, H, hd), k.view(B, T, Hkv, hd), v.view(B, T, Hkv, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rope is None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def _pending_attention(self, q, k_in, v_in, kv, S: int, slots, pending):
        """The pending form's attention through `pending_kernel` -> [B, T, H * hd], before o_proj. The op writes this
        call's keys into the cache itself (at slots[0] on: consecutive), so the caller writes none. Shapes outside
        the op's (one sequence, <= 64 rows and columns) raise: the caller may have passed a mask it never filled, so
        SDPA on it is no fallback."""
        B, H, T, hd = q.shape
        k_cache, v_cache = kv
        if not (B == 1 and slots.dim() == 1 and T <= 64 and pending[1].shape[-1] <= 64):
            raise ValueError(
                f"the pending form takes one sequence of <= 64 rows and columns, got B={B}, "
                f"T={T}, block {tuple(pending[1].shape)} (see Eagle3Draft.takes_pending)"
            )
        assert self.pending_kernel is not None  # (forward calls it only with a kernel set)
        rows = q[0].transpose(0, 1).reshape(T, H * hd)
        out = self.pending_kernel(
            rows,
            k_cache[0, :, :S],
            v_cache[0, :, :S],
            k_in[0].transpose(0, 1),
            v_in[0].transpose(0, 1),
            *pending,
            slots[:1],
        )
        return out.view(B, T, H * hd)

    def _sdpa(self, q, k, v, mask, cached: bool):
        """SDPA of q over k, v (the cache's first S slots when `cached`, else this call's keys and any extra_kv)
        -> [B, T, H * hd], before o_proj. `mask` None without a cache is causal. Grouped kv heads: expanded without a
        cache (training and feature paths: SDPA's fused kernels), folded into the query rows for a cached call where
        folds_gqa says so (sdpa_folded), else SDPA's enable_gqa."""
        B, _, T, _ = q.shape
        attn_mask = mask[:, None] if mask is not None else None
        gqa = self.num_kv_heads != self.num_heads
        if gqa and not cached:
            # training and feature paths: expand the kv heads so SDPA may pick its fused kernels
            rep = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            gqa = False
        if gqa and cached and folds_gqa(q, T):
            out = sdpa_folded(q, k, v, attn_mask)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=mask is None and not cached, enable_gqa=gqa
            )
        return out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)


def _write_cache(k_cache, v_cache, slots, k_in, v_in) -> None:
    """This call's keys and values into the cache at `slots`: [T] shared by every row (index_copy_), or [B, T] per
    row (batched decoding: each sequence has its own length; scatter_). One row's [1, T] goes through index_copy_ too:
    the same copy, ~6x cheaper than scatter_ in bfloat16 on a CPU (docs/performance.md#d62). In place: the cache
    tensors are the ones a CUDA graph recorded."""
    B, Hkv, T, hd = k_in.shape
    if slots.dim() == 2 and B == 1:
        slots = slots[0]
    if slots.dim() == 2:  # per-row slots [B, T] (batched decoding: each sequence has its own length)
        idx = slots[:, None, :, None].expand(B, Hkv, T, hd)
        k_cache.scatter_(2, idx, k_in)
        v_cache.scatter_(2, idx, v_in)
    else:
        k_cache.index_copy_(2, slots, k_in)
        v_cache.index_copy_(2, slots, v_in)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

        self.gate_up_weight: torch.Tensor | nn.Module | None = None  # set by fuse() (as qkv_weight)
        self.products = None  # see Attention.products

    def fuse(self) -> None:
        if self.gate_proj.bias is None:
            self.gate_up_weight = _fuse_rows([self.gate_proj, self.up_proj])

    def forward(self, x, residual=None):
        """down(silu(gate(x)) * up(x)) (+ residual: a layer's residual add, done in down's kernel where it can)."""
        if self.gate_up_weight is not None:
            act = product(self.products, x, self.gate_up_weight, gated=True)
            return product_module(self.products, self.down_proj, act, residual)
        return invariant_gemm.epilogue(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), residual)


def product(policy, x, w, b=None, residual=None, gated=False, rope=None):
    """invariant_gemm.epilogue(F.linear(x, w, b), residual, gated), the product as `policy` (eaglekit.kernels.products)
    runs it: a policy that `fuses` does the epilogue (SwiGLU gate, residual add) in the product's kernel, and the rotary
    embedding `rope` where its takes_rope() said so."""
    if isinstance(w, Int8Linear):  # a quantized weight (the draft's, fused) runs its own product, its bias in it
        return w(x, residual=residual, gated=gated)
    if policy is not None and policy.fuses:  # (products.Aten.fuses: every policy says; install_products makes one)
        return policy.linear(x, w, b, residual=residual, gated=gated, **({"rope": rope} if rope else {}))
    return invariant_gemm.epilogue(F.linear(x, w, b) if policy is None else policy.linear(x, w, b), residual, gated)


def product_module(policy, m: nn.Module, x, residual=None):
    """m(x) (+ residual), through `policy` when m is a plain nn.Linear (tensor-parallel linears keep their own
    forward: their all-reduce comes before the residual add)."""
    if isinstance(m, Int8Linear):
        return m(x, residual=residual)
    if policy is None or type(m) is not nn.Linear:
        return invariant_gemm.epilogue(m(x), residual)
    return product(policy, x, m.weight, m.bias, residual)


def set_products(modules, policy) -> None:
    """Run the products of these Attention/MLP modules as `policy` says (None: F.linear); a policy whose decode
    attention is batch-invariant (`policy.attention`) takes the RMSNorms along."""
    for m in modules:
        if isinstance(m, (Attention, MLP)):
            m.products = policy
        elif isinstance(m, RMSNorm):
            m.invariant = policy is not None and policy.attention


def _plain_weight(m: nn.Linear | Int8Linear) -> torch.Tensor | None:
    """A linear's weight, or None for an int8 one (eaglekit.kernels.int8: its int8 rows are no policy's to multiply)."""
    return None if isinstance(m, Int8Linear) else m.weight


def product_weights(modules, heads=()) -> list[torch.Tensor]:
    """The weights a policy is asked to multiply by: the fused q/k/v and o of each Attention, the fused gate/up and
    down of each MLP (unfused modules call their own linears), and the `heads` (lm_head, fc). An int8 draft's
    weights (eaglekit.kernels.int8) are modules of their own: not a policy's to multiply by."""
    out = []
    for m in modules:
        if isinstance(m, Attention):
            out += [m.qkv_weight, _plain_weight(m.o_proj)]
        elif isinstance(m, MLP) and m.gate_up_weight is not None:
            out += [m.gate_up_weight, _plain_weight(m.down_proj)]
    return [w for w in out if isinstance(w, torch.Tensor)] + [h.weight for h in heads if type(h) is nn.Linear]


def install_products(kind, modules, heads=()):
    """Set a policy on these modules (a kind by name, made for their weights, or a policy object made before) and
    return it: what a model's set_products does with its modules and heads (lm_head, fc)."""
    modules = list(modules)
    policy = kind if isinstance(kind, products.Aten) else products.make(kind, product_weights(modules, heads))
    set_products(modules, policy)
    return policy


def _fuse_rows(linears, attr: str = "weight") -> torch.Tensor:
    """Concatenate the linears' weights (or biases) by rows and make each module's own parameter a view
    into the result, so the fused and the separate forms share memory and stay in step."""
    parts = [getattr(m, attr) for m in linears]
    fused = torch.cat([p.detach() for p in parts], dim=0)
    i = 0
    for m, p in zip(linears, parts):
        n = p.shape[0]
        getattr(m, attr).data = fused[i : i + n]
        i += n
    return fused


def span_mask(
    length: torch.Tensor,
    block: torch.Tensor,
    S: int,
    sliding_window: int | None = None,
    depths: torch.Tensor | None = None,
) -> torch.Tensor:
    """[1, T, S] bool for T new tokens written at slots [length, length + T): each sees every committed
    slot (< length) and the new slots its row of `block` [T, T] allows. `length` is a 0-d device tensor, so
    the shapes depend only on (T, S): one CUDA graph serves every step."""
    T = block.shape[0]
    cols = torch.arange(S, device=block.device)
    rel = cols - length
    inside = (rel >= 0) & (rel < T)
    mask = (rel < 0)[None, :] | (inside[None, :] & block[:, rel.clamp(0, T - 1)])
    if sliding_window is not None:
        d = depths if depths is not None else torch.arange(T, device=block.device)
        qpos = length + d
        kpos = torch.where(inside, length + d[rel.clamp(0, T - 1)], cols)
        mask = mask & ((qpos[:, None] - kpos[None, :]) < sliding_window)
    return mask[None]


class KVCache:
    """Static KV cache of one sequence for a stack of layers: k, v [L, 1, Hkv, S_max + 1, hd] (`batch` stays 1): the
    draft's, and a decoder's own cache, which its batch of one runs on as a RowKV view (RowKV.over).

    `length` (a 0-d device tensor) counts committed slots; slots past it hold pending (unverified) or stale
    entries, which masks never expose.
    """

    def __init__(self, num_layers, num_kv_heads, head_dim, max_len, batch=1, device="cpu", dtype=torch.float32):
        # one spare slot, never used: a span S <= max_len is then always shorter than the allocation, so compiled
        # layers see one layout for every span (compiling.span_dynamic)
        shape = (num_layers, batch, num_kv_heads, max_len + 1, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = torch.zeros((), dtype=torch.long, device=device)

    def layer(self, i):
        return self.k[i], self.v[i]


def span_mask_rows(
    length: torch.Tensor,
    block: torch.Tensor,
    S: int,
    sliding_window: int | None = None,
    depths: torch.Tensor | None = None,
) -> torch.Tensor:
    """span_mask with one committed length per row: length [B], block [B|1, T, T], depths [B, T] -> [B, T, S].
    Row b's T new tokens sit at slots [length[b], length[b] + T)."""
    T = block.shape[-1]
    B = length.shape[0]
    block = block.expand(B, T, T)
    cols = torch.arange(S, device=block.device)
    rel = cols[None, :] - length[:, None]  # [B, S]
    inside = (rel >= 0) & (rel < T)
    relc = rel.clamp(0, T - 1)
    seen = block.gather(2, relc[:, None, :].expand(B, T, S))  # [B, T, S]: block[b, t, rel[b, s]]
    mask = (rel < 0)[:, None, :] | (inside[:, None, :] & seen)
    if sliding_window is not None:
        d = depths if depths is not None else torch.arange(T, device=block.device).expand(B, T)
        qpos = length[:, None] + d  # [B, T]
        kpos = torch.where(inside, length[:, None] + d.gather(1, relc), cols[None, :])  # [B, S]
        mask = mask & ((qpos[:, :, None] - kpos[:, None, :]) < sliding_window)
    return mask


def own_row(owner, span: int, over):
    """A batch of one over `owner`'s own one-sequence cache (a target or a draft, reset to `span`), seen through
    `over` (RowKV.over, mla.RowLatent.over): a one-row engine then keeps no second cache, and its state is the owner's
    sequence. The reset runs outside inference mode, so the cache stays an ordinary tensor that reset works on
    anywhere."""
    with torch.inference_mode(False):
        owner.reset(span)
    return over(owner.cache)


class OwnRow:
    """RowKV's interface over a one-sequence backend's own cache (`length` [1], the engine's; `rows`, `keep`,
    `grown`): what the row interface of a backend that holds one sequence hands the engine (Target.row_cache and
    Draft.row_cache by default: the transformers adapter, test doubles), so the one engine runs it as a batch of one.

    The engine moves a row's committed length itself (a chain's commit and a plain step's add to it; a prefill zeroes
    it). The backend keeps its own count; `sync` brings it level before each call: entries the engine committed in
    place are kept (`keep` of the first ones: a static cache adds, the transformers adapter drops what lies past
    them), a zeroed row starts the sequence again. Each sync reads the length on the host: such backends run
    eagerly, never in CUDA graphs."""

    batch = 1
    pos = None  # (RowKV.pos: a one-sequence backend keeps its own positions)

    def __init__(self, owner, span: int, count: Callable[[], int]):
        self.owner, self.span, self._count = owner, span, count  # count(): the owner's committed entries
        owner.reset(span)
        self.length = torch.zeros(1, dtype=torch.long, device=owner.device)

    @classmethod
    def of(cls, owner, batch: int, span: int, count: Callable[[], int], refused: str, fix: str) -> "OwnRow":
        """The row cache a one-sequence backend hands the engine (SequenceTarget's, SequenceDraft's): its sequence as
        a batch of one; more rows refused with E308 (`refused`, `fix`: what the backend is and what to do)."""
        if batch != 1:
            raise GenerationError(refused, fix=fix, code="E308")
        return cls(owner, span, count)

    def rows(self, lo: int, hi: int) -> "OwnRow":
        if (lo, hi) not in ((0, 1), (0, 0)):
            raise IndexError(f"a one-row cache has row 0 only, not rows [{lo}, {hi})")
        return self

    def sync(self) -> None:
        """Bring the owner's committed entries level with the engine's `length` (see the class docstring)."""
        want, have = int(self.length[0]), self._count()
        same_span = self.owner.span == self.span
        if want == have and same_span:
            return
        if want == 0:  # a new sequence in this row (or another engine used the backend in between)
            self.owner.reset(self.span)
            return
        if want < have or not same_span:
            raise RuntimeError(
                f"the backend's sequence changed under its one-row cache ({have} entries, span "
                f"{self.owner.span}; the row expects {want}, span {self.span}): "
                "another engine used it mid-sequence"
            )
        d = want - have
        self.owner.keep(
            torch.arange(d, device=self.length.device), torch.tensor(d, device=self.length.device), in_place=True
        )

    def keep(self, path: torch.Tensor, n: torch.Tensor) -> None:
        self.owner.keep(path[0], n[0])
        self.length += n

    def grown(self, span: int) -> "OwnRow":
        if int(self.length[0]):
            raise RuntimeError("a one-row cache grows only between sequences")
        return OwnRow(self.owner, span, self._count)

    def move(self, src: int, dst: int, upto: int | None = None) -> None:
        raise RuntimeError("a one-row cache has no other row to move")


class RowKV:
    """KV cache with one row per sequence, for batched decoding: k, v [L, B, Hkv, S_max, hd] and a committed
    length per row (`length`, a [B] device tensor). New entries go to per-row slots (a scatter); `keep`
    commits each row's accepted path. `rows(lo, hi)` is a view on a block of rows (shares memory), so a
    batch of b running rows works on rows [0, b) with fixed shapes. `pos` (None unless track_positions ran): the
    position of the entry in each slot [B, S_max + 1], for a sliding window over entries whose slot is not their
    position (a draft tree's pending nodes)."""

    def __init__(
        self, num_layers, num_kv_heads, head_dim, max_len, batch, device="cpu", dtype=torch.float32, _views=None
    ):
        self.pos: torch.Tensor | None = None
        if _views is not None:
            self.k, self.v, self.length, *pos = _views  # (k, v, length[, pos])
            self.pos = pos[0] if pos else None
        else:
            shape = (num_layers, batch, num_kv_heads, max_len + 1, head_dim)  # + a spare slot, as in KVCache
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
            self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.max_len = self.k.shape[3] - 1

    @classmethod
    def over(cls, cache: KVCache, pos: torch.Tensor | None = None) -> "RowKV":
        """One sequence's cache seen as a batch of one row (the same memory; its length a view of the cache's, its
        slot positions of `pos` [S] where given): a one-row engine's state is then the target's or the draft's own
        sequence state."""
        return cls(0, 0, 0, 0, 0, _views=(cache.k, cache.v, cache.length.view(1), None if pos is None else pos[None]))

    def track_positions(self) -> "RowKV":
        """Give the rows their slot positions (`pos`, zeros until written). -> self."""
        self.pos = torch.zeros(self.k.shape[1], self.k.shape[3], dtype=torch.long, device=self.k.device)
        return self

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def rows(self, lo: int, hi: int) -> "RowKV":
        return RowKV(
            0,
            0,
            0,
            0,
            0,
            _views=(
                self.k[:, lo:hi],
                self.v[:, lo:hi],
                self.length[lo:hi],
                None if self.pos is None else self.pos[lo:hi],
            ),
        )

    def layer(self, i):
        return self.k[i], self.v[i]

    def keep(self, path: torch.Tensor, n: torch.Tensor) -> None:
        """Per row b: commit the pending entries at slots length[b] + path[b, :n[b]] (path [B, P] padded)."""
        L, B, H, _, hd = self.k.shape
        P = path.shape[1]
        src = (self.length[:, None] + path)[None, :, None, :, None].expand(L, B, H, P, hd)
        dst = (self.length[:, None] + torch.arange(P, device=path.device))[None, :, None, :, None].expand(
            L, B, H, P, hd
        )
        self.k.scatter_(3, dst, self.k.gather(3, src))  # gather copies first: overlaps are fine
        self.v.scatter_(3, dst, self.v.gather(3, src))
        self.length += n

    def move(self, src: int, dst: int, upto: int | None = None) -> None:
        """Copy row src onto row dst (its first `upto` slots: the rest is never read)."""
        u = self.k.shape[3] if upto is None else min(upto, self.max_len)
        self.k[:, dst, :, :u] = self.k[:, src, :, :u]
        self.v[:, dst, :, :u] = self.v[:, src, :, :u]
        self.length[dst] = self.length[src]
        if self.pos is not None:
            self.pos[dst, :u] = self.pos[src, :u]

    def grown(self, max_len: int) -> "RowKV":
        """A copy with room for `max_len` slots per row (entries and lengths kept)."""
        L, B, H, S, hd = self.k.shape
        new = RowKV(L, H, hd, max_len, B, self.k.device, self.k.dtype)
        new.k[:, :, :, :S] = self.k  # (the spare slot too: never read)
        new.v[:, :, :, :S] = self.v
        new.length.copy_(self.length)
        if self.pos is not None:
            pos = new.track_positions().pos
            assert pos is not None  # (track_positions made it)
            pos[:, : self.pos.shape[1]] = self.pos
        return new
