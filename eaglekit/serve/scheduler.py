"""The engine loop: ONE background thread owns the BatchEngine; requests reach it through an inbox.

    HTTP handler (event loop)                      engine thread
    submit(req) -> Handle ---- inbox: add ------>  engine.add(req)
    Handle.cancel()       ---- inbox: cancel --->  engine.cancel(rid)      (slot and KV freed before the next step)
    async for ev in Handle  <- call_soon_threadsafe(deliver, events) <-  engine.step()

Only the engine thread touches the engine; only the event loop touches the handles and the admission count,
so neither side needs a lock beyond the inbox's. Admission: at most max_batch running plus max_queue waiting
requests; the next one is refused with 429 before it costs anything.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import traceback

from ..errors import EaglekitError
from ..observe import trace
from .protocol import ApiError, from_eaglekit

log = logging.getLogger("eaglekit.serve")

_REASON = {"stop": "stop", "length": "length", "cancelled": "abort"}  # engine stop_reason -> vLLM FinishReason


class Handle:
    """One request as the event loop sees it: an async iterator over the engine's events, plus timings."""

    def __init__(self, sched: "Scheduler", req):
        self.sched, self.req, self.rid = sched, req, req.rid
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrival = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.drafts = 0  # verify steps that used the draft, for this request
        self.draft_tokens = 0
        self.accepted = 0
        self.finished = False
        self.stop_reason: str | None = None

    def cancel(self, err: ApiError | None = None) -> None:
        """The client went away (or the drain ran out): free the slot now, wake the waiter with `err`
        (idempotent; a finished request is left alone)."""
        if not self.finished:
            self.sched._cancel(self, err)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished and self.queue.empty():
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, ApiError):
            raise item
        return item

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify step on SGLang's scale (1 + accepted / drafts); None when no draft was used."""
        return 1 + self.accepted / self.drafts if self.drafts else None


class Scheduler:
    def __init__(self, engine, metrics, max_batch: int, max_queue: int, on_finish=None):
        self.engine, self.metrics = engine, metrics
        self.capacity = max_batch + max_queue
        self.on_finish = on_finish  # called with a finished Handle (tracing)
        self._inbox: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.handles: dict[str, Handle] = {}  # event-loop side only
        self.accepting = True
        self.cancelled = 0
        self.step_errors = 0
        self.steps = 0
        # the engine thread's busy iterations (those that stepped): seconds inside engine.step() and the rest of them
        # (the inbox's operations, the metrics, the hand-off of events to the event loop). Counted always (four clock
        # reads an iteration); /server_info shows them beside the engine's profile
        self.loop_seconds = {"in_step": 0.0, "outside_step": 0.0}

    # --- event loop side ---------------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="eaglekit-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, req) -> Handle:
        if not self.accepting:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        if not self.alive:
            raise ApiError(503, "the engine thread is not running (see the server log)", code="engine_down")
        if len(self.handles) >= self.capacity:
            self.metrics.reject("queue_full")
            raise ApiError(
                429,
                f"the queue is full ({len(self.handles)} requests in flight, at most "
                f"{self.capacity} = max batch + max queue); retry later",
                code="queue_full",
            )
        h = Handle(self, req)
        self.handles[req.rid] = h
        self._post(("add", req))
        return h

    def _cancel(self, h: Handle, err: ApiError | None = None) -> None:
        h.finished, h.stop_reason = True, "cancelled"
        if self.handles.pop(h.rid, None) is not None:
            self.cancelled += 1
            self.metrics.finished("abort")
            self._post(("cancel", h.rid))
            h.queue.put_nowait(err or ApiError(503, "the request was cancelled", code="cancelled"))  # wakes a waiter

    def _deliver(self, events, t: float) -> None:
        m = self.metrics
        for ev in events:
            h = self.handles.get(ev.rid)
            if h is None:  # cancelled meanwhile
                continue
            if ev.stop_reason == "error":  # the engine ended this request alone (BatchEngine._guard)
                self._fail(ev.rid, ApiError(500, f"internal error in this request's step: {ev.error}"))
                continue
            if ev.token_ids:
                if h.first is None:
                    h.first = t
                    m.ttft.observe(t - h.arrival)
                else:
                    assert h.last is not None  # set with the first token
                    m.itl.observe(t - h.last)
                h.last = t
                h.tokens += len(ev.token_ids)
            if ev.drafted is not None:
                h.drafts += 1
                h.draft_tokens += ev.drafted
                h.accepted += ev.accepted or 0
            if ev.finished:
                h.finished, h.stop_reason = True, ev.stop_reason
                del self.handles[ev.rid]
                m.e2e.observe(t - h.arrival)
                m.finished(_REASON.get(ev.stop_reason, "stop"))
                if self.on_finish is not None:
                    self.on_finish(h)
            h.queue.put_nowait(ev)

    def _fail(self, rid: str, err: ApiError) -> None:
        h = self.handles.pop(rid, None)
        if h is not None:
            h.finished, h.stop_reason = True, "error"
            h.queue.put_nowait(err)

    async def drain(self, timeout: float) -> None:
        """Refuse new requests, let the ones in flight finish (up to `timeout` s), then end the rest with a 503
        their clients receive (a JSON error, or a stream's error event and [DONE]). The engine thread keeps
        running, so that those responses are written; close() stops it."""
        self.accepting = False
        t0 = time.monotonic()
        while self.handles and time.monotonic() - t0 < timeout:
            await asyncio.sleep(0.05)
        for h in list(self.handles.values()):
            h.cancel(
                ApiError(
                    503,
                    f"the server is shutting down and this request did not finish within "
                    f"--drain-timeout ({timeout:g} s)",
                    code="shutting_down",
                )
            )

    async def close(self) -> None:
        """Stop the engine thread without blocking the event loop (it may be inside a step)."""
        await asyncio.to_thread(self.stop)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # --- engine thread -----------------------------------------------------------------------------
    def _post(self, op) -> None:
        with self._cv:
            self._inbox.append(op)
            self._cv.notify()

    def _to_loop(self, fn, *args) -> None:
        assert self.loop is not None  # start() sets it before the engine thread runs
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the process is exiting
            pass

    def _run(self) -> None:
        import torch

        # inference mode is per thread: the engine's tensors are inference tensors, and cancel() and add()
        # update them in place too, not only step()
        try:
            with torch.inference_mode():
                self._loop()
        except BaseException:  # a bug outside the guarded calls: no request may wait forever on a dead thread
            log.error("the engine thread stopped:\n%s", traceback.format_exc())
            self._to_loop(self._fail_all, ApiError(500, "the engine thread stopped (see the server log)"))
            raise

    def _fail_all(self, err: ApiError) -> None:
        for rid in list(self.handles):
            self._fail(rid, err)

    def _loop(self) -> None:
        eng, m = self.engine, self.metrics
        live: set[str] = set()  # rids the engine holds (this thread's own view)
        while True:
            t0 = time.perf_counter()
            with self._cv:
                while not self._inbox and not eng.has_work and not self._stopping:
                    self._cv.wait()
                    t0 = time.perf_counter()  # (an idle wait is no iteration's cost)
                if self._stopping and not self._inbox:
                    return
                ops = list(self._inbox)
                self._inbox.clear()
            for op, arg in ops:
                if op == "cancel":
                    if arg in live:
                        live.discard(arg)
                        try:
                            eng.cancel(arg)
                        except Exception:
                            log.error("engine.cancel failed:\n%s", traceback.format_exc())
                    continue
                try:
                    eng.add(arg)
                    live.add(arg.rid)
                    m.prompt_tokens.inc(len(arg.prompt_ids))
                except EaglekitError as e:
                    self._to_loop(self._fail, arg.rid, from_eaglekit(e))
                except Exception as e:  # a bug: keep serving, tell this client
                    log.error("engine.add failed:\n%s", traceback.format_exc())
                    self._to_loop(self._fail, arg.rid, ApiError(500, f"internal error: {e!r}"))
            if not eng.has_work:
                m.running.set(eng.num_running)
                m.waiting.set(eng.num_waiting)
                continue
            if trace.ENABLED:  # a server's cycle is an engine step: EAGLE3_DEBUG_STEPS=N traces the first N
                trace.set_cycle(self.steps)
            s0 = time.perf_counter()
            try:
                events = eng.step()
            except Exception as e:
                # a failed step leaves its requests in an unknown state: end them all, keep the server up
                self.step_errors += 1
                log.error("engine.step failed:\n%s", traceback.format_exc())
                err = ApiError(500, f"internal error in the engine step: {e!r}")
                for rid in list(live):
                    try:
                        eng.cancel(rid)
                    except Exception:
                        pass
                    self._to_loop(self._fail, rid, err)
                live.clear()
                continue
            self.steps += 1
            t = time.perf_counter()
            self.loop_seconds["in_step"] += t - s0  # (before the hand-off: a reader that saw the events sees the step)
            for ev in events:
                if ev.finished:
                    live.discard(ev.rid)
            m.generation_tokens.inc(sum(len(ev.token_ids) for ev in events))
            m.running.set(eng.num_running)
            m.waiting.set(eng.num_waiting)
            m.observe_spec(eng.spec_stats)
            if events:
                self._to_loop(self._deliver, events, t)
            self.loop_seconds["outside_step"] += time.perf_counter() - t0 - (t - s0)
