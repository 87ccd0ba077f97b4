"""Per-cycle phase profiler: CUDA events on a GPU (read once at the end, no sync in the loop),
perf_counter on a CPU. Disabled, `phase()` returns one shared null context: nothing is timed."""

from __future__ import annotations

import contextlib
import time

import torch

_NULL = contextlib.nullcontext()
# timed events held before the completed ones are added up (a server's profile runs for days)
FOLD_AT = 4096


class Profiler:
    """`ranges=True` also opens a torch.profiler range (and an NVTX range on a GPU) per phase, for
    `--profile-trace`."""

    def __init__(self, enabled: bool = False, device="cpu", ranges: bool = False):
        self.enabled = enabled or ranges
        self.ranges = ranges
        self.cuda = self.enabled and torch.device(device).type == "cuda"
        self._cpu: dict[str, float] = {}
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def phase(self, name: str):
        if not self.enabled:
            return _NULL
        timer = self._cuda_phase(name) if self.cuda else self._cpu_phase(name)
        return self._ranged(name, timer) if self.ranges else timer

    @contextlib.contextmanager
    def _ranged(self, name, timer):
        with torch.profiler.record_function(f"eaglekit.{name}"), timer:
            if self.cuda:
                torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                if self.cuda:
                    torch.cuda.nvtx.range_pop()

    @contextlib.contextmanager
    def _cpu_phase(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._cpu[name] = self._cpu.get(name, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def _cuda_phase(self, name):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        try:
            yield
        finally:
            b.record()
            self._events.append((name, a, b))
            if len(self._events) > FOLD_AT:
                self._fold()

    def _fold(self) -> None:
        """The events that have completed, into the totals (no synchronisation: events of one stream complete in
        order, so the first one still pending ends the pass)."""
        done = 0
        for name, a, b in self._events:
            if not b.query():
                break
            self._cpu[name] = self._cpu.get(name, 0.0) + a.elapsed_time(b) / 1e3
            done += 1
        del self._events[:done]

    def totals(self) -> dict[str, float]:
        """Seconds per phase. On CUDA this synchronises once (and folds the events into the totals: a long-running
        engine's list of events stays short)."""
        if self._events:
            torch.cuda.synchronize()  # (every event has completed: the fold takes them all)
            self._fold()
        return dict(self._cpu)

    def reset(self) -> None:
        self._cpu, self._events = {}, []
