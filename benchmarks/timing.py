"""The one timer of the suite and the lab probes: milliseconds per call of `fn`, after `warm` untimed calls.
On a GPU each call sits between two CUDA events (device time of what the call enqueued, synchronised after
each call); on a CPU, perf_counter around the call. `before` runs before each call, outside the timed span
(e.g. a cycle's lengths put back), so scaffolding never counts as the thing measured."""

from __future__ import annotations

import statistics
import time

import torch


def samples_ms(fn, reps: int, warm: int = 2, cuda: bool | None = None, before=None) -> list[float]:
    cuda = torch.cuda.is_available() if cuda is None else cuda
    for _ in range(warm):
        if before is not None:
            before()
        fn()
    if cuda:
        torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        if before is not None:
            before()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def median_ms(fn, reps: int, warm: int = 2, cuda: bool | None = None, before=None) -> float:
    return statistics.median(samples_ms(fn, reps, warm, cuda, before))


def graph_ms(body, reps: int = 30) -> float:
    """Median ms of one replay of `body` recorded once in a CUDA graph (eaglekit's recorder: warm-up on a side stream
    first; events around each replay)."""
    from eaglekit.kernels.invariant_gemm import graph_ms as per_call

    return per_call(lambda i: body(), 1, reps)


def phase_ms(run, names, reps: int, cuda: bool, before) -> dict:
    """Median ms of each phase of a cycle run phase by phase (`run(name)`), `reps` cycles from the same state: on a
    GPU CUDA events between the phases' replays (one synchronisation a cycle), on a CPU the wall clock."""
    out = {n: [] for n in names}
    for _ in range(reps):
        before()
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(names) + 1)]
            ev[0].record()
            for n, e in zip(names, ev[1:]):
                run(n)
                e.record()
            torch.cuda.synchronize()
            for n, a, b in zip(names, ev, ev[1:]):
                out[n].append(a.elapsed_time(b))
        else:
            for n in names:
                t0 = time.perf_counter()
                run(n)
                out[n].append((time.perf_counter() - t0) * 1e3)
    return {n: round(statistics.median(v), 4) for n, v in out.items()}


class StoodRows:
    """The one engine stood at B prompts for timing (B = len(prompts), max batch B): `step()` is a plain decode step of
    the B rows (each its plain step's `plain_rows` rows), `cycle(shape)` one speculative cycle of `shape` (default the
    engine's; a shorter length the engine can run is recorded on first use) phase by phase (`run(phase, shape)`,
    phases `PHASES`), `restore()` puts the committed state back (call it before each timed call: lengths, roots, the
    draft's hidden and logits). With a draft the engine has prefilled every row and run one cycle, so the shape's
    graphs are recorded (on a GPU) and every compiled walk compiled. `capture`: the capture to run with, for a pair
    built by hand (random weights, no checkpoint): the pair's checks are skipped (what is timed does not depend on
    them). `engine` takes BatchEngine's other arguments (spec_max_batch, adaptive)."""

    def __init__(self, target, draft, shape, prompts: list, graphs: bool, plain_rows: int = 1,
                 max_new: int = 256, capture=None, **engine):
        from eaglekit.decoding.config import EngineOptions
        from eaglekit.decoding.engine import BatchEngine, Request

        engine.setdefault("adaptive", False)
        self.engine = BatchEngine(target, draft, EngineOptions(shape=shape, max_batch=len(prompts), graphs=graphs,
                                                               plain_rows=plain_rows, capture=capture,
                                                               pair_checked=capture is not None, **engine))
        for i, prompt in enumerate(prompts):
            ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
            self.engine.add(Request(f"r{i}", ids, max_new, eos_ids=()))
        self.shape = shape
        with torch.inference_mode():
            self.engine.step()  # the prefills, this size's graphs, one cycle (or plain step)
            self.c = self.engine.cycle(shape)
        self.PHASES = self.c.SPEC
        self._state = self.c.moving()
        self._snap = [x.clone() for x in self._state]
        self._by_shape = {shape: self.c}  # each shape's engine rows, recorded once

    @torch.inference_mode()  # (the engine's state tensors are inference tensors)
    def restore(self) -> None:
        for x, v in zip(self._state, self._snap):
            x.copy_(v)

    def rows(self, shape=None):
        """The engine's rows for `shape` (default the stood shape), recorded on first use (GPU) and stood back."""
        shape = shape or self.shape
        if shape not in self._by_shape:
            with torch.inference_mode():
                self._by_shape[shape] = self.engine.cycle(shape)
            self.restore()
        return self._by_shape[shape]

    def run(self, phase: str, shape=None) -> None:
        with torch.inference_mode():
            self.rows(shape).run(phase)

    def step(self) -> None:
        self.run("plain")
        self.run("plain_commit")

    def cycle(self, shape=None) -> None:
        c = self.rows(shape)
        with torch.inference_mode():
            for ph in c.SPEC:
                c.run(ph)


class OneRow(StoodRows):
    """StoodRows at one prompt: the one engine at one row (what generate, demo and `serve --max-batch 1` run)."""

    def __init__(self, target, draft, shape, prompt: torch.Tensor, graphs: bool, plain_rows: int = 1,
                 max_new: int = 256, capture=None):
        super().__init__(target, draft, shape, [prompt], graphs, plain_rows, max_new, capture)
