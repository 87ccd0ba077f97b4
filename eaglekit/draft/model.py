"""The EAGLE-3 draft as the decoding engine runs it: the network (eaglekit.draft.network) with the row caches it
makes for the engine (row_cache; the engine holds them), the graphs compile() and compile_prompts() make, its walks
(draft.layer_walks), its products and decode attention, and int8 quantization (draft.quant). Training makes no graph,
so its calls run the network's eager forward; the runner adds no module, so a checkpoint holds the network's weights
and config only.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..errors import InputError
from ..kernels.compiling import in_prompt, span_dynamic
from ..kernels.products import compiles_any_length
from ..models.layers import COMPILE_MAX_TOKENS, RowKV, span_mask_rows
from ..observe import trace
from .base import Draft
from .layer_walks import LayerWalks
from .network import DraftConfig, DraftLayer, Eagle3Network

__all__ = ["DraftConfig", "DraftLayer", "Eagle3Draft", "Eagle3Network"]


class Eagle3Draft(Eagle3Network, Draft):
    # the compiled graphs (compile(), compile_prompts()); None: eager
    compiled_layer: Callable[..., Any] | None
    compiled_whole: Callable[..., Any] | None
    compiled_prompt: Callable[..., Any] | None
    quantizes = True

    def __init__(self, c: DraftConfig):
        super().__init__(c)
        self.source_format = None  # (Draft.source_format: set by load_draft)
        self.compiled_layer = self.compiled_whole = None  # by compile()
        self.compiled_prompt = None  # by compile_prompts()
        self.walks = LayerWalks()  # the chain and tree walks over the layer, compiled by compile()
        self.quantized = None  # "int8" after quantize()
        self._one: torch.Tensor | None = None  # a chain step's pending block [[True]] (made by set_attention)
        self._consts: dict = {}  # small constants of the decode calls (aranges, causal blocks, ...), made once

    # --- the forward through the compiled graphs where they serve ------------------------------------
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
        """Eagle3Network.forward, through a compiled graph where one is made for the call's shape; tracing (which
        records the inputs), a sliding window (which writes slot positions) and extra_kv run eagerly."""
        prompt = in_prompt()
        if (
            self.compiled_prompt is not None
            and prompt
            and ids.shape[0] == 1
            and ids.shape[1] > 1
            and not trace.ENABLED
            and extra_kv is None
            and self.config.sliding_window is None
            and compiles_any_length(self.products)
        ):
            # one row's extend over a prompt or a catch-up window: the whole forward as one graph for every length
            # (several rows' catch-up stays eager: a graph of its own would compile while requests wait). The one
            # row's features and ids re-viewed with the strides a prompt's have: a catch-up's are slices of the
            # engine's window, whose row stride the graph would compile once more for (contiguous() keeps a size-1
            # dimension's stride)
            return self.compiled_prompt(
                self,
                hidden[0].unsqueeze(0),
                ids[0].unsqueeze(0),
                positions,
                kv,
                slots,
                mask,
                from_target,
                head_at,
                pending,
            )
        if (
            self.compiled_whole is not None
            and not trace.ENABLED
            and extra_kv is None
            and not prompt
            and self.config.sliding_window is None
            and ids.shape[1] <= COMPILE_MAX_TOKENS
        ):
            # the fc, the embedding and the rotary's cos/sin inside the compiled graph too: inductor fuses them into
            # the layer's own kernels, where eager code ran ~6 small kernels a draft step
            kv = span_dynamic(mask, kv)
            return self.compiled_whole(self, hidden, ids, positions, kv, slots, mask, from_target, head_at, pending)
        return super().forward(hidden, ids, positions, kv, slots, mask, from_target, extra_kv, head_at, pending)

    def _layer(self, emb, h, cos, sin, kv, slots, mask, extra_kv, head_at, pending):
        """The layer and head of an eager forward: compiled (compile()'s compiled_layer) for a decode call's few
        tokens outside a prompt, as traced and sliding-window calls are."""
        few = emb.shape[1] <= COMPILE_MAX_TOKENS
        if self.compiled_layer is not None and extra_kv is None and few and not in_prompt():
            kv = span_dynamic(mask, kv)
            return self.compiled_layer(self, emb, h, cos, sin, kv, slots, mask, head_at=head_at, pending=pending)
        return self._layer_and_head(emb, h, cos, sin, kv, slots, mask, extra_kv, head_at, pending)

    # --- the Draft interface: what the engine sizes its state with ---------------------------------------------
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
        on = (
            kind == "hopper"
            and c.sliding_window is None
            and hopper.draft_reason(c.num_heads, c.num_kv_heads, c.head_dim, p.device, p.dtype) is None
        )
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

    def _unread_mask(self, T: int, span: int) -> torch.Tensor:
        """A [1, T, span] stand-in for the mask where the attention takes the pending form and reads no mask: it
        carries the span's size (span_dynamic, the layer) and costs no kernel (an expanded view; its values are
        False: were it ever read, it would hide every key, not pass for a mask)."""
        return self._const(("unread",), lambda dev: torch.zeros(1, 1, 1, dtype=torch.bool, device=dev)).expand(
            1, T, span
        )

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

    # --- batched decoding (one cache row per sequence; eaglekit.decoding.engine) -------------------------
    def row_cache(self, batch: int, span: int) -> RowKV:
        """`batch` rows of `span` slots (a sliding window's slot positions kept per row). One row is laid out as the
        one-sequence cache the chain and tree walks attend over (draft.layer_walks: kv.layer(0) [1, Hkv, S, hd])."""
        c, p = self.config, self.norm.weight
        kv = RowKV(1, c.num_kv_heads, c.head_dim, span, batch, p.device, p.dtype)
        return kv.track_positions() if c.sliding_window is not None else kv

    def _rows_forward(self, kv: RowKV, *args, **kwargs):
        """The forward of a rows call. A sliding window reads the positions of the slots it attends over (a tree
        node's slot is not its position): the rows' own (kv.pos) while the call runs. Without a window (kv.pos None)
        it is the forward alone."""
        if kv.pos is None:
            return self(*args, **kwargs)
        own, self.slot_pos = self.slot_pos, kv.pos
        try:
            return self(*args, **kwargs)
        finally:
            self.slot_pos = own

    @torch.inference_mode()
    def extend_rows(self, kv: RowKV, feats: torch.Tensor, next_ids: torch.Tensor, n: torch.Tensor, span: int):
        """Draft.extend_rows: row b commits n[b] entries (feats [B, E, C*H_t], next_ids [B, E], padded past n[b]; the
        feature of target position p with the token at p + 1) -> pre-norm hidden [B, H] and logits [B, Vd] (float32)
        of each row's entry n[b] - 1, which seed its next tree. A row with n = 0 writes only invisible slots and
        returns junk (padding rows)."""
        B, E = next_ids.shape
        m = kv.length
        if B == 1 and self.takes_pending(E):  # one row: the pending form (no mask to build: ~8 small kernels)
            slots, pending = m + self._arange(E), (m, self._causal(E))
            mask = self._unread_mask(E, span)
        else:
            slots, pending = m[:, None] + torch.arange(E, device=next_ids.device), None
            causal = torch.ones(1, E, E, dtype=torch.bool, device=next_ids.device).tril_()
            mask = span_mask_rows(m, causal, span)
        h, logits, _ = self._rows_forward(
            kv,
            feats.to(self.dtype),
            next_ids,
            slots,
            kv.layer(0),
            slots,
            mask,
            from_target=True,
            head_at=(n - 1).clamp(min=0),
            pending=pending,
        )
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
    def tree_rows(
        self, kv: RowKV, h_last, logits_last, root, frame: tuple, steps: int, n_sel: int, span: int
    ) -> tuple | None:
        """A tree for one row as one walk over the layer (draft.walk's rule; compiled or eager as chain_rows: compiled,
        the levels, picks and bookkeeping are one graph, where inductor fuses the bookkeeping into the layer's kernels:
        docs/performance.md#d25) -> (tokens, parents, depths, mask) each with a row dimension of 1; None where
        chain_rows gives None."""
        if not self._walks_row(kv):
            return None
        grown = self.walks.tree(
            self, kv.layer(0), kv.length[0], span, h_last[0], logits_last[0], root[0], frame, steps, n_sel
        )
        return tuple(x[None] for x in grown)

    @torch.inference_mode()
    def step_rows(self, kv: RowKV, hidden, ids, positions, slots, mask):
        """Draft.step_rows: one tree level per row, hidden [B, K, H], ids/positions/slots [B, K], mask [B, K, span] ->
        (h, logits float32), the entries pending (never committed)."""
        h, logits, _ = self._rows_forward(kv, hidden, ids, positions, kv.layer(0), slots, mask, from_target=False)
        return h, logits.float()
