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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from ..capture import CaptureSpec
from ..errors import ContractError, InputError
from ..kernels.compiling import in_prompt, span_dynamic
from ..kernels.products import compiles_any_length
from ..models.config import RopeConfig
from ..models.layers import (
    COMPILE_MAX_TOKENS,
    MLP,
    Attention,
    KVCache,
    RMSNorm,
    Rotary,
    RowKV,
    own_row,
    product_module,
    span_mask,
    span_mask_rows,
)
from ..observe import trace
from .base import Draft
from .layer_walks import LayerWalks


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
        self.self_attn = Attention(2 * H, c.num_heads, c.num_kv_heads, c.head_dim, H,
                                   qkv_bias=c.attention_bias, o_bias=c.attention_bias)
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


class Eagle3Draft(nn.Module, Draft):
    d2t: torch.Tensor  # buffers (register_buffer)
    t2d: torch.Tensor
    # the compiled graphs (compile(), compile_prompts()); None: eager
    compiled_layer: Callable[..., Any] | None
    compiled_whole: Callable[..., Any] | None
    compiled_prompt: Callable[..., Any] | None
    quantizes = True

    def __init__(self, c: DraftConfig):
        super().__init__()
        assert c.head_dim is not None  # (DraftConfig.__post_init__ resolves it)
        self.config = c
        H = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # the target's embedding, frozen
        self.fc = nn.Linear(c.fc_in, H, bias=c.fc_bias)
        self.input_norm = RMSNorm(c.fc_in, c.rms_norm_eps) if c.norm_before_fc else None
        self.fc_norm = (nn.ModuleList(RMSNorm(c.t_hidden, c.rms_norm_eps) for _ in range(c.num_captures))
                        if c.fc_norm else None)
        self.midlayer = DraftLayer(c)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if c.draft_vocab_size == c.vocab_size
                             else torch.zeros(c.vocab_size, dtype=torch.bool))
        self.rotary = Rotary(c.head_dim, c.rope)
        self.cache: KVCache | None = None
        # position of each cache slot (sliding window only): the one sequence's [S], or while a rows call runs the
        # rows' own [B, S] (_rows_forward)
        self.slot_pos: torch.Tensor | None = None
        self.source_format = None  # (Draft.source_format: set by load_draft)
        self.compiled_layer = self.compiled_whole = None  # by compile()
        self.compiled_prompt = None  # by compile_prompts()
        self.walks = LayerWalks()  # the chain and tree walks over the layer, compiled by compile()
        self.products = None  # the fc's and lm_head's policy; set by set_products()
        self.quantized = None  # "int8" after quantize()
        self._one: torch.Tensor | None = None  # a chain step's pending block [[True]] (made by set_attention)
        self._consts: dict = {}  # small constants of the decode calls (aranges, causal blocks, ...), made once

    # --- the network -------------------------------------------------------------------------------
    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """Target features [.., C*H_t] -> [.., H]. Refuses a width the fc was not trained on."""
        if feats.shape[-1] != self.fc.in_features:
            # last line of defence; pair checks (eaglekit.draft.check_pair) name the layers before this
            Ht, got = self.config.t_hidden, feats.shape[-1]
            got_s = f"{got} = {got // Ht} x {Ht}" if got % Ht == 0 else str(got)
            raise ContractError(
                f"draft fc expects {self.fc.in_features} = {self.config.num_captures} x {Ht} features but received "
                f"{got_s}", fix="capture exactly the layers the draft was trained on", code="E202")
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

    def forward(self, hidden, ids, positions, kv=None, slots=None, mask=None, from_target=True, extra_kv=None,
                head_at=None, pending=None):
        """hidden [B, T, C*H_t] (from_target) or [B, T, H] (own output); ids [B, T] target ids.

        Returns (h [B, T, H] pre-norm, logits [B, T, draft_vocab], new (k, v)). `head_at` [B] (long): only row
        head_at[b] of each sequence goes through the norm and the lm_head, and h and logits are [B, 1, ..] (an
        extend needs its last entry's: the head's product then runs on 1 row instead of T). `pending`: the mask as
        (base, block), for the decode attention set_attention picks (eaglekit.models.layers.Attention)."""
        prompt = in_prompt()
        if (self.compiled_prompt is not None and prompt and ids.shape[0] == 1 and ids.shape[1] > 1 and not trace.ENABLED
                and extra_kv is None and self.config.sliding_window is None and compiles_any_length(self.products)):
            # one row's extend over a prompt or a catch-up window: the whole forward as one graph for every length
            # (several rows' catch-up stays eager: a graph of its own would compile while requests wait). The one
            # row's features and ids re-viewed with the strides a prompt's have: a catch-up's are slices of the
            # engine's window, whose row stride the graph would compile once more for (contiguous() keeps a size-1
            # dimension's stride)
            return self.compiled_prompt(self, hidden[0].unsqueeze(0), ids[0].unsqueeze(0), positions, kv, slots, mask,
                                        from_target, head_at, pending)
        if (self.compiled_whole is not None and not trace.ENABLED and extra_kv is None and not prompt
                and self.config.sliding_window is None and ids.shape[1] <= COMPILE_MAX_TOKENS):
            # the fc, the embedding and the rotary's cos/sin inside the compiled graph too: inductor fuses them into
            # the layer's own kernels, where eager code ran ~6 small kernels a draft step; tracing (which
            # records them) and a sliding window (which writes slot positions) take the path below
            kv = span_dynamic(mask, kv)
            return self.compiled_whole(self, hidden, ids, positions, kv, slots, mask, from_target, head_at, pending)
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
        if (self.compiled_layer is not None and extra_kv is None and ids.shape[1] <= COMPILE_MAX_TOKENS
                and not prompt):
            kv = span_dynamic(mask, kv)
            return self.compiled_layer(self, emb, h, cos, sin, kv, slots, mask, head_at=head_at, pending=pending)
        return self._layer_and_head(emb, h, cos, sin, kv, slots, mask, extra_kv, head_at, pending)

    def _whole(self, hidden, ids, positions, kv, slots, mask, from_target: bool, head_at=None, pending=None):
        """forward without tracing, a sliding window or extra_kv: what compile() compiles whole."""
        h = self.project(hidden) if from_target else hidden
        cos, sin = self.rotary(positions, h.dtype)
        return self._layer_and_head(self.embed_tokens(ids).to(h.dtype), h, cos, sin, kv, slots, mask, head_at=head_at,
                                    pending=pending)

    def _layer_and_head(self, emb, h, cos, sin, kv=None, slots=None, mask=None, extra_kv=None, head_at=None,
                        pending=None):
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
        if slots is not None and self.slot_pos is not None and self.slot_pos.dim() == 2:  # rows: slots [B, T]
            self.slot_pos.scatter_(1, slots, positions)
            kpos = self.slot_pos[:, : mask.shape[-1]]  # [B, S]
            return mask & ((positions[:, :, None] - kpos[:, None, :]) < W)
        if slots is not None and self.slot_pos is not None:
            self.slot_pos.index_copy_(0, slots, positions.reshape(-1))
            kpos = self.slot_pos[: mask.shape[-1]]
        else:
            kpos = torch.cat([positions] * (1 + len(extra_kv or ())), dim=-1)
            if mask is None:  # causal over the new tokens
                T = positions.shape[-1]
                mask = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril_()[None]
        near = (positions[..., :, None] - kpos[..., None, :]) < W
        return mask & (near if near.dim() == 3 else near[None])

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # --- the Draft interface (decoding state, batch 1) ---------------------------------------------
    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def committed(self) -> torch.Tensor:
        assert self.cache is not None  # (a sequence is read after `reset`)
        return self.cache.length

    def storage_key(self) -> tuple:
        assert self.cache is not None  # (a sequence is read after `reset`)
        return (self.span, self.cache.uid)

    def reset(self, span: int) -> None:
        c, p = self.config, self.norm.weight  # (the fc's weight may be int8: quantize)
        if self.cache is None or self.cache.max_len < span or self.cache.k.dtype != p.dtype:
            self.cache = KVCache(1, c.num_kv_heads, c.head_dim, span, 1, p.device, p.dtype)
        if c.sliding_window is not None and (self.slot_pos is None or self.slot_pos.numel() < self.cache.max_len):
            self.slot_pos = torch.zeros(self.cache.max_len, dtype=torch.long, device=p.device)
        self.cache.length.zero_()
        self.span = span

    def fuse(self) -> None:
        self.midlayer.self_attn.fuse()
        self.midlayer.mlp.fuse()

    def set_products(self, kind) -> None:
        """See LlamaTarget.set_products (the fc, the layer and the lm_head). A quantized draft's products are its
        own (eaglekit.kernels.int8): it keeps F.linear's policy for anything else."""
        from ..models.layers import install_products

        if self.quantized is not None:
            kind = None
        self.products = install_products(kind, self.midlayer.modules(), [self.fc, self.lm_head])

    def quantize(self, mode: str = "int8") -> None:
        """Inference only: the fc, the layer's products and the lm_head as weight-only int8 (eaglekit.draft.quant)."""
        from .quant import quantize_draft

        quantize_draft(self, mode)

    def set_attention(self, kind: str = "sdpa") -> bool:
        """The decode attention of the draft's cached calls (extend, tree levels, chain steps): "sdpa" (torch's), or
        "hopper" (eaglekit.kernels.hopper.pending_attention: the verify's attention kernel, keys split in 32-key parts;
        cuDNN's SDPA does not split them at a few rows and took about twice as long a tree level at the 8B shape:
        docs/performance.md#d12) where
        it runs this draft; elsewhere "sdpa" stays. -> whether "hopper" runs. Like the products, it changes the
        draft's rounding only, never the output (the target verifies)."""
        from ..kernels import hopper

        if kind not in ("sdpa", "hopper"):
            raise InputError(f"draft attention {kind!r} is not sdpa or hopper", code="E108", fix="pass sdpa or hopper")
        c, p = self.config, self.norm.weight
        assert c.head_dim is not None  # (DraftConfig.__post_init__ resolves it)
        on = kind == "hopper" and c.sliding_window is None and hopper.draft_reason(
            c.num_heads, c.num_kv_heads, c.head_dim, p.device, p.dtype) is None
        if on:  # the op and its kernels made now, not at a first call that a CUDA graph's capture may be recording
            try:
                hopper.kernels_for(p.device)
            except hopper.Unavailable:  # (a build that failed: SDPA serves, as products fall back to invariant)
                on = False
        self.midlayer.self_attn.pending_kernel = hopper.pending_op() if on else None
        self._one = torch.ones(1, 1, dtype=torch.bool, device=p.device) if on else None
        return on

    @property
    def attention(self) -> str:
        """The decode attention set_attention picked: "hopper" or "sdpa"."""
        return "sdpa" if self.midlayer.self_attn.pending_kernel is None else "hopper"

    def takes_pending(self, cols: int) -> bool:
        """Draft.takes_pending: with set_attention("hopper"), blocks of up to 64 pending columns (its kernel's)."""
        return self.midlayer.self_attn.pending_kernel is not None and cols <= 64

    def _arange(self, E: int) -> torch.Tensor:
        """arange(E) on the draft's device, made once per E (an extend's slots: one kernel a cycle fewer)."""
        return self._const(("arange", E), lambda dev: torch.arange(E, device=dev))

    def _causal(self, E: int) -> torch.Tensor:
        """An extend's block: its E entries causal among themselves (made once per E)."""
        return self._const(("causal", E), lambda dev: torch.ones(E, E, dtype=torch.bool, device=dev).tril_())

    def _unread_mask(self, T: int, span: int | None = None) -> torch.Tensor:
        """A [1, T, span] stand-in for the mask where the attention takes the pending form and reads no mask: it
        carries the span's size (span_dynamic, the layer) and costs no kernel (an expanded view; its values are
        False: were it ever read, it would hide every key, not pass for a mask). Default span: the own cache's."""
        return self._const(("unread",), lambda dev: torch.zeros(1, 1, 1, dtype=torch.bool, device=dev)).expand(
            1, T, self.span if span is None else span)

    def _const(self, key: tuple, make) -> torch.Tensor:
        """self._consts[key] on the draft's device, made by make(device) the first time (read only)."""
        key = key + (str(self.device),)
        if key not in self._consts:
            self._consts[key] = make(self.device)
        return self._consts[key]

    def compile(self, options: dict | None = None) -> None:
        """torch.compile for the small fixed decode shapes (GPU; see LlamaTarget.compile): the whole forward (fc,
        embedding, rotary, layer, head), a chain's steps as one graph, and the layer and head alone (what traced or
        sliding-window calls run). Extends over a prompt: compile_prompts."""
        from ..kernels.compiling import compile_decode

        self.compiled_layer = compile_decode(Eagle3Draft._layer_and_head, options)  # (traced or windowed calls)
        self.compiled_whole = compile_decode(Eagle3Draft._whole, options)
        self.walks.compile(options)

    def compile_prompts(self, on: bool = True) -> None:
        """Extends over a prompt through one graph of the whole forward compiled for every length
        (compiling.compile_prompt), or (off) eagerly again; the decode graphs stay as they are."""
        from ..kernels.compiling import compile_prompt

        self.compiled_prompt = compile_prompt(Eagle3Draft._whole) if on else None

    @torch.inference_mode()
    def extend(self, feats: torch.Tensor, next_ids: torch.Tensor, n: torch.Tensor | None = None):
        """Commit entries for target positions [m, m + n): feature g_p with the token at p + 1.

        `feats` [E, C*H_t] and `next_ids` [E] may be padded past `n` (fixed shapes for CUDA graphs):
        padded entries are written past the new committed length and never seen. Returns the pre-norm
        hidden [H] and logits [Vd] of entry n - 1, which seed the next tree."""
        E = next_ids.numel()
        dev = self.device
        assert self.cache is not None  # (a sequence is extended after `reset`)
        m = self.cache.length
        if n is None:
            n = torch.full((), E, dtype=torch.long, device=dev)
        slots = m + self._arange(E)
        if self.takes_pending(E):  # (no mask to build: ~8 small kernels a cycle)
            mask, pending = self._unread_mask(E), (m.view(1), self._causal(E))
        else:
            mask, pending = span_mask(m, self._causal(E), self.span), None
        h, logits, _ = self(feats.to(self.dtype)[None], next_ids[None], slots, self.cache.layer(0), slots,
                            mask, from_target=True, head_at=(n - 1).view(1), pending=pending)
        self.cache.length += n
        return h[0, 0], logits[0, 0].float()

    @torch.inference_mode()
    def step(self, hidden, ids, positions, slots, mask, pending=None, widen: bool = True):
        """Pending (uncommitted) entries for tree nodes: own hidden in, written at `slots`; mask [K, span] (None
        where takes_pending says `pending` serves: Draft.takes_pending). Logits float32, or with widen=False in the
        draft's dtype."""
        if pending is not None and not self.takes_pending(pending[1].shape[-1]):
            pending = None
        if mask is None:
            if pending is None:
                raise ValueError("Eagle3Draft.step: no mask, and no pending form this draft's attention takes")
            mask = self._unread_mask(ids.shape[0])[0]
        assert self.cache is not None  # (a sequence steps after `reset`)
        h, logits, _ = self(hidden[None], ids[None], positions, self.cache.layer(0), slots, mask[None],
                            from_target=False, pending=pending)
        return h[0], logits[0].float() if widen else logits[0]

    # --- batched decoding (one cache row per sequence; eaglekit.decoding.engine) -------------------------
    def row_cache(self, batch: int, span: int) -> RowKV:
        if batch == 1:  # a batch of one is the draft's own sequence (its slot positions too)
            return own_row(self, span, lambda cache: RowKV.over(cache, self.slot_pos))
        c, p = self.config, self.norm.weight
        kv = RowKV(1, c.num_kv_heads, c.head_dim, span, batch, p.device, p.dtype)
        return kv.track_positions() if c.sliding_window is not None else kv

    def _rows_forward(self, kv: RowKV, *args, **kwargs):
        """The forward of a rows call. A sliding window reads the positions of the slots it attends over (a tree
        node's slot is not its position): while the call runs, the rows' own (kv.pos) stand in for the one
        sequence's. Without a window (kv.pos None) it is the forward alone."""
        if kv.pos is None:
            return self(*args, **kwargs)
        own, self.slot_pos = self.slot_pos, kv.pos
        try:
            return self(*args, **kwargs)
        finally:
            self.slot_pos = own

    @torch.inference_mode()
    def extend_rows(self, kv: RowKV, feats: torch.Tensor, next_ids: torch.Tensor, n: torch.Tensor, span: int):
        """`extend` per row: row b commits n[b] entries (feats [B, E, C*H_t], next_ids [B, E], padded past n[b])
        -> pre-norm hidden [B, H] and logits [B, Vd] (float32) of each row's entry n[b] - 1. A row with n = 0
        writes only invisible slots and returns junk (padding rows)."""
        B, E = next_ids.shape
        m = kv.length
        if B == 1 and self.takes_pending(E):  # one row: `extend`'s pending form (no mask to build)
            slots, pending = m + self._arange(E), (m, self._causal(E))
            mask = self._unread_mask(E, span)
        else:
            slots, pending = m[:, None] + torch.arange(E, device=next_ids.device), None
            causal = torch.ones(1, E, E, dtype=torch.bool, device=next_ids.device).tril_()
            mask = span_mask_rows(m, causal, span)
        h, logits, _ = self._rows_forward(kv, feats.to(self.dtype), next_ids, slots, kv.layer(0), slots, mask,
                                          from_target=True, head_at=(n - 1).clamp(min=0), pending=pending)
        kv.length += n
        return h[:, 0], logits[:, 0].float()

    @property
    def batched(self) -> bool:
        """Draft.batched: many rows at once (a sliding window's slot positions kept per row: row_cache)."""
        return True

    def _walks_row(self, kv: RowKV) -> bool:
        """Whether a row cache's chain or tree runs the one-sequence walk (compiled where the draft is, else the same
        walk eagerly): one row, and the walk allowed (LayerWalks.whole); else the engine walks over step_rows."""
        return kv.batch == 1 and self.walks.whole(self)

    @torch.inference_mode()
    def chain_rows(self, kv: RowKV, h_last, logits_last, steps: int, root, span: int) -> torch.Tensor | None:
        """A chain for one row as one walk over the layer (draft.layer_walks; kv: a one-row RowKV view; h_last [1, H],
        logits_last [1, Vd], root [1]) -> the tree's tokens [1, steps + 1]: the compiled graph where the draft is
        compiled (the whole chain one graph, its root and id map inside), the same walk eagerly elsewhere (a row's
        cache is laid out as KVCache's); None for more than one row, under tracing (it records the steps' tensors) or
        with a sliding window (_walks_row: then eaglekit.decoding.tree walks the rows over step_rows)."""
        if not self._walks_row(kv):
            return None
        return self.walks.chain(self, kv.layer(0), kv.length[0], span, h_last, logits_last[0], steps, root[0])[None]

    @torch.inference_mode()
    def tree_rows(self, kv: RowKV, h_last, logits_last, root, frame: tuple, steps: int, n_sel: int,
                  span: int) -> tuple | None:
        """A tree for one row as one walk over the layer (draft.walk's rule; compiled or eager as chain_rows: compiled,
        the levels, picks and bookkeeping are one graph, where inductor fuses the bookkeeping into the layer's kernels:
        docs/performance.md#d25) -> (tokens, parents, depths, mask) each with a row dimension of 1; None where
        chain_rows gives None."""
        if not self._walks_row(kv):
            return None
        grown = self.walks.tree(self, kv.layer(0), kv.length[0], span, h_last[0], logits_last[0], root[0], frame, steps,
                                n_sel)
        return tuple(x[None] for x in grown)

    @torch.inference_mode()
    def step_rows(self, kv: RowKV, hidden, ids, positions, slots, mask):
        """`step` per row: hidden [B, K, H], ids/positions/slots [B, K], mask [B, K, span] -> (h, logits float32)."""
        h, logits, _ = self._rows_forward(kv, hidden, ids, positions, kv.layer(0), slots, mask, from_target=False)
        return h, logits.float()
