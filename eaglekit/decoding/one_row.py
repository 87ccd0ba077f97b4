"""A backend that holds one sequence, seen by the batched engine as a batch of one row.

The engine (eaglekit.decoding.engine) talks to targets and drafts through their row interface (`row_cache`,
`forward_rows`; `extend_rows`, `step_rows`, `chain_rows`, `tree_rows`). Our decoders implement it for any number
of rows. A backend that holds one sequence only (the transformers adapter, the test doubles of tests/helpers.py,
another architecture behind the Target / Draft contract) implements the one-sequence calls (`reset`, `verify`, `keep`;
`reset`, `extend`, `step`): these adapters give it the row interface for one row, so the one engine runs it at
max_batch 1 (the declared fallback: more rows are refused with E308). A one-sequence draft's chains and trees are the
engine's walk over its `step` (decoding.tree.expand_rows), as for any draft without a walk of its own.

The engine moves a row's committed length itself (a chain's commit and a plain step's add to it; a prefill zeroes it).
The backend keeps its own count; `_OneRow.sync` brings it level before each call: entries the engine committed in
place are kept (`keep` of the first ones: a static cache adds, the transformers adapter drops what lies past them), a
zeroed row starts the sequence again. Each sync reads the length on the host: these backends run eagerly, never in
CUDA graphs.
"""

from __future__ import annotations

import torch

from ..errors import GenerationError


class _OneRow:
    """RowKV's interface over a one-sequence backend: `length` [1] (the engine's), `rows`, `keep`, `grown`."""

    batch = 1

    def __init__(self, owner, span: int, count):
        self.owner, self.span, self._count = owner, span, count  # count(): the owner's committed entries
        owner.reset(span)
        self.length = torch.zeros(1, dtype=torch.long, device=owner.device)

    def rows(self, lo: int, hi: int) -> "_OneRow":
        if (lo, hi) not in ((0, 1), (0, 0)):
            raise IndexError(f"a one-row cache has row 0 only, not rows [{lo}, {hi})")
        return self

    def sync(self) -> None:
        """Bring the owner's committed entries level with the engine's `length` (see the module docstring)."""
        want, have = int(self.length[0]), self._count()
        same_span = self.owner.span == self.span
        if want == have and same_span:
            return
        if want == 0:  # a new sequence in this row (or another engine used the backend in between)
            self.owner.reset(self.span)
            return
        if want < have or not same_span:
            raise RuntimeError(f"the backend's sequence changed under its one-row cache ({have} entries, span "
                               f"{self.owner.span}; the row expects {want}, span {self.span}): "
                               "another engine used it mid-sequence")
        d = want - have
        self.owner.keep(torch.arange(d, device=self.length.device), torch.tensor(d, device=self.length.device),
                        in_place=True)

    def keep(self, path: torch.Tensor, n: torch.Tensor) -> None:
        self.owner.keep(path[0], n[0])
        self.length += n

    def grown(self, span: int) -> "_OneRow":
        if int(self.length[0]):
            raise RuntimeError("a one-row cache grows only between sequences")
        return _OneRow(self.owner, span, self._count)

    def move(self, src: int, dst: int, upto: int | None = None) -> None:
        raise RuntimeError("a one-row cache has no other row to move")


def _refuse(backend, batch: int) -> None:
    raise GenerationError(f"the {type(backend).__name__} backend decodes one sequence at a time, not {batch} rows",
                          fix="batch with our decoder's target (--backend ours) and an EAGLE-3 draft, "
                          "or serve with --max-batch 1", code="E308")


class _OneSequence:
    """What both adapters share: everything but the row interface is the backend's own."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def row_cache(self, batch: int, span: int) -> _OneRow:
        if batch != 1:
            _refuse(self.inner, batch)
        return _OneRow(self.inner, span, self._count)


class OneRowTarget(_OneSequence):
    """A one-sequence Target (no `batched` row interface) as a batch of one row."""

    batched = True
    static = False  # (each call reads the row's length on the host: never recorded in CUDA graphs)

    def _count(self) -> int:
        return self.inner.length

    def forward_rows(self, kv: _OneRow, ids, depths, block, span: int, capture=None, last=False):
        kv.sync()
        logits, feats = self.inner.verify(ids[0], depths[0], block[0], capture)  # (verify traces the capture)
        return (logits[-1:] if last else logits)[None], (feats[None] if feats is not None else None)


class OneRowDraft(_OneSequence):
    """A one-sequence Draft (no row interface) as a batch of one row."""

    def _count(self) -> int:
        return int(self.inner.committed)

    def extend_rows(self, kv: _OneRow, feats, next_ids, n, span: int):
        kv.sync()
        k = int(n[0])
        if k == 0:  # an idle row commits nothing (its hidden and logits are not read)
            return (torch.zeros(1, self.inner.hidden_size, dtype=self.inner.dtype, device=feats.device),
                    torch.zeros(1, self.inner.draft_vocab_size, dtype=torch.float32, device=feats.device))
        h, logits = self.inner.extend(feats[0], next_ids[0], n[0])
        kv.length += k
        return h[None], logits.float()[None]

    def chain_rows(self, kv: _OneRow, h_last, logits_last, steps: int, root, span: int):
        return None  # no walk of its own: decoding.tree walks the chain over step_rows

    def tree_rows(self, kv: _OneRow, h_last, logits_last, root, frame: tuple, steps: int, n_sel: int, span: int):
        return None  # (as chain_rows)

    def step_rows(self, kv: _OneRow, hidden, ids, positions, slots, mask):
        kv.sync()
        S = self.inner.span  # the engine's masks cover the span it attends over; the draft's step takes its whole span
        full = torch.zeros(mask.shape[1], S, dtype=torch.bool, device=mask.device)
        full[:, :mask.shape[2]] = mask[0, :, :S]
        h, logits = self.inner.step(hidden[0], ids[0], positions[0], slots[0], full)
        return h[None], logits.float()[None]


def one_row(target, draft, max_batch: int):
    """-> (target, draft, whether either is adapted) as the engine drives them: a backend without the row interface
    behind its one-row adapter (at max_batch 1; more rows are refused with E308)."""
    adapted = False
    if not target.batched:
        if max_batch != 1:
            target.row_cache(max_batch, 0)  # the backend's own refusal, naming the fix
        target, adapted = OneRowTarget(target), True
    if draft is not None and not draft.batched:  # (Draft.batched: the row interface, extend_rows with it)
        if max_batch != 1:
            _refuse(draft, max_batch)
        draft, adapted = OneRowDraft(draft), True
    return target, draft, adapted
