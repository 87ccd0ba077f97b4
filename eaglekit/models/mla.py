"""Multi-head latent attention (DeepSeek-V2/V3) in its decode form, and the latent cache it reads.

The cache holds, per layer and token, what MLA's keys and values are made of: the compressed latent c
(kv_lora_rank wide, after kv_a_layernorm) and the rotated rope part of the key k_pe (qk_rope_head_dim wide, one
for all heads), side by side in one row of kv_lora_rank + qk_rope_head_dim values (576 for DeepSeek-V3: 1.1 KB a
layer and token in bf16, where full K/V would take 128 heads x (192 + 128)). Nothing else is cached.

Decode calls (T <= ABSORB_MAX_TOKENS) attend in the absorbed form: with kv_b_proj's rows split per head into
W_UK [H, nope, kvr] and W_UV [H, v, kvr], q_nope . k_nope = (q_nope W_UK) . c, so each head's query becomes a
kvr-wide vector that is scored against the cached latents directly; the weighted sum of latents then goes through
W_UV and o_proj. Every query row of every head reads the same cached rows (one MQA-like head), and no per-token
key or value is ever expanded. Longer calls (prompts, feature extraction) expand the latents to per-head keys and
values once and use SDPA: for T queries over S keys the expanded form does fewer flops.

Rope layout: DeepSeek's checkpoints store the rope part of q and k as interleaved pairs (x0, x1), (x2, x3), ...
(rope_interleave); each pair is rotated by one frequency and the result is kept as [rotated evens | rotated odds],
as transformers' DeepSeek-V3 does. q and k share that layout, so their dot product is the reference's (V2's complex
form keeps the pairs interleaved: the same dot product).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .deepseek_config import DeepSeekConfig, mla_inv_freq
from .layers import RMSNorm, _fuse_rows

# calls of at most this many tokens attend in the absorbed form (decode steps, verifies, batched rows)
ABSORB_MAX_TOKENS = 64


class MLARotary(nn.Module):
    """cos / sin [.., T, rope_dim / 2] for arbitrary (tree) positions, YaRN's attention factor folded in."""

    inv_freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, c: DeepSeekConfig):
        super().__init__()
        inv, att = mla_inv_freq(c.qk_rope_head_dim, c.rope)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.attention_factor = att
        self.fp32 = c.family == "deepseek_v2"  # V2 rotates in float32 (complex), V3 in the model dtype

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float()[..., None] * self.inv_freq.float()
        cos, sin = freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor
        out = torch.float32 if self.fp32 else dtype
        return cos.to(out), sin.to(out)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate x [.., dr] (pairs interleaved, or halves) -> [rotated firsts | rotated seconds] in x's dtype."""
    dt = x.dtype
    x = x.to(cos.dtype)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(dt)


class MLA(nn.Module):
    """Parameter names as transformers' DeepseekV3Attention / DeepseekV2Attention (the checkpoints' names)."""

    def __init__(self, c: DeepSeekConfig):
        super().__init__()
        self.c = c
        H, D = c.num_heads, c.hidden_size
        self.H, self.dn, self.dr, self.dv, self.kvr = (
            H,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            c.kv_lora_rank,
        )
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(D, H * c.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(D, c.q_lora_rank, bias=c.attention_bias)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank)  # eps 1e-6, as the reference (not rms_norm_eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, H * c.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, c.kv_lora_rank + c.qk_rope_head_dim, bias=c.attention_bias)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * c.v_head_dim, D, bias=c.attention_bias)
        self.scale = c.softmax_scale
        self.qa_weight = None  # set by fuse(): the two products of the layer's input as one

    def fuse(self) -> None:
        """Inference only: q_proj (or q_a_proj, with q_lora) and kv_a_proj_with_mqa both read the layer's input;
        their weights become row views of one matrix and a call runs one product instead of two (a decode step's
        products are GEMVs, each a kernel with its own ramp). Without biases only (attention_bias)."""
        first = self.q_proj if self.c.q_lora_rank is None else self.q_a_proj
        if first.bias is None and self.kv_a_proj_with_mqa.bias is None:
            self.qa_weight = _fuse_rows([first, self.kv_a_proj_with_mqa])

    def _inputs(self, x):
        """-> (q [B, T, H (nope + rope)], the compressed kv [B, T, kv_lora_rank], k_pe [B, T, rope])."""
        kvr, dr = self.kvr, self.dr
        if self.qa_weight is not None:
            q, kv = F.linear(x, self.qa_weight).split([self.qa_weight.shape[0] - kvr - dr, kvr + dr], dim=-1)
            if self.c.q_lora_rank is not None:
                q = self.q_b_proj(self.q_a_layernorm(q))
        else:
            q = self.q_proj(x) if self.c.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
            kv = self.kv_a_proj_with_mqa(x)
        c, k_pe = kv.split([kvr, dr], dim=-1)
        return q, c, k_pe

    def forward(self, x, cos, sin, kv=None, slots=None, mask=None):
        """x [B, T, D] -> o_proj(attention) [B, T, D]. kv: this layer's cache rows [B, S_max + 1, kvr + dr] (or
        None: attention over the T tokens themselves, causal or `mask` [B|1, T, T]); this call's latent rows are
        written at `slots` ([T] shared, or [B, T] per row) and attention reads the first S slots, S the width of
        `mask` [B|1, T, S] (True: may attend)."""
        B, T, _ = x.shape
        H, dn, dr, kvr = self.H, self.dn, self.dr, self.kvr
        q, c, k_pe = self._inputs(x)
        q_nope, q_pe = q.view(B, T, H, dn + dr).split([dn, dr], dim=-1)
        il = self.c.rope_interleave
        q_pe = rope(q_pe, cos.unsqueeze(-2), sin.unsqueeze(-2), il)
        new = torch.cat([self.kv_a_layernorm(c), rope(k_pe, cos, sin, il)], dim=-1)  # [B, T, kvr + dr]
        if kv is not None:
            new = new.to(kv.dtype)
            if slots.dim() == 2:  # per-row slots (batched decoding)
                kv.scatter_(1, slots[:, :, None].expand(B, T, kvr + dr), new)
            else:
                kv.index_copy_(1, slots, new)
            rows = kv[:, : mask.shape[-1]]
        else:
            rows = new
        if kv is not None and T <= ABSORB_MAX_TOKENS:
            out = self._absorbed(q_nope, q_pe, rows, mask)
        else:
            out = self._expanded(q_nope, q_pe, rows, mask)
        return self.o_proj(out.reshape(B, T, H * self.dv))

    def _w(self):
        """kv_b_proj's weight per head: W_UK [H, nope, kvr] and W_UV [H, v, kvr] (views, no copy)."""
        w = self.kv_b_proj.weight.view(self.H, self.dn + self.dv, self.kvr)
        return w[:, : self.dn], w[:, self.dn :]

    def _absorbed(self, q_nope, q_pe, rows, mask):
        B, T, H, _ = q_nope.shape
        S = rows.shape[1]
        w_uk, w_uv = self._w()
        q_lat = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)  # [B, T, H, kvr]
        qf = torch.cat([q_lat, q_pe], dim=-1).reshape(B, T * H, self.kvr + self.dr)
        scores = torch.bmm(qf, rows.transpose(1, 2)).view(B, T, H, S) * self.scale
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        # a finite floor, not -inf: a query that may see nothing then averages finite rows instead of turning NaN,
        # and a masked slot's weight is still exactly 0 (exp underflows)
        scores = scores.masked_fill(~mask[:, :, None, :], torch.finfo(scores.dtype).min)
        p = scores.softmax(-1).to(rows.dtype).view(B, T * H, S)
        o_lat = torch.bmm(p, rows[..., : self.kvr]).view(B, T, H, self.kvr)
        return torch.einsum("bthc,hvc->bthv", o_lat, w_uv)  # [B, T, H, v]

    def _expanded(self, q_nope, q_pe, rows, mask):
        B, T, H, _ = q_nope.shape
        S = rows.shape[1]
        kvb = self.kv_b_proj(rows[..., : self.kvr]).view(B, S, H, self.dn + self.dv)
        k_nope, v = kvb.split([self.dn, self.dv], dim=-1)
        k = torch.cat([k_nope, rows[..., self.kvr :][:, :, None, :].expand(B, S, H, self.dr)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)
        attn_mask = mask[:, None] if mask is not None else None
        out = F.scaled_dot_product_attention(
            q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, is_causal=mask is None, scale=self.scale
        )
        return out.transpose(1, 2)  # [B, T, H, v]


class LatentCache:
    """Static MLA cache of one sequence: kv [L, B, S_max + 1, kvr + dr] and a committed length (a 0-d device tensor);
    the decoder's batch of one runs on it as a RowLatent view (RowLatent.over). Slots past `length` hold pending or
    stale rows, which masks never expose."""

    def __init__(self, num_layers, width, max_len, batch=1, device="cpu", dtype=torch.float32):
        # one spare slot, never used (as layers.KVCache: a span S <= max_len is always shorter than the allocation)
        self.kv = torch.zeros(num_layers, batch, max_len + 1, width, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = torch.zeros((), dtype=torch.long, device=device)

    def layer(self, i):
        return self.kv[i]


class RowLatent:
    """The latent cache with one row per sequence (batched decoding, eaglekit.decoding.engine): kv [L, B, S_max + 1,
    W], a committed length per row ([B]); the interface of layers.RowKV (rows, keep, move, grown)."""

    def __init__(self, num_layers, width, max_len, batch, device="cpu", dtype=torch.float32, _views=None):
        if _views is not None:
            self.kv, self.length = _views
        else:
            self.kv = torch.zeros(num_layers, batch, max_len + 1, width, device=device, dtype=dtype)
            self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.max_len = self.kv.shape[2] - 1

    @classmethod
    def over(cls, cache: LatentCache) -> "RowLatent":
        """One sequence's cache seen as a batch of one row (as layers.RowKV.over)."""
        return cls(0, 0, 0, 0, _views=(cache.kv, cache.length.view(1)))

    @property
    def batch(self) -> int:
        return self.kv.shape[1]

    def rows(self, lo: int, hi: int) -> "RowLatent":
        return RowLatent(0, 0, 0, 0, _views=(self.kv[:, lo:hi], self.length[lo:hi]))

    def layer(self, i):
        return self.kv[i]

    def keep(self, path: torch.Tensor, n: torch.Tensor) -> None:
        """Per row b: commit the pending rows at slots length[b] + path[b, :n[b]] (path [B, P] padded)."""
        L, B, _, W = self.kv.shape
        P = path.shape[1]
        src = (self.length[:, None] + path)[None, :, :, None].expand(L, B, P, W)
        dst = (self.length[:, None] + torch.arange(P, device=path.device))[None, :, :, None].expand(L, B, P, W)
        self.kv.scatter_(2, dst, self.kv.gather(2, src))  # gather copies first: overlaps are fine
        self.length += n

    def move(self, src: int, dst: int, upto: int | None = None) -> None:
        u = self.kv.shape[2] if upto is None else min(upto, self.max_len)
        self.kv[:, dst, :u] = self.kv[:, src, :u]
        self.length[dst] = self.length[src]

    def grown(self, max_len: int) -> "RowLatent":
        L, B, S, W = self.kv.shape
        new = RowLatent(L, W, max_len, B, self.kv.device, self.kv.dtype)
        new.kv[:, :, :S] = self.kv
        new.length.copy_(self.length)
        return new
