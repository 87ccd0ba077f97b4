"""Our compact Llama-family decoder (Llama incl. llama3 rope, Mistral, Qwen2, Qwen3) with a static KV cache.

Parameter names match the Hugging Face checkpoints, so a folder's safetensors load with no renaming.
The residual stream after any layer can be captured (CaptureSpec.after_layers); -1 is the embedding.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

import torch
import torch.nn as nn

from ..kernels import invariant_attention
from ..kernels.compiling import in_prompt, span_dynamic
from ..kernels.products import compiles_any_length
from .base import StaticCacheTarget, TargetInfo, take_last
from .config import TargetConfig, load_target_config
from .layers import (
    COMPILE_MAX_TOKENS,
    MLP,
    Attention,
    KVCache,
    RMSNorm,
    Rotary,
    RowKV,
    install_products,
    own_row,
    product_module,
    product_weights,
    span_mask_rows,
)
from .weights import load_state_dict_into, read_folder_tensors


class DecoderLayer(nn.Module):
    def __init__(self, c: TargetConfig):
        super().__init__()
        self.self_attn = Attention(
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.hidden_size,
            qkv_bias=c.qkv_bias,
            o_bias=c.o_bias,
            qk_norm=c.qk_norm,
            eps=c.rms_norm_eps,
        )
        self.mlp = MLP(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, kv=None, slots=None, mask=None, visible=None):
        # the residual adds are handed to the products (o, down), whose kernels do them where the policy fuses
        x, _ = self.self_attn(self.input_layernorm(x), cos, sin, kv, slots, mask, visible=visible, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class _Body(nn.Module):
    def __init__(self, c: TargetConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaModel(nn.Module):
    """The network itself: ids -> (final normed hidden, captured residual streams)."""

    def __init__(self, c: TargetConfig):
        super().__init__()
        self.config = c
        self.model = _Body(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(c.head_dim, c.rope)
        self.compiled_layer = None  # set by LlamaTarget.compile()
        self.prompt_layer = None  # set by LlamaTarget.compile_prompts()
        self.products = None  # the lm_head's policy; set by LlamaTarget.set_products()

    def forward(
        self,
        ids,
        positions,
        cache: KVCache | None = None,
        slots=None,
        mask=None,
        capture: tuple[int, ...] = (),
        block=None,
        span=None,
    ):
        """ids [B, T]; positions [T] or [B, T]. Returns (normed hidden [B, T, H], features [B, T, C*H] | None).
        `block` [T, T] and `span` instead of slots and mask: a decode call of one sequence through products "hopper"
        (its T tokens at slots cache.length + t, each seeing the committed prefix and the tokens its row of block
        allows; no key at or past `span`)."""
        x = self.model.embed_tokens(ids)
        caught = {}
        if -1 in capture:
            caught[-1] = x
        if block is not None:
            return self._hopper_layers(x, positions, cache, block, span, capture, caught)
        cos, sin = self.rotary(positions, x.dtype)
        if cos.dim() == 3:  # per-row positions: [B, 1, T, hd], broadcast over the heads once for every layer
            cos, sin = cos[:, None], sin[:, None]
        # the compiled layer serves the fixed small shapes of decoding; prompts run plain, or through the one graph
        # compiled for every length (prompt_layer)
        small = ids.shape[1] <= COMPILE_MAX_TOKENS
        prompt = in_prompt()
        fast = self.compiled_layer if (self.compiled_layer is not None and small and not prompt) else None
        any_length = (
            self.prompt_layer
            if prompt
            and ids.shape[0] == 1
            and ids.shape[1] > 1
            and cache is not None
            and compiles_any_length(self.products)
            else None
        )
        # batch-invariant attention (products "invariant"): each row's visible slots, found once for all layers
        vis = None
        if (
            small
            and cache is not None
            and mask is not None
            and self.products is not None
            and self.products.attention
            and invariant_attention.usable(x, self.config.head_dim)
        ):
            # base: this call's first slot (its T tokens go to base, base + 1, ...: LlamaTarget writes at L + arange(T))
            base = slots[:, 0] if slots.dim() == 2 else slots[:1]
            vis = (*invariant_attention.visible(mask, base), base)
        for i, layer in enumerate(self.model.layers):
            kv = cache.layer(i) if cache is not None else None
            if fast:
                kv = span_dynamic(mask, kv, vis)
            call = fast or any_length
            x = call(layer, x, cos, sin, kv, slots, mask, vis) if call else layer(x, cos, sin, kv, slots, mask, vis)
            if i in capture:
                caught[i] = x
        return self._finish(x, caught, capture)

    def _finish(self, x, caught, capture):
        feats = torch.cat([caught[i] for i in capture], dim=-1) if capture else None
        return self.model.norm(x), feats

    def _hopper_layers(self, x, positions, cache, block, span, capture, caught):
        """forward's layers for a decode call of one sequence through eaglekit.kernels.hopper (products "hopper"): no
        mask, no cos/sin tables (the kernels read the tree block and compute the rotary angles themselves)."""
        c, kern = self.config, self.products.layer_kernels
        T = x.shape[1]
        scratch = kern.scratch(T, span, c.num_kv_heads, c.num_heads // c.num_kv_heads)
        pos, block = positions.reshape(T).contiguous(), block.contiguous()
        inv_freq = self.rotary.inv_freq.float().contiguous()
        x = kern.layers(
            self.model.layers, x, pos, inv_freq, cache.layer, cache.length.view(1), block, scratch, capture, caught
        )
        return self._finish(x, caught, capture)


class LlamaTarget(StaticCacheTarget):
    """A target backed by our compact decoder."""

    backend = "ours"
    compiles = True
    takes_products = True
    cfg: TargetConfig  # (its own decoder's: never None here)

    def __init__(self, net: LlamaModel, device, dtype):
        self.net = net.eval()
        self.cfg = net.config
        self.device, self.dtype = torch.device(device), dtype
        c = self.cfg
        self.info = TargetInfo(
            c.family,
            c.vocab_size,
            c.hidden_size,
            c.num_layers,
            c.max_position_embeddings,
            c.eos_token_ids,
            c.fingerprint,
        )
        self.cache: KVCache | None = None

    @classmethod
    def from_folder(cls, folder, device="cpu", dtype=torch.float32) -> "LlamaTarget":
        folder = Path(folder)
        cfg = load_target_config(folder)
        with torch.device("meta"):
            net = LlamaModel(cfg)
        tensors = read_folder_tensors(folder, "target")
        if cfg.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        load_state_dict_into(
            net,
            tensors,
            folder,
            dtype=dtype,
            device=device,
            tied={"lm_head.weight": "model.embed_tokens.weight"} if cfg.tie_word_embeddings else {},
        )
        net.rotary = Rotary(cfg.head_dim, cfg.rope).to(device)
        target = cls(net, device, dtype)
        target.fuse()
        return target

    # --- Target interface --------------------------------------------------------------------------
    static = True

    def reset(self, span: int) -> None:
        c = self.net.config  # the KV heads this process holds (a tensor-parallel rank: its share)
        if self.cache is None or self.cache.max_len < span:
            self.cache = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, span, 1, self.device, self.dtype)
        self.cache.length.zero_()
        self.span = span

    # --- batched decoding ----------------------------------------------------------------------------
    def row_cache(self, batch: int, span: int) -> RowKV:
        if batch == 1:  # a batch of one is the target's own sequence (the one-request Decoder's)
            return own_row(self, span, RowKV.over)
        c = self.net.config  # the KV heads this process holds (a tensor-parallel rank: its share)
        return RowKV(c.num_layers, c.num_kv_heads, c.head_dim, span, batch, self.device, self.dtype)

    @torch.inference_mode()
    def _forward_rows(self, kv, ids, depths, block, span, capture=None, last=False):
        B, T = ids.shape
        L = kv.length
        layers = capture.validate(self.cfg.num_layers).after_layers if capture is not None else ()
        kern = self.net.products.layer_kernels if self.net.products is not None else None
        if kern is not None and B == 1 and T <= COMPILE_MAX_TOKENS:
            # products "hopper" on one row (a RowKV row has KVCache's layout): its kernels take the block itself
            h, feats = self.net(ids, L[:, None] + depths, kv, capture=layers, block=block[0], span=span)
        else:
            slots = L[:, None] + torch.arange(T, device=self.device)
            mask = span_mask_rows(L, block, span, self.cfg.sliding_window, depths)
            h, feats = self.net(ids, L[:, None] + depths, kv, slots, mask, layers)
        return product_module(self.net.products, self.net.lm_head, take_last(h, last)).float(), feats

    def compile(self, options: dict | None = None) -> None:
        """torch.compile the decoder layer for the decode shapes (one compiled graph per token count, shared
        by every layer; the engine then records the compiled kernels in its CUDA graphs). GPU only.
        `options`: inductor options (None: eaglekit.kernels.compiling.decode_options, by the layer's width). Prompts:
        compile_prompts."""
        from ..kernels.compiling import compile_decode

        self.net.compiled_layer = compile_decode(DecoderLayer.forward, options, self.cfg.hidden_size)

    def compile_prompts(self, on: bool = True) -> None:
        """Prompts through one graph of the layer compiled for every length (compiling.compile_prompt), or (off)
        through the plain layers again; the decode graphs stay as they are."""
        from ..kernels.compiling import compile_prompt

        self.net.prompt_layer = compile_prompt(DecoderLayer.forward) if on else None

    def set_products(self, kind) -> None:
        """How the decode products run: a kind of eaglekit.kernels.products (None/"aten" F.linear, "onednn" prepacked
        weights on a CPU, "invariant" or "hopper" batch-invariant on a GPU) or a policy object made for this model.
        Call after fuse()."""
        self.net.products = install_products(kind, self.net.modules(), [self.net.lm_head])

    def product_weights(self) -> list[torch.Tensor]:
        """The weights a products policy multiplies by (what onednn packs)."""
        return product_weights(self.net.modules(), [self.net.lm_head])

    @property
    def products(self) -> str:
        return "aten" if self.net.products is None else self.net.products.name

    @property
    def compiled_prompts(self) -> bool:
        return self.net.prompt_layer is not None

    @property
    def compiled_layers(self) -> bool:
        return self.net.compiled_layer is not None

    @property
    def batch_invariant(self) -> bool:
        """Whether a decode row's bits are independent of the rows computed with it (the products' policy)."""
        return self.net.products is not None and self.net.products.batch_invariant

    def fuse(self) -> None:
        """Fused q/k/v and gate/up projections for inference (same memory, fewer kernels)."""
        for layer in cast(Iterable[DecoderLayer], self.net.model.layers):
            layer.self_attn.fuse()
            layer.mlp.fuse()

    @torch.no_grad()
    def features(self, ids, pad_mask=None, capture=None):
        # batches are right-padded, so plain causal attention is exact for every real token
        pos = torch.arange(ids.shape[1], device=ids.device)
        layers = capture.validate(self.cfg.num_layers).after_layers if capture is not None else ()
        return self.net(ids, pos, None, None, None, layers)

    def lm_head_weight(self):
        return self.net.lm_head.weight

    def embed_weight(self):
        return self.net.model.embed_tokens.weight
