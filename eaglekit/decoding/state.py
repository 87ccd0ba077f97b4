"""The batch's device state: one row per running sequence (index == cache row), and what the phases run with.

BatchState holds every tensor a step reads or moves: the target's and the draft's row caches (per-row committed
lengths on the device), each row's root token (the next token to feed), whether it is active and drafts, the draft's
last hidden and logits per row, and the catch-up window of features the target captured in plain steps (CATCH_UP
tokens a row). Setup holds the models and the two numbers fixed for an engine's life. The phases
(decoding.phases) work on these two alone; the row allocator (decoding.allocator) sizes and compacts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..capture import CaptureSpec
from ..models.base import TargetInfo
from .adaptive import LONGEST_PROBE

# Plain tokens a row may go without its draft and still catch up (a window of captured features per row: 1024 x 3
# hidden sizes, 25 MB a row at the 8B shape in bf16); longer than the policy's longest probe interval, so rows keep
# their draft while the policy probes.
CATCH_UP = LONGEST_PROBE + 16


class RowCache(Protocol):
    """A cache of one row per sequence with a committed length per row (`length`, a [B] device tensor):
    models.layers.RowKV, models.mla.RowLatent, a one-sequence backend's models.layers.OwnRow."""

    length: torch.Tensor

    def rows(self, lo: int, hi: int) -> RowCache: ...

    def keep(self, path: torch.Tensor, n: torch.Tensor) -> None: ...

    def move(self, src: int, dst: int, upto: int | None = None) -> None: ...

    def grown(self, span: int) -> RowCache: ...


class RowTarget(Protocol):
    """The target as the phases drive it: its row interface (models.base.Target's)."""

    @property
    def info(self) -> TargetInfo: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def compiled_prompts(self) -> bool: ...  # prompts run through one graph compiled for every length (Target's)

    def row_cache(self, batch: int, span: int) -> RowCache: ...

    def forward_rows(
        self,
        kv: RowCache,
        ids: torch.Tensor,
        depths: torch.Tensor,
        block: torch.Tensor,
        span: int,
        capture: CaptureSpec | None = None,
        last: bool | torch.Tensor = False,
    ): ...


class RowDraft(Protocol):
    """The draft as the phases drive it: its row interface (draft.base.Draft's; decoding.tree.expand_rows reads the
    tree calls)."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def draft_vocab_size(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...

    # the compiled graphs (Draft's; None: eager): the decode layer, and the prompt graph for every length
    @property
    def compiled_layer(self) -> Callable[..., Any] | None: ...

    @property
    def compiled_prompt(self) -> Callable[..., Any] | None: ...

    def row_cache(self, batch: int, span: int) -> RowCache: ...

    def extend_rows(self, kv: RowCache, feats: torch.Tensor, next_ids: torch.Tensor, n: torch.Tensor, span: int): ...

    # a chain / a tree for the rows the draft's own way (Eagle3Draft's one-row walk), or None
    # where it has none for these rows (then decoding.tree walks them over step_rows)
    def chain_rows(
        self, kv: RowCache, h_last: torch.Tensor, logits_last: torch.Tensor, steps: int, root: torch.Tensor, span: int
    ) -> torch.Tensor | None: ...

    def tree_rows(
        self,
        kv: RowCache,
        h_last: torch.Tensor,
        logits_last: torch.Tensor,
        root: torch.Tensor,
        frame: tuple,
        steps: int,
        n_sel: int,
        span: int,
    ) -> tuple | None: ...


@dataclass
class Setup:
    """What the phases run with. `draft` and `capture` may change after the engine is built (tests hand in doubles
    that way: the engine's own attributes write through to here); the phases read them at each call."""

    target: RowTarget
    draft: RowDraft | None = None
    capture: CaptureSpec | None = None
    synthetic: float | None = None  # acceptance replaced at this per-position rate (benchmarks only, never lossless)
    plain_rows: int = 1  # rows of the plain step's target forward (its token is row 0: decoding.phases.Cycle.plain)


class BatchState:
    """The batch's device tensors, max_batch rows. The caches (`tk`, `dk`: the target's and the draft's RowKV) and
    the tensors made with them are None until the row allocator first sizes them; `S` is the target's span per row."""

    def __init__(self, max_batch: int, device: torch.device):
        self.max_batch, self.device = max_batch, device
        B, dev = max_batch, device
        self.tk: RowCache | None = None
        self.dk: RowCache | None = None
        self.S = 0  # cache span (slots per row)
        self.root = torch.zeros(B, dtype=torch.long, device=dev)
        self.active = torch.zeros(B, dtype=torch.bool, device=dev)
        self.use_draft = torch.zeros(B, dtype=torch.bool, device=dev)
        # the draft's last hidden and logits per row, and the catch-up window: made with the caches where a draft is
        self.h: torch.Tensor | None = None
        self.dl: torch.Tensor | None = None
        self.lag_feats: torch.Tensor | None = None
        self.lag_ids: torch.Tensor | None = None
        self.lag_n: torch.Tensor | None = None

    def make(self, setup: Setup, S: int, draft_span: int) -> None:
        """Fresh caches of span S (the draft's `draft_span`) and the draft's per-row tensors."""
        target, draft, B, dev = setup.target, setup.draft, self.max_batch, self.device
        self.tk = target.row_cache(B, S)
        self.dk = draft.row_cache(B, draft_span) if draft is not None else None
        if draft is not None:
            assert setup.capture is not None  # a draft runs on the target's captured features
            self.h = torch.zeros(B, draft.hidden_size, dtype=draft.dtype, device=dev)
            self.dl = torch.zeros(B, draft.draft_vocab_size, dtype=torch.float32, device=dev)
            F = target.info.hidden_size * len(setup.capture.after_layers)
            self.lag_feats = torch.zeros(B, CATCH_UP, F, dtype=target.dtype, device=dev)
            self.lag_ids = torch.zeros(B, CATCH_UP, dtype=torch.long, device=dev)
            self.lag_n = torch.zeros(B, dtype=torch.long, device=dev)
        self.S = S

    def grow(self, S: int, draft_span: int) -> None:
        """The caches at a longer span, their entries kept (the catch-up window is per row, not per slot: it
        survives the growth as it is)."""
        assert self.tk is not None  # (growth follows `make`)
        self.tk = self.tk.grown(S)
        self.dk = self.dk.grown(draft_span) if self.dk is not None else None
        self.S = S

    def move_row(self, src: int, dst: int, upto: int, draft_upto: int) -> None:
        """Row src's state into row dst: its cache entries below `upto` (the draft's below `draft_upto`)."""
        assert self.tk is not None  # (a row runs only after `make`)
        self.tk.move(src, dst, upto)
        if self.dk is not None:
            # (made with the draft's cache)
            assert (
                self.h is not None
                and self.dl is not None
                and self.lag_feats is not None
                and self.lag_ids is not None
                and self.lag_n is not None
            )
            self.dk.move(src, dst, draft_upto)
            self.h[dst] = self.h[src]
            self.dl[dst] = self.dl[src]
            self.lag_feats[dst] = self.lag_feats[src]
            self.lag_ids[dst] = self.lag_ids[src]
            self.lag_n[dst] = self.lag_n[src]
        self.root[dst] = self.root[src]
        self.use_draft[dst] = self.use_draft[src]

    def clear_row(self, r: int) -> None:
        self.active[r] = False
        self.use_draft[r] = False
        assert self.tk is not None  # (a row runs only after `make`)
        self.tk.length[r] = 0
        if self.dk is not None:
            assert self.lag_n is not None  # (made with the draft's cache)
            self.dk.length[r] = 0
            self.lag_n[r] = 0

    def stand(self, B: int, at: int) -> None:
        """Rows [0, B) standing at length `at`, active and drafting (warm-up's timings: shapes and lengths matter,
        not values)."""
        assert self.tk is not None  # (rows stand only after `make`)
        self.tk.length[:B] = at
        self.active[:B] = True
        if self.dk is not None:
            self.dk.length[:B] = at
            self.use_draft[:B] = True

    def idle(self) -> None:
        """Back to no row running."""
        assert self.tk is not None  # (rows run only after `make`)
        self.tk.length.zero_()
        self.active.zero_()
        self.use_draft.zero_()
        if self.dk is not None:
            assert self.lag_n is not None  # (made with the draft's cache)
            self.dk.length.zero_()
            self.lag_n.zero_()
