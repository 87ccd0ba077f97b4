"""The interface every target backend gives the decoding engine: rows.

The engine drives a target through `row_cache` (a KV cache of B rows, each with its committed length on the device)
and `forward_rows` (per row, T pending tokens written after its committed prefix: a prompt, one plain token, or a
draft tree with its ancestor mask and per-node depths -> logits and the captured features). Which residual streams
are captured is per call (`capture`, a CaptureSpec or None): a target shared by several decoders, the baseline, the
doctor's probe or a trainer keeps no capture state of its own. On our decoders a forward is fixed-shape device work,
so the engine can record it in CUDA graphs.

`SequenceTarget` is a target that holds one sequence of its own (`reset`, `_forward`, `_advance`, `keep`), its rows
that sequence as a batch of one (layers.OwnRow): the transformers adapter. `StaticCacheTarget` decodes rows and keeps
one static cache of its own that its batch of one runs on (layers.own_row): eaglekit's decoders.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..capture import CaptureSpec
from ..errors import InputError
from ..observe import trace

if TYPE_CHECKING:
    from ..distributed import TPGroup
    from ..kernels.products import Choice
    from .config import TargetConfig


@dataclass(frozen=True)
class TargetInfo:
    """What the rest of eaglekit needs to know about any target, whatever the backend."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    fingerprint: str


def check_finite(feats: torch.Tensor, spec: CaptureSpec, hidden: int) -> None:
    """Refuse NaN / inf features, naming the captured layer (one host read: done once per prompt)."""
    bad = (~torch.isfinite(feats)).view(feats.shape[0], -1, hidden).sum(dim=(0, 2))
    if int(bad.sum()):
        from ..errors import FeatureError

        where = [f"after_layers {layer}: {int(n)}" for layer, n in zip(spec.after_layers, bad.tolist()) if n]
        raise FeatureError(
            f"NaN or inf in the captured target features ({', '.join(where)} non-finite values)",
            fix="the target overflows there: run it in float32 / bfloat16 instead of float16, or "
            "check the weights of that layer",
            code="E401",
        )


def take_last(h: torch.Tensor, last) -> torch.Tensor:
    """forward_rows' `last` on h [B, T, ...]: False -> h; True -> each row's last token, [B, 1, ...]; a [B] long
    tensor -> each row's token at that index, [B, 1, ...] (a batch of right-padded prompts ends where each prompt
    does)."""
    if isinstance(last, torch.Tensor):
        idx = last.view(-1, 1, *([1] * (h.dim() - 2))).expand(-1, 1, *h.shape[2:])
        return h.gather(1, idx)
    return h[:, -1:] if last else h


class Target(ABC):
    info: TargetInfo
    device: torch.device
    dtype: torch.dtype
    # set by models.load_target (None on a target built otherwise): the folder and its tokenizer's fingerprint
    folder: Path | None = None
    tokenizer_fingerprint: str | None = None
    span: int = 0  # cache slots a sequence may use (the attention span of every step)
    static: bool = False  # True when forward_rows is fixed-shape and free of host syncs (CUDA graphs record it)
    # which decoder serves this target, for reports (generate --json's metrics.backend): "ours" (the Llama family),
    # "deepseek", "tp" (a tensor-parallel rank of ours), "hf" (the transformers adapter)
    backend: str | None = None
    # the whole model's config where the decoder is eaglekit's Llama-family one (models.config.TargetConfig: the
    # draft's default heads and the Hopper kernels read it); None for the other decoders
    cfg: TargetConfig | None = None
    # the tensor-parallel group this target is one rank of (distributed.TPGroup); None: one process holds it all
    tp: TPGroup | None = None
    # the routed experts' mode of a mixture-of-experts target (set_experts; generate --json's metrics.experts); None: a
    # dense target, which has no routed experts
    experts: str | None = None
    # how the decode products run and why (kernels.products.Choice), set by pair.set_pair_products; None until then
    products_choice: Choice | None = None
    # how the pair runs and why (eaglekit.pair.RunPlan: compile, prompt graphs, experts, draft precision, products),
    # kept by pair.load_pair; None for a target loaded some other way
    plan: Any = None
    # what kernels.products.pick_cpu timed where products 'auto' timed them on a CPU ({"products", "ms"}); else None
    products_pick: dict | None = None
    compiles: bool = False  # True where compile() and compile_prompts() are implemented (eaglekit's own decoders)
    takes_products: bool = False  # True where set_products installs a products policy (the Llama-family decoder)

    def _trace(self, feats, T, capture: CaptureSpec | None):
        if feats is not None and trace.ENABLED:
            assert capture is not None  # (features are captured only at a capture spec)
            trace.record(
                "target.capture", feats, layers=list(capture.after_layers), hidden=self.info.hidden_size, tokens=T
            )

    # --- the row interface (eaglekit.decoding.engine.BatchEngine) --------------------------------
    # True when the target decodes many rows at once (StaticCacheTarget); False: one row (SequenceTarget's own
    # sequence), eager, more rows refused with E308
    batched: bool = False

    @abstractmethod
    def row_cache(self, batch: int, span: int):
        """A KV cache of `batch` rows of `span` slots each (eaglekit.models.layers.RowKV, mla.RowLatent, or a
        SequenceTarget's own sequence as one row): a committed `length` [batch] on the device, `rows`, `keep`,
        `grown`, `move` (decoding.state.RowCache)."""

    def forward_rows(
        self,
        kv,
        ids: torch.Tensor,
        depths: torch.Tensor,
        block: torch.Tensor,
        span: int,
        capture: CaptureSpec | None = None,
        last: bool | torch.Tensor = False,
    ):
        """Per row b of `kv`: write ids[b] ([B, T]) at slots [length[b], length[b] + T), each token seeing the
        row's committed prefix and the new tokens block[b] ([B|1, T, T]) allows, at positions length[b] +
        depths[b]; attention over the first `span` slots. Lengths are not advanced.
        -> (logits [B, T, V] float32, features [B, T, C*H] or None); with `last` the logits of each row's last
        token only, [B, 1, V] (a prefill reads no other: the head's product over a prompt's other tokens is work
        for nothing); `last` a [B] long tensor: each row's token at that index (right-padded prompts: take_last).
        The captured features are traced here, as verify's and prefill's are (EAGLE3_DEBUG's target capture
        point)."""
        logits, feats = self._forward_rows(kv, ids, depths, block, span, capture, last)
        self._trace(feats, ids.shape[1], capture)
        return logits, feats

    @abstractmethod
    def _forward_rows(self, kv, ids, depths, block, span, capture, last=False):
        """forward_rows' work, untraced."""

    # --- batched, cacheless forward for feature extraction ---------------------------------------
    @abstractmethod
    def features(self, ids: torch.Tensor, pad_mask: torch.Tensor | None = None, capture: CaptureSpec | None = None):
        """ids [B, T] -> (final normed hidden [B, T, H], features [B, T, C*H] at `capture`, or None)."""

    @abstractmethod
    def lm_head_weight(self) -> torch.Tensor: ...

    @property
    def batch_invariant(self) -> bool:
        """Whether a decode row's bits are independent of the rows computed with it (batch-invariant products and
        attention): then one row agrees with a verify's row and greedy output is the same bits at any batch."""
        return False

    @property
    def compiled_prompts(self) -> bool:
        """Whether prompts run through one graph compiled for every length (compile_prompts()); the engine compiles
        it before its first prefill counts (decoding.prefill.Prefiller.warm)."""
        return False

    @property
    def compiled_layers(self) -> bool:
        """Whether the decode-time layers run compiled (compile(); eaglekit.pair.load_pair's `run.compile`)."""
        return False

    @property
    def products(self) -> str:
        """The kind of products the decode runs (eaglekit.kernels.products): "aten" (F.linear) where none is set."""
        return "aten"

    # --- what eaglekit.pair asks of a target beyond decoding: refused where compiles / takes_products / experts say no
    def compile(self, options: dict | None = None) -> None:
        """torch.compile the decode-time layers (where `compiles`)."""
        raise InputError(
            "--compile needs eaglekit's own decoder (--backend ours)",
            code="E108",
            fix="leave out --compile for transformers-backed targets",
        )

    def compile_prompts(self, on: bool = True) -> None:
        """Prompts through one graph compiled for every length (where `compiles`)."""
        raise InputError(
            "--prompt-graphs needs eaglekit's own decoder (Llama or DeepSeek family, one process)",
            code="E108",
            fix="leave out --prompt-graphs for this target",
        )

    def set_products(self, kind) -> None:
        """Run the decode products as `kind` says (where `takes_products`; eaglekit.kernels.products)."""
        raise InputError(
            f"the {type(self).__name__} backend has no products policy",
            code="E108",
            fix="leave out --products for transformers-backed, DeepSeek-family or tensor-parallel targets",
        )

    def set_experts(self, mode: str | None) -> None:
        """Run the routed experts as `mode` says (where `experts` is not None: a mixture-of-experts target)."""
        raise InputError(
            f"the {type(self).__name__} backend has no routed experts",
            code="E108",
            fix="leave out --experts for this target",
        )

    @abstractmethod
    def embed_weight(self) -> torch.Tensor: ...


class SequenceTarget(Target):
    """A target that holds one sequence of its own: `reset` starts it, `_forward` writes pending tokens after its
    committed prefix, `_advance` commits a prompt, `keep` an accepted path. Its row interface is, by default, that
    sequence as a batch of one (layers.OwnRow): the transformers adapter, whose DynamicCache holds one sequence."""

    @abstractmethod
    def reset(self, span: int) -> None:
        """Start a sequence that will use at most `span` cache slots."""

    @abstractmethod
    def _forward(self, ids: torch.Tensor, depths: torch.Tensor, block: torch.Tensor, capture: CaptureSpec | None):
        """Write T pending tokens at slots [length, length + T), each seeing the committed prefix and the new
        tokens its row of `block` allows -> (logits [T, V] float32, features [T, C*H] at `capture`, or None)."""

    @abstractmethod
    def _advance(self, n: int) -> None:
        """Commit the n tokens just written (a prompt)."""

    @abstractmethod
    def keep(self, path: torch.Tensor, n: torch.Tensor, in_place: bool = False) -> None:
        """Commit pending tokens path[:n] (root first; `path` may be padded); drop the rest. `in_place`: the caller
        knows path[:n] is 0, 1, .., n - 1 (a chain's accepted path), so nothing needs to move."""

    @property
    @abstractmethod
    def length(self) -> int:
        """Committed tokens (a host read: for checks and tests, not for the decode loop)."""

    def row_cache(self, batch: int, span: int):
        """The target's own sequence as one row (layers.OwnRow); more rows refused (E308)."""
        from .layers import OwnRow

        return OwnRow.of(
            self,
            batch,
            span,
            lambda: self.length,
            f"the {type(self).__name__} backend does not decode batches",
            "load the target with our decoder (--backend ours; Llama, Mistral, Qwen2, Qwen3), or serve with a batch "
            "size of 1",
        )

    def _forward_rows(self, kv, ids, depths, block, span, capture, last=False):
        """The one row of OwnRow (row_cache), through the sequence's `_forward`."""
        kv.sync()
        logits, feats = self._forward(ids[0], depths[0], block[0], capture)
        return take_last(logits[None], last), (feats[None] if feats is not None else None)


class StaticCacheTarget(Target):
    """A target that decodes rows and holds one static cache of its own (`self.cache`: layers.KVCache or
    mla.LatentCache, its committed `length` a 0-d device tensor) with the span its last `reset` gave (`self.span`):
    its batch of one runs on that cache (layers.own_row), so a Decoder's requests reuse one allocation. eaglekit's
    Llama-family and DeepSeek-family decoders."""

    cache: Any = None  # None before the first reset
    batched = True

    @abstractmethod
    def reset(self, span: int) -> None:
        """Start the one sequence at `span` cache slots (no committed tokens), reallocating only where it does not
        fit."""
