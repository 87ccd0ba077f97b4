"""The EAGLE-3 draft: fc + one decoder layer over [embedding, hidden] + norm + lm_head on a draft vocab.

    features (C x H_t) --fc--> h (H)          only for target features; later steps feed h back
      norm_before_fc: input_norm (one RMSNorm over all C x H_t) first          (vLLM, speculators: gpt-oss)
      fc_norm:        fc_norm.i (one RMSNorm per captured layer, H_t each) first (SpecForge, speculators,
                      SGLang, vLLM); with both, input_norm runs first, as in vLLM
    e = input_layernorm(embed(token)), h' = hidden_norm(h), x = cat([e, h'])   (2H wide)
    h = h (or h' with norm_before_residual) + o_proj(attn(x));  h = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h)) over draft_vocab;  the pre-norm h is what the next step receives
      (norm_output, "EAGLE 3.1" in speculators and vLLM: the normed one is).
    sliding_window: the draft layer's query at position q sees keys at positions k with q - k < window
      (vLLM / transformers' rule), set when the layer config marks it "sliding_attention".

Draft ids map to target ids through d2t offsets: target_id = i + d2t[i].

The network alone (weights and the eager forward: what training runs and what the runner compiles); the runner that
decodes with it (caches, compiled graphs and walks, quantization, the Draft interface) is eaglekit.draft.model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..capture import CaptureSpec
from ..errors import ContractError
from ..models.config import RopeConfig
from ..models.layers import MLP, Attention, RMSNorm, Rotary, product_module
from ..observe import trace


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int  # the target's vocabulary (embedding rows)
    draft_vocab_size: int
    target_hidden_size: int | None = None  # None: same as hidden_size
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 4096
    capture: CaptureSpec | None = None  # None: not recorded; resolved to the target's default when paired
    num_captures: int = 3
    norm_before_residual: bool = False
    norm_before_fc: bool = False  # one RMSNorm over the whole fc input (weight input_norm.weight)
    fc_norm: bool = False  # one RMSNorm per captured layer before fc (weights fc_norm.{i}.weight)
    norm_output: bool = False  # EAGLE 3.1: the hidden fed to the next draft step is the post-norm one
    sliding_window: int | None = None  # the draft layer's attention window (None: full attention)
    attention_bias: bool = False
    fc_bias: bool = False
    target_fingerprint: str | None = None
    target_vocab_size: int | None = None
    target_num_layers: int | None = None
    target_tokenizer: str | None = None  # fingerprint of the tokenizer + chat template trained with
    vocab_map_sha: str | None = None  # hash of the d2t the lm_head was trained with
    features: dict | None = None  # feature fingerprint of the training data per slot (eaglekit.train.fingerprint)
    target_weights: dict | None = None  # fingerprint of the target's weights (eaglekit.train.fingerprint)

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_heads
        if self.capture is not None:
            self.num_captures = self.capture.num_captures

    @property
    def t_hidden(self) -> int:
        return self.target_hidden_size or self.hidden_size

    @property
    def fc_in(self) -> int:
        return self.num_captures * self.t_hidden


class DraftLayer(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        H = c.hidden_size
        assert c.head_dim is not None  # (DraftConfig.__post_init__ resolves it)
        self.norm_before_residual = c.norm_before_residual
        self.self_attn = Attention(
            2 * H, c.num_heads, c.num_kv_heads, c.head_dim, H, qkv_bias=c.attention_bias, o_bias=c.attention_bias
        )
        self.mlp = MLP(H, c.intermediate_size)
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps)

    def forward(self, emb, h, cos, sin, kv=None, slots=None, mask=None, extra_kv=None, pending=None):
        if self.norm_before_residual:
            h = self.hidden_norm(h)
            residual = h
        else:
            residual = h
            h = self.hidden_norm(h)
        x = torch.cat([self.input_layernorm(emb), h], dim=-1)
        if trace.ENABLED:
            trace.record("draft.concat", x, width=x.shape[-1])
        h, new_kv = self.self_attn(x, cos, sin, kv, slots, mask, extra_kv, residual=residual, pending=pending)
        return self.mlp(self.post_attention_layernorm(h), residual=h), new_kv


class Eagle3Network(nn.Module):
    """The EAGLE-3 draft's network (module docstring). Its state besides the weights is what the forward reads:
    the products' policy (None: F.linear) and, for a sliding window over a cache, the slots' positions."""

    d2t: torch.Tensor  # buffers (register_buffer)
    t2d: torch.Tensor

    def __init__(self, c: DraftConfig):
        super().__init__()
        assert c.head_dim is not None  # (DraftConfig.__post_init__ resolves it)
        self.config = c
        H = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen
        self.fc = nn.Linear(c.fc_in, H, bias=c.fc_bias)
        self.input_norm = RMSNorm(c.fc_in, c.rms_norm_eps) if c.norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(RMSNorm(c.t_hidden, c.rms_norm_eps) for _ in range(c.num_captures)) if c.fc_norm else None
        )
        self.midlayer = DraftLayer(c)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(c.vocab_size, dtype=torch.bool)
            if c.draft_vocab_size == c.vocab_size
            else torch.zeros(c.vocab_size, dtype=torch.bool),
        )
        self.rotary = Rotary(c.head_dim, c.rope)
        self.products = None  # the fc's, the layer's and the lm_head's products policy (the runner's set_products)
        # position of each cache slot [B, S] (sliding window over a cache only): the rows' own (RowKV.pos) while a
        # rows call runs (eaglekit.draft.model), else None
        self.slot_pos: torch.Tensor | None = None

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """Target features [.., C*H_t] -> [.., H]. Refuses a width the fc was not trained on."""
        if feats.shape[-1] != self.fc.in_features:
            # last line of defence; pair checks (eaglekit.draft.check_pair) name the layers before this
            Ht, got = self.config.t_hidden, feats.shape[-1]
            got_s = f"{got} = {got // Ht} x {Ht}" if got % Ht == 0 else str(got)
            raise ContractError(
                f"draft fc expects {self.fc.in_features} = {self.config.num_captures} x {Ht} features but received "
                f"{got_s}",
                fix="capture exactly the layers the draft was trained on",
                code="E202",
            )
        if trace.ENABLED:
            layers = list(self.config.capture.after_layers) if self.config.capture else None
            trace.record("draft.input.features", feats, layers=layers)
        x = self.input_norm(feats) if self.input_norm is not None else feats
        if self.fc_norm is not None:
            x = torch.cat([n(chunk) for n, chunk in zip(self.fc_norm, x.chunk(len(self.fc_norm), dim=-1))], dim=-1)
        h = product_module(self.products, self.fc, x)
        if trace.ENABLED:
            trace.record("draft.input.fc", h)
        return h

    def forward(
        self,
        hidden,
        ids,
        positions,
        kv=None,
        slots=None,
        mask=None,
        from_target=True,
        extra_kv=None,
        head_at=None,
        pending=None,
    ):
        """hidden [B, T, C*H_t] (from_target) or [B, T, H] (own output); ids [B, T] target ids.

        Returns (h [B, T, H] pre-norm, logits [B, T, draft_vocab], new (k, v)). `head_at` [B] (long): only row
        head_at[b] of each sequence goes through the norm and the lm_head, and h and logits are [B, 1, ..] (an
        extend needs its last entry's: the head's product then runs on 1 row instead of T). `pending`: the mask as
        (base, block), for the decode attention the runner's set_attention picks (eaglekit.models.layers.Attention)."""
        if from_target:
            h = self.project(hidden)
        else:
            h = hidden
            if trace.ENABLED:
                trace.record("draft.input.hidden", h)
        emb = self.embed_tokens(ids).to(h.dtype)
        if trace.ENABLED:
            trace.record("draft.input.embedding", emb)
        cos, sin = self.rotary(positions, h.dtype)
        if self.config.sliding_window is not None:
            mask = self._window(positions, slots, mask, extra_kv)
        return self._layer(emb, h, cos, sin, kv, slots, mask, extra_kv, head_at, pending)

    def _layer(self, emb, h, cos, sin, kv, slots, mask, extra_kv, head_at, pending):
        """The forward's layer and head after its inputs (the runner's may run them as a compiled graph)."""
        return self._layer_and_head(emb, h, cos, sin, kv, slots, mask, extra_kv, head_at, pending)

    def _whole(self, hidden, ids, positions, kv, slots, mask, from_target: bool, head_at=None, pending=None):
        """forward without tracing, a sliding window or extra_kv: what compile() compiles whole."""
        h = self.project(hidden) if from_target else hidden
        cos, sin = self.rotary(positions, h.dtype)
        return self._layer_and_head(
            self.embed_tokens(ids).to(h.dtype), h, cos, sin, kv, slots, mask, head_at=head_at, pending=pending
        )

    def _layer_and_head(
        self, emb, h, cos, sin, kv=None, slots=None, mask=None, extra_kv=None, head_at=None, pending=None
    ):
        """The layer, the norm and the lm_head: what compile() compiles (the head's product, the largest weight the
        draft reads per step, then becomes one kernel with the norm)."""
        h, new_kv = self.midlayer(emb, h, cos, sin, kv, slots, mask, extra_kv, pending)
        if head_at is not None:
            h = h.gather(1, head_at.view(-1, 1, 1).expand(h.shape[0], 1, h.shape[-1]))
        hn = self.norm(h)
        return (hn if self.config.norm_output else h), product_module(self.products, self.lm_head, hn), new_kv

    def _window(self, positions, slots, mask, extra_kv):
        """`mask` narrowed to keys less than sliding_window positions behind each query. With a cache the
        keys' positions come from `slot_pos` (written here for the new slots: a tree node's slot is not its
        position); without one the keys are the new tokens (and each earlier block of extra_kv)."""
        W = self.config.sliding_window
        if slots is not None and self.slot_pos is not None:  # rows: slots [B, T], slot_pos [B, S]
            self.slot_pos.scatter_(1, slots, positions)
            kpos = self.slot_pos[:, : mask.shape[-1]]  # [B, S]
            return mask & ((positions[:, :, None] - kpos[:, None, :]) < W)
        kpos = torch.cat([positions] * (1 + len(extra_kv or ())), dim=-1)
        if mask is None:  # causal over the new tokens
            T = positions.shape[-1]
            mask = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril_()[None]
        near = (positions[..., :, None] - kpos[..., None, :]) < W
        return mask & (near if near.dim() == 3 else near[None])

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
