"""The rows' cache spans: how long every row's span is, its growth, and compaction.

Every row of the target's and the draft's caches has the same span S (slots), a multiple of a quantum (256 where
the phases are recorded in CUDA graphs, each span recording its own; 64 eagerly) that holds the longest request plus
what a cycle writes past it; the draft's span has room past S for a cycle's pending nodes and the catch-up window's
padding writes. A request that needs more grows the caches (entries kept). Running rows stay compact in [0, b): a
finished row is refilled by the last one (its entries copied).
"""

from __future__ import annotations

from .phases import pending_slots
from .state import CATCH_UP, BatchState, Setup
from .tree import TreeShape


class RowAllocator:
    def __init__(self, setup: Setup, st: BatchState, shape: TreeShape):
        self.setup, self.st, self.shape = setup, st, shape

    def ensure_span(self, need: int, keep: bool, graphs: bool) -> bool:
        """Make every row's span hold `need` slots -> whether the caches changed (recorded cycles must go). `keep`:
        rows are running (grow the caches, their entries kept; else fresh caches, a one-row cache the backend's
        own)."""
        st = self.st
        if need <= st.S and st.tk is not None:
            return False
        q = 256 if graphs else 64
        S = -(-need // q) * q
        extra = max(self.shape.steps * self.shape.topk, pending_slots(self.shape))  # (the cycles' draft spans)
        if self.setup.draft is not None:  # a catch-up extend's padding writes up to CATCH_UP slots past a row's length
            extra = max(extra, CATCH_UP)
        if st.tk is None or not keep:
            st.make(self.setup, S, S + extra)
        else:
            st.grow(S, S + extra)
        return True

    def free(self, rows: list, r: int) -> None:
        """Drop row r of `rows` (the running sequences, index == cache row): the last running row moves into it (rows
        stay compact), the last row is cleared."""
        last = len(rows) - 1
        if r != last:
            upto = rows[last].length + self.shape.draft_tokens + 1
            self.st.move_row(last, r, upto, upto + self.shape.steps * self.shape.topk)
            rows[r] = rows[last]
        rows.pop()
        self.st.clear_row(last)
