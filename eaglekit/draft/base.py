"""The interface every draft gives the decoding engine (the draft-side twin of models.base.Target): rows.

A row's cache holds committed entries, entry p pairing the target's feature at position p with the token at p + 1.
`extend_rows` commits entries (the prompt, then each accepted path) and returns the hidden state and logits that seed
the next tree; `step_rows` runs one tree level as pending entries written past the committed ones and never committed
(the next extend overwrites them); the engine's tree walk (eaglekit.decoding.tree) grows chains and trees from these
steps unless `chain_rows` / `tree_rows` grow them the draft's own way. The engine reads nothing else: no weights, no
cache internals, so a test double or another draft architecture only has to keep this contract. On Eagle3Draft
every call is fixed-shape device work with no host read, so the engine can record the tree and the extend in CUDA
graphs. `SequenceDraft` is a draft that holds one sequence of its own (`reset`, `extend`, `step`: test doubles, a
draft of another architecture), its rows by default that sequence as a batch of one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..kernels import topk


class Draft(ABC):
    span: int = 0  # cache slots a sequence may use: committed entries + one tree's pending ones
    # the compiled graphs the engine asks after (None: eager): the decode layer (compile()) and the prompt graph
    # compiled for every length (compile_prompts())
    compiled_layer: Callable[..., Any] | None = None
    compiled_prompt: Callable[..., Any] | None = None
    quantizes: bool = False  # True where quantize() runs the products from int8 weights (eaglekit.kernels.int8)
    quantized: str | None = None  # the mode quantize() ran ("int8"); None: the products run from the stored weights
    # what eaglekit.pair.set_draft_precision ran ("int8" or the stored dtype; generate --json's draft_precision); None
    # before it runs
    precision: str | None = None
    # where it was read from (set by load_draft; None for a draft built in memory): the folder, and its
    # checkpoint.FolderFormat (Any: the reader imports this module, so this one cannot name its class)
    source_folder: Path | None = None
    source_format: Any = None

    @property
    def batched(self) -> bool:
        """True where the draft decodes many rows at once (Eagle3Draft). Without it its rows are one row (a
        SequenceDraft's own sequence): a batch of one, eager, more rows refused with E308."""
        return False

    # --- what the engine sizes its persistent state with ---------------------------------------------
    @property
    @abstractmethod
    def hidden_size(self) -> int:
        """Width of the hidden state `extend_rows` / `step_rows` return and `step_rows` takes back."""

    @property
    @abstractmethod
    def draft_vocab_size(self) -> int:
        """Width of the logits (draft ids; `to_target_ids` maps them to the target's)."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """dtype of the hidden state."""

    # --- the row interface (eaglekit.decoding.engine) ---------------------------------------------------------
    @abstractmethod
    def row_cache(self, batch: int, span: int):
        """A cache of `batch` rows of `span` slots each (eaglekit.models.layers.RowKV, or a SequenceDraft's own
        sequence as one row): a committed `length` [batch] on the device, `rows`, `keep`, `grown`, `move`."""

    @abstractmethod
    def extend_rows(self, kv, feats: torch.Tensor, next_ids: torch.Tensor, n: torch.Tensor, span: int):
        """Row b commits n[b] entries (feats [B, E, C*H_t], next_ids [B, E], padded past n[b]; entry p pairs the
        target's feature at position p with the token at p + 1) -> hidden [B, H] and logits [B, Vd] (float32) of
        each row's entry n[b] - 1 (junk for a row with n = 0)."""

    @abstractmethod
    def step_rows(self, kv, hidden, ids, positions, slots, mask):
        """One tree level per row: K pending entries of own hidden [B, K, H] and target ids [B, K] at `positions`,
        written at `slots`, each attending to the slots its row of mask [B, K, span] allows -> (hidden [B, K, H],
        logits [B, K, Vd] float32). Pending entries are never committed (the next extend overwrites them)."""

    def chain_rows(self, kv, h_last, logits_last, steps: int, root, span: int):
        """A chain the draft's own way (tokens [B, steps + 1]), or None (the default): then eaglekit.decoding.tree
        walks it over step_rows."""
        return None

    def tree_rows(self, kv, h_last, logits_last, root, frame: tuple, steps: int, n_sel: int, span: int):
        """A tree the draft's own way ((tokens, parents, depths, mask) with a row dimension), or None (the default,
        as chain_rows)."""
        return None

    # --- what eaglekit.pair sets on a draft (a draft without the feature keeps its own way) ---------------------
    def quantize(self, mode: str = "int8") -> None:
        """The products from int8 weights (where `quantizes`)."""
        raise InputError(
            f"the {type(self).__name__} draft cannot be quantized",
            code="E108",
            fix="leave out --draft-quant, or pass none",
        )

    def set_products(self, kind) -> None:
        """Run the draft's products as `kind` says (eaglekit.kernels.products). Default: a draft without a products
        policy keeps its own products."""
        return None

    def set_attention(self, kind: str = "sdpa") -> bool:
        """The decode attention of the draft's cached calls ("sdpa" or "hopper") -> whether "hopper" runs. Default:
        the draft's own attention, whatever the kind."""
        return False

    def takes_pending(self, cols: int) -> bool:
        """Whether the draft's attention takes the mask in the pending form, for blocks of `cols` columns: every slot
        below base[0] and the slots base[0] + c where block[k, c] (base [1], block [K, cols] bool), with no mask
        built (Eagle3Draft's one-row extend and walks, draft.layer_walks). Default: no."""
        return False

    @abstractmethod
    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocabulary ids -> target ids (EAGLE-3's d2t: target_id = i + d2t[i])."""

    def walk_chain(self, step, h, logits_last, m, cols, steps: int, root: torch.Tensor | None = None) -> torch.Tensor:
        """A chain of `steps` draft tokens (draft ids) over one sequence's cache, from the top 1 of logits_last, each
        next node fed the previous one's hidden and pick; `step`(hidden [1, H], target ids [1], slot [1], mask
        [1, span]) -> (hidden, logits) [1, ..] runs one node; m: committed entries, cols: arange(span). Node d is the
        entry for position m - 1 + d, written at slot m + d - 1, seeing the committed entries and the nodes before it
        (as eaglekit.decoding.tree's rows walk places them). With `root` (a target id): the tree's tokens instead,
        [steps + 1] target ids, root first. Eagle3Draft's one-row chain (draft.layer_walks) walks with its layer."""
        tok = topk.top1(logits_last)
        toks = [tok]
        for level in range(2, steps + 1):
            mask = (cols < m + (level - 1))[None]
            slot = (m + (level - 2)).view(1)
            h, logits = step(h, self.to_target_ids(tok), slot, mask)
            tok = topk.top1(logits)[0]
            toks.append(tok)
        chain = torch.cat(toks)
        return chain if root is None else torch.cat([root.view(1), self.to_target_ids(chain)])


class SequenceDraft(Draft):
    """A draft that holds one sequence of its own: `reset` starts it, `extend` commits entries (the prompt, then each
    accepted path) and returns the hidden state and logits that seed the next tree, `step` runs one tree level as
    pending entries. Its row interface is that sequence as a batch of one (layers.OwnRow: test doubles, a draft of
    another architecture); Eagle3Draft has rows of its own."""

    @abstractmethod
    def reset(self, span: int) -> None:
        """Start a sequence that will use at most `span` cache slots (no committed entries)."""

    @property
    @abstractmethod
    def committed(self) -> torch.Tensor:
        """Committed entries, a 0-d long tensor on the device that `extend` advances in place (no host read; the
        one-row bridge, layers.OwnRow, reads it to bring the sequence level with the engine's row)."""

    @abstractmethod
    def extend(self, feats: torch.Tensor, next_ids: torch.Tensor, n: torch.Tensor | None = None):
        """Commit entries [m, m + n): feats [E, C*H_t] with next_ids [E] (target ids), padded past `n`
        (default: all E). -> (hidden [H], logits [Vd] float32) of entry n - 1."""

    @abstractmethod
    def step(self, hidden: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask):
        """One tree level: K pending entries of own hidden [K, H] and target ids [K] at `positions`, written at
        `slots`, each attending to the span slots its row of mask [K, span] allows -> (hidden [K, H],
        logits [K, Vd] float32)."""

    def row_cache(self, batch: int, span: int):
        """The draft's own sequence as one row (layers.OwnRow); more rows refused (E308)."""
        from ..models.layers import OwnRow

        return OwnRow.of(
            self,
            batch,
            span,
            lambda: int(self.committed),
            f"the {type(self).__name__} draft decodes one sequence at a time, not {batch} rows",
            "batch with our decoder's target (--backend ours) and an EAGLE-3 draft, or serve with --max-batch 1",
        )

    def extend_rows(self, kv, feats: torch.Tensor, next_ids: torch.Tensor, n: torch.Tensor, span: int):
        """`extend` per row: row b commits n[b] entries (feats [B, E, C*H_t], next_ids [B, E], padded past n[b]) ->
        hidden [B, H] and logits [B, Vd] (float32) of each row's entry n[b] - 1 (junk for a row with n = 0)."""
        kv.sync()
        k = int(n[0])
        if k == 0:  # an idle row commits nothing (its hidden and logits are not read)
            return (
                torch.zeros(1, self.hidden_size, dtype=self.dtype, device=feats.device),
                torch.zeros(1, self.draft_vocab_size, dtype=torch.float32, device=feats.device),
            )
        h, logits = self.extend(feats[0], next_ids[0], n[0])
        kv.length += k
        return h[None], logits.float()[None]

    def step_rows(self, kv, hidden, ids, positions, slots, mask):
        """`step` per row: hidden [B, K, H], ids/positions/slots [B, K], mask [B, K, span] -> (h, logits float32)."""
        kv.sync()
        S = self.span  # the engine's masks cover the span it attends over; `step` takes the sequence's whole span
        full = torch.zeros(mask.shape[1], S, dtype=torch.bool, device=mask.device)
        full[:, : mask.shape[2]] = mask[0, :, :S]
        h, logits = self.step(hidden[0], ids[0], positions[0], slots[0], full)
        return h[None], logits.float()[None]
