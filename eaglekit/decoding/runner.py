"""The cycles the engine runs, by padded size and shape: recorded in CUDA graphs (on a GPU) or eager, and the
policy's costs timed at warm-up.

Running rows are kept compact in rows [0, b), so a cycle works on a block of rows padded to the next recorded size
(1, 2, 4, 8, ..., capped at max_batch: padded_size); padding rows are inactive (their accepted count is forced to 0,
so their lengths never move) and write only their own pending slots. With graphs each phase is recorded once per
padded size, span and shape; eagerly one Cycle per size and shape runs over the span the rows actually use.
"""

from __future__ import annotations

import time

import torch

from ..kernels.graphs import record_graphs
from ..observe import trace
from .phases import Cycle, pending_slots
from .state import BatchState, Setup
from .tree import TreeShape

# replays per length when the policy's costs are timed at warm-up (the fastest counts)
WARMUP_REPS = 3


def padded_size(b: int, max_batch: int) -> int:
    """The captured batch size that holds b rows: the next power of two, capped at max_batch."""
    p = 1
    while p < b:
        p *= 2
    return min(p, max_batch)


def record(c: Cycle, plain: bool = True) -> None:
    """Record each of c's phases in a CUDA graph (`plain`: the plain step's too; one shape per padded size records
    them). Warm-up runs the speculative group and the plain group, each restoring `c.moving()` after it."""
    spec = c.setup.draft is not None and not c.quiet  # (a quiet Cycle holds the plain step alone)
    groups = ([[getattr(c, p) for p in c.SPEC]] if spec else []) + ([[c.plain, c.plain_commit]] if plain else [])
    names = (list(c.SPEC) if spec else []) + (["plain", "plain_commit"] if plain else [])
    c.recorded = record_graphs(groups, {p: getattr(c, p) for p in names}, c.moving())


class GraphRunner:
    """The engine's cycles over the running rows: `cycle` (a speculative cycle's, which also holds the plain step)
    and `plain` (the plain step's) by padded size, span and shape, recorded where `graphs` and tracing is off, and the
    policy's costs at each padded size timed when it is first recorded (or by `warm`). `shapes`: the lengths a step
    may run, by draft length; `policy`: the SpecPolicy, or None."""

    def __init__(self, setup: Setup, st: BatchState, shape: TreeShape, shapes: dict, policy, graphs: bool):
        self.setup, self.st, self.shape, self.shapes, self.policy = setup, st, shape, shapes, policy
        self.graphs = graphs
        self.pad = graphs  # fixed padded shapes pay off only with graphs; eager runs the real rows
        self.cycles: dict = {}  # (padded rows, span, shape) -> the recorded (or eager) cycle and plain step
        self.quiet: dict = {}  # (padded rows, span) -> the recorded plain step that keeps no features (plain)

    def clear(self) -> None:
        """Forget every cycle (the caches moved: graphs hold the old caches' addresses)."""
        self.cycles.clear()
        self.quiet.clear()

    def use_graphs(self) -> bool:
        return self.graphs and not trace.ENABLED  # tracing reads tensors on the host: eager only

    def cycle(self, b: int, top: int, shape: TreeShape | None = None) -> Cycle:
        """The cycle of `shape` (default the whole tree; its Cycle also holds the plain step) over b running rows, the
        longest `top` entries long."""
        shape = shape or self.shape
        B = padded_size(b, self.st.max_batch) if self.pad else b
        S = self.st.S
        if not self.use_graphs():
            # eager: one Cycle per size and shape (its buffers are overwritten by every step). The target attends over
            # the whole span S, as a recorded cycle does: a CPU's attention rounds a row by how many key slots the call
            # has, so with a width cut to this step's reach (top + draft_tokens) a verify row and the baseline's step at
            # the same position got other bits, and the SmolLM2 pair in bf16 matched its verify-shaped reference on 6
            # of 10 prompts (10 of 10 over S; docs/performance.md#d60). The draft attends over what a cycle reaches:
            # its arithmetic changes no emitted token.
            key = ("eager", B, S, shape)
            if key not in self.cycles:
                self.cycles[key] = Cycle(self.setup, self.st, B, S, 0, shape)
            c = self.cycles[key]
            c.Sd = top + pending_slots(shape)
            return c
        if (B, S, shape) not in self.cycles:
            self.record(B)
        return self.cycles[B, S, shape]

    def plain(self, b: int, top: int, keeping: bool) -> Cycle:
        """The plain step's Cycle: where no row keeps its draft (not `keeping`), one that neither captures the target's
        features nor writes the catch-up window (recorded: the quiet graph; eager: the same Cycle told so for this
        step)."""
        c = self.cycle(b, top)
        if c.recorded is None:
            c.capturing = keeping
        elif not keeping and self.st.dk is not None:
            c = self.quiet[c.B, self.st.S]
        return c

    def record(self, B: int) -> None:
        """Record the graphs of padded size B over the current span: the whole tree's cycle and the plain step, and
        with the policy on every shorter length's cycle too, all at once (a length recorded on the policy's first
        try would put a recording inside a running step). The first time B is seen, the policy's costs at B are
        timed here, at warm-up (time_costs)."""
        S = self.st.S
        shapes = list(self.shapes.values()) if self.policy is not None else [self.shape]
        for shape in shapes:
            # the draft attends over the slots a cycle can reach (rows hold at most S entries), not over the whole
            # allocation, whose catch-up room (CATCH_UP slots) only the eager catch-up's padding writes use: an SDPA
            # draft reads every slot of its span
            Sd = S + pending_slots(shape) if self.st.dk is not None else 0
            c = Cycle(self.setup, self.st, B, S, Sd, shape)
            record(c, plain=shape == self.shape)
            self.cycles[B, S, shape] = c
        if self.st.dk is not None:  # the plain step without the capture and the catch-up window's writes
            q = Cycle(self.setup, self.st, B, S, 0, self.shape, quiet=True)
            record(q)
            self.quiet[B, S] = q
        if self.policy is not None and B not in self.policy.plain:
            self.time_costs(B, {shape: self.cycles[B, S, shape] for shape in shapes})

    def warm(self, B: int, at: int, graphs: bool) -> None:
        """Warm-up at padded size B, its rows standing at length `at`: record its graphs (`graphs`), or eagerly time
        the policy's costs there."""
        if graphs:
            if (B, self.st.S, self.shape) not in self.cycles:
                self.record(B)
        elif self.policy is not None and B not in self.policy.plain:
            self.time_costs(
                B,
                {
                    s: Cycle(self.setup, self.st, B, at + s.draft_tokens, at + pending_slots(s), s)
                    for s in self.shapes.values()
                },
            )

    def warm_sizes(self, sizes: list[int], at: int, graphs: bool, progress: bool = False) -> None:
        """`warm` each padded size in turn, its rows standing at length `at` (BatchState.stand) and idle again after,
        whatever the warm-up raised."""
        from tqdm import tqdm

        for B in tqdm(sizes, desc="warming up: batch sizes", unit="size", disable=not progress, leave=False):
            self.st.stand(B, at)
            try:
                self.warm(B, at, graphs)
            finally:  # back to an idle engine
                self.st.idle()

    def time_costs(self, B: int, cycles: dict) -> None:
        """Seed the policy's costs at padded size B with the time of each length's cycle and of the plain step (the
        fastest of WARMUP_REPS runs each, from the same state, restored after; `cycles`: each shape's Cycle, recorded
        or eager), so that serving spends no step on timing a length. The running wall times refine them as the engine
        runs (SpecPolicy)."""
        c0 = cycles[self.shape]
        moving = c0.moving()
        snap = [x.clone() for x in moving]
        sync = torch.cuda.synchronize if self.st.device.type == "cuda" else (lambda: None)

        def timed(fn) -> float:
            best = float("inf")
            for _ in range(WARMUP_REPS):
                for x, v in zip(moving, snap):
                    x.copy_(v)
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                best = min(best, time.perf_counter() - t0)
            for x, v in zip(moving, snap):
                x.copy_(v)
            return best

        plain = timed(lambda: (c0.run("plain"), c0.run("plain_commit")))
        spec = {}
        for j, shape in self.shapes.items():
            c = cycles[shape]
            spec[j] = timed(lambda c=c: [c.run(p) for p in c.SPEC])
        self.policy.seed_costs(B, plain, spec)
