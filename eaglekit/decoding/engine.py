"""The one EAGLE-3 decode engine, with continuous batching: `eaglekit serve` runs it with many rows, and generate,
demo, eval, sweep and the doctor with a batch of one (eaglekit.decoding.decoder.Decoder).

Every running sequence owns one row of the target's and the draft's KV caches (eaglekit.models.layers.RowKV:
per-row committed lengths on the device, per-row slots). A step that finds requests waiting admits them into free
rows (one prefill each) and returns their first tokens; any other step runs ONE cycle for all running rows together
(decoding.phases: draft tree -> verify -> accept -> cache update -> draft extend) or one plain decode step.

The engine keeps intake (add, cancel), admission and the step's choice, and wires the pieces that do the rest, each
in its own module: the batch's device tensors (decoding.state.BatchState), the cycle's phases on them
(decoding.phases.Cycle), the rows' spans, growth and compaction (decoding.allocator.RowAllocator), the cycles by
padded size recorded in CUDA graphs or run eagerly, and the warm-up's timings (decoding.runner.GraphRunner), the
counters and phase times (decoding.stats.EngineStats).

How far a step speculates is the policy's choice (eaglekit.decoding.adaptive.SpecPolicy): a cycle of the tree
shape or of one of its shallower versions (TreeShape.shorter), or a plain batched decode step (one token per row),
whichever gives more tokens per second at this padded size by the engine's own timings and running per-position
acceptance. Every length's output is the target's (acceptance is exact at any length); only the speed differs. A plain
step captures the target's features of its token into a per-row window (CATCH_UP tokens); before the next tree cycle the
draft extends over the window, so rows keep their draft through plain steps. A row whose window overflows (speculation
off for longer than CATCH_UP steps, or past `spec_max_batch` rows) stays draft-less (it accepts only the
root in later cycles: still one exact target token per cycle) until it finishes; rows admitted later draft
again. `adaptive=False` runs the whole tree shape on every step up to `spec_max_batch` rows.

`synthetic_accept_length` (benchmarks only, never lossless): acceptance replaced by
eaglekit.decoding.accept.accept_synthetic_rows at the per-position rate that gives that accept length, so
that serving speed at a target's shape can be measured with random weights. `synthetic` names the rate.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from functools import partial

import torch

from ..errors import GenerationError
from ..kernels.compiling import prompt_calls
from ..models.base import Target
from ..observe import trace
from .accept import synthetic_rate
from .adaptive import SpecPolicy
from .allocator import RowAllocator
from .config import EngineOptions
from .phases import Cycle
from .prefill import Prefiller
from .requests import Event, Request, Seq, seeded, validate
from .runner import GraphRunner, padded_size
from .sampling import SamplingParams, make_generator, probs, sample
from .state import CATCH_UP, BatchState, Setup
from .stats import EngineStats
from .stops import Emitter
from .tree import TreeShape

log = logging.getLogger(__name__)


class BatchEngine:
    """Continuous-batching EAGLE-3 decoder over one target (and optionally one draft). Not thread-safe by
    itself beyond a lock around add / cancel / step: call them from any thread, one at a time."""

    def __init__(self, target: Target, draft=None, options: EngineOptions | None = None, tokenizer=None):
        o = self.options = options or EngineOptions()
        max_batch = o.max_batch
        if draft is not None:
            from ..draft import check_pair

            # `pair_checked`: the caller checked the pair and passes the capture to run with (decoding.decoder.Decoder)
            capture = o.capture if o.pair_checked else check_pair(draft, target, o.capture, o.allow_other_target)
        else:
            capture = None
        # a backend that holds one sequence (not `batched`: its row interface is one row over its own sequence) runs
        # as a batch of one, eagerly; more rows are its own refusal (E308), naming the fix
        self.one_sequence = not target.batched or (draft is not None and not draft.batched)
        if self.one_sequence and max_batch != 1:
            for backend in (target, draft):
                if backend is not None and not backend.batched:
                    backend.row_cache(max_batch, 0)
        self.target, self.tokenizer = target, tokenizer
        self.shape = shape = o.tree
        self.max_batch = max_batch
        self.device = target.device
        self.spec_max_batch = max_batch if o.spec_max_batch is None else o.spec_max_batch
        P = shape.path_len
        # the shapes a step may run, by draft length (accepted-path positions): the tree and its shallower versions
        self.shapes = {s.path_len - 1: s for s in shape.shorter()}
        policy = SpecPolicy(P - 1, tuple(self.shapes)) if draft is not None and o.adaptive else None
        synthetic = None
        if o.synthetic_accept_length is not None:
            if draft is None:
                raise GenerationError("synthetic acceptance needs a draft", fix="serve with --draft", code="E317")
            synthetic = synthetic_rate(float(o.synthetic_accept_length), P - 1)
            policy = None  # a synthetic run measures the whole tree's cycle: no choice from its timings
        self.setup = Setup(target, draft, capture, synthetic, o.plain_rows)
        self.state = BatchState(max_batch, self.device)
        self.alloc = RowAllocator(self.setup, self.state, shape)
        # (a one-sequence backend reads its row's length on the host each call: never in CUDA graphs)
        graphs = not self.one_sequence and (
            (self.device.type == "cuda" and target.static) if o.graphs == "auto" else bool(o.graphs)
        )
        self.runner = GraphRunner(self.setup, self.state, shape, self.shapes, policy, graphs)
        self.stats = EngineStats(P - 1, self.shapes, o.profile, self.device, ranges=o.profile_ranges)
        self.spec_stats, self.profiler = self.stats.spec, self.stats.profiler  # (read by serve and the Decoder)
        self.rows: list[Seq] = []  # running; index == cache row
        self.waiting: deque[Seq] = deque()
        self._cancelled: list[Event] = []
        self._pending_admitted: list[Seq] = []  # admitted by `admit`, their events due with the next step
        self._lock = threading.RLock()
        self.prefiller = Prefiller(self.setup, self.state, o.strict_features)
        # what the sampled requests without a seed draw from, together (EngineOptions.seed)
        self.shared_gen = make_generator(SamplingParams(1.0, seed=o.seed), self.device)
        self._last_step: str | None = None  # "cycle" or "plain": the step before this one (None: a prefill) (_settled)

    # --- what the pieces share (tests hand in a draft, a capture, a policy or the recorded layout after construction)
    draft = property(lambda self: self.setup.draft, lambda self, v: setattr(self.setup, "draft", v))
    capture = property(lambda self: self.setup.capture, lambda self, v: setattr(self.setup, "capture", v))
    synthetic = property(lambda self: self.setup.synthetic)
    plain_rows = property(lambda self: self.setup.plain_rows)
    policy = property(lambda self: self.runner.policy, lambda self, v: setattr(self.runner, "policy", v))
    graphs = property(lambda self: self.runner.graphs, lambda self, v: setattr(self.runner, "graphs", v))
    pad = property(lambda self: self.runner.pad, lambda self, v: setattr(self.runner, "pad", v))

    # --- public interface ----------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.rows or self.waiting or self._cancelled or self._pending_admitted)

    @property
    def num_running(self) -> int:
        return len(self.rows)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def prefills(self) -> int:
        return self.stats.prefills

    def validate(self, req: Request) -> None:
        validate(req, self.target.info, self.tokenizer)

    def add(self, req: Request) -> Seq:
        """Queue a request (admitted by the next step, or by `admit`) -> its running state (the engine's own)."""
        self.validate(req)
        with self._lock:
            if any(s.req.rid == req.rid for s in (*self.rows, *self.waiting)):
                raise GenerationError(
                    f"request id {req.rid!r} is already in the engine", fix="give every request its own id", code="E307"
                )
            eos = self.target.info.eos_token_ids if req.eos_ids is None else req.eos_ids
            em = Emitter(req.max_new_tokens, eos, req.stop_strings, self.tokenizer)
            sp = req.sampling
            s = Seq(req, em, make_generator(sp, self.device) if seeded(sp) or sp.greedy else self.shared_gen)
            self.waiting.append(s)
            return s

    @torch.inference_mode()
    def admit(self) -> None:
        """Prefill waiting requests into free rows now (what `step` does first); the one-request Decoder calls it so
        that a trace shows the prefill as cycle 0, apart from the first cycle. Their first tokens come with the next
        `step`'s events."""
        with self._lock:
            self._pending_admitted = self._pending_admitted + self._admit()

    @torch.inference_mode()  # the caches are inference tensors (made inside step)
    def cancel(self, rid: str) -> None:
        with self._lock:
            for s in self.waiting:
                if s.req.rid == rid:
                    self.waiting.remove(s)
                    break
            else:
                r = next((i for i, s in enumerate(self.rows) if s.req.rid == rid), None)
                if r is None:
                    return  # unknown or already finished
                self._free(r)
            self._cancelled.append(Event(rid, [], True, "cancelled", None, None))

    @torch.inference_mode()
    def step(self) -> list[Event]:
        with self._lock:
            t0 = time.perf_counter()
            events, self._cancelled = self._cancelled, []
            fresh = self._admit()
            admitted, self._pending_admitted = self._pending_admitted + fresh, []
            # A step that prefills returns with the new rows' first tokens (each picked from its prefill) and decodes
            # nothing: a new request's first token does not wait for a decode step of every row too (its TTFT), and
            # the next step decodes every row, the new ones with them.
            decoded = bool(self.rows) and not fresh
            if decoded:
                shape = self._speculate()
                if shape is not None:
                    self._spec_cycle(shape)
                else:
                    self._plain_step()
            # events for every row touched this step (admitted rows that finished at prefill included)
            done = []
            for s in admitted + (self.rows if decoded else []):
                if s not in done:
                    done.append(s)
                    events.append(s.event())
            for r in range(len(self.rows) - 1, -1, -1):
                if self.rows[r].ended:
                    self._free(r)
            # (a decoding step's kind is the one it ran: _spec_cycle and _plain_step set _last_step)
            self.stats.stepped("prefill" if fresh else self._last_step if decoded else None, time.perf_counter() - t0)
            return events

    def cycle(self, shape: TreeShape | None = None) -> Cycle:
        """The cycle of `shape` (default the whole tree; its Cycle also holds the plain step) over the running rows,
        recorded first where the engine records (benchmarks time its phases: benchmarks.timing)."""
        return self.runner.cycle(len(self.rows), max(s.length for s in self.rows), shape)

    # --- rows ----------------------------------------------------------------------------------
    def _ensure_span(self, need: int) -> None:
        if self.alloc.ensure_span(need, bool(self.rows), self.graphs):
            self.runner.clear()  # graphs hold the old caches' addresses

    def _free(self, r: int) -> None:
        self.alloc.free(self.rows, r)

    def _admit(self) -> list[Seq]:
        k = min(len(self.waiting), self.max_batch - len(self.rows))
        if k == 0:
            return []
        with_draft = self.draft is not None and len(self.rows) + k <= self.spec_max_batch
        # Where the draft does not pay by the policy's figures, a new row skips the draft's prefill (what an unpaying
        # draft would cost it), except one row when none running has its draft: the sentinel whose cycles the policy's
        # probes measure, needed only if a probe can fall due while it lives (at most max_new_tokens steps; a row
        # admitted later takes the role when one can). Judged as if every row drafted (SpecPolicy.draft_pays): plain
        # steps chosen because few rows have a draft must not keep the draft from the rows admitted next. A seeded
        # sampled request always takes its draft: its random draws must not depend on what ran before it.
        pays = self.policy is None or self.policy.draft_pays(padded_size(len(self.rows) + k, self.max_batch))
        sentinel = any(s.use_draft for s in self.rows)
        seqs = [self.waiting.popleft() for _ in range(k)]
        # (a cycle writes draft_tokens pending slots past a row's length, a plain step plain_rows; the prompt graphs'
        # warm-up, before the first prefill, writes COMPILE_MAX_TOKENS + 1)
        past = max(len(s.req.prompt_ids) + s.req.max_new_tokens for s in seqs)
        self._ensure_span(max(past + max(self.shape.draft_tokens, self.plain_rows) + 1, self.prefiller.warm_span()))
        together: list[Seq] = []  # prefilled in shared forwards (EngineOptions.prefill_tokens), after the others
        for s in seqs:
            take = with_draft and (
                pays or seeded(s.req.sampling) or (not sentinel and self.policy.probe_within(s.req.max_new_tokens))
            )
            sentinel = sentinel or take
            if self.options.prefill_tokens and not take:
                together.append(s)
                continue
            r = len(self.rows)
            self.rows.append(s)
            with self.profiler.phase("prefill"):
                self._guard(s, self._prefill, s, r, take)
        # shortest first, so that a forward pads each prompt to a length near its own
        for chunk in _chunks(sorted(together, key=lambda s: len(s.req.prompt_ids)), self.options.prefill_tokens):
            r0 = len(self.rows)
            self.rows.extend(chunk)
            with self.profiler.phase("prefill"):
                self._prefill_together(chunk, r0)
        self._last_step = None  # (the prefills' queued work is not the next step's cost: _settled)
        # a request that stopped at its first token (or whose prefill failed) leaves before the cycle
        for r in range(len(self.rows) - 1, -1, -1):
            if self.rows[r].ended:
                self._free(r)
        return seqs

    def _prefill(self, s: Seq, r: int, with_draft: bool) -> None:
        self.prefiller.prefill(s, r, with_draft)
        self.stats.prefills += 1

    def _prefill_together(self, chunk: list[Seq], r0: int) -> None:
        """Rows r0.. prefilled in one forward, or each alone where that fails (Prefiller.prefill_together)."""
        pick = partial(_first_tokens, shared=self.shared_gen)
        if self.prefiller.prefill_together(chunk, r0, pick, lambda s, r: self._guard(s, self._prefill, s, r, False)):
            self.stats.prefills += len(chunk)

    # --- warm-up and profile -----------------------------------------------------------------------
    @torch.inference_mode()  # the caches are inference tensors
    def warm_up(self, span: int, sizes: list[int] | None = None, progress: bool = False) -> dict:
        """Before serving (an idle engine): for each padded size (default every one up to max_batch) record its CUDA
        graphs where the engine records them, and time the policy's costs, so that no serving step records, compiles
        or times (each would hold every running request for its length: seconds where the layers compile). `span`:
        the cache slots per row to prepare (a request longer than that grows the caches and records again). The sizes
        are timed with their rows standing at half the span, drafting (what the timings depend on: shapes and
        lengths, not values). Prompt graphs (compile_prompts()) compile here too. -> {"span", "sizes", "seconds"}."""
        from tqdm import tqdm

        graphs = self.runner.use_graphs()  # (read before tracing pauses: traced steps run eagerly)
        with self._lock, trace.paused():  # a trace shows requests' steps, not the warm-up's standing rows
            if self.rows or self.waiting:
                raise RuntimeError("warm_up needs an idle engine (no request running or waiting)")
            t0 = time.perf_counter()
            self._ensure_span(max(int(span), self.prefiller.warm_span()))
            st = self.state
            if self.one_sequence:  # a one-sequence backend: nothing to record, and its rows cannot stand at a length
                return {"span": st.S, "sizes": [], "seconds": round(time.perf_counter() - t0, 2)}
            wanted = range(1, self.max_batch + 1) if sizes is None else sizes
            sizes = sorted({padded_size(b, self.max_batch) for b in wanted})
            self.runner.warm_sizes(sizes, max(0, min(st.S // 2, st.S - self.shape.draft_tokens - 1)), graphs, progress)
            if self.prefiller.cold:
                if progress:
                    tqdm.write("warming up: compiling the prompt graphs (one for every prompt length)")
                self.prefiller.warm(0)
            return {"span": st.S, "sizes": sizes, "seconds": round(time.perf_counter() - t0, 2)}

    def profile(self, since: dict | None = None) -> dict | None:
        """With profile=True: the time each phase has taken since the engine started, or since `since` (an earlier
        reading of this method) (EngineStats.report), for /server_info; None without it. Safe from another thread (it
        takes the engine's lock: on a GPU it waits for the work in flight)."""
        if not self.profiler.enabled:
            return None
        with self._lock:
            reading = self.stats.reading()
        return self.stats.report(*reading, since)

    # --- the step's choice and its two kinds -------------------------------------------------------
    def _padded(self) -> int:
        return padded_size(len(self.rows), self.max_batch)

    def _speculate(self) -> TreeShape | None:
        """This step's choice: the tree shape of a cycle, or None for a plain step (logged under EAGLE3_DEBUG when it
        changes)."""
        b = len(self.rows)
        if self.draft is None or b > self.spec_max_batch or not any(s.use_draft for s in self.rows):
            return None
        if self.policy is None:  # --no-adaptive, or a synthetic run (it measures the whole tree's cycle)
            return self.shape
        if any(seeded(s.req.sampling) for s in self.rows):
            # a seeded sampled request draws its random numbers per cycle or per step: a choice made from timings
            # would change its output with the machine's load; the whole tree runs while one does
            return self.shape
        # the policy's figures are kept per padded size even where the rows run unpadded (a CPU): a handful of
        # sizes to time, not one per row count
        B = self._padded()
        last = self.policy.length
        length, why = self.policy.choose(B, sum(s.use_draft for s in self.rows) / b)
        if self.policy.switched(length):
            self.stats.switched(bool(length))
        if length != last:
            trace.event("speculation", on=length > 0, length=length, rows=b, padded=B, why=why)
        return self.shapes[length] if length else None

    @prompt_calls()  # the window's length changes from call to call, as a prompt's does
    def _catch_up(self, c: Cycle) -> None:
        """Rows that went through plain steps: the draft extends over their window of plain tokens (Cycle.catch_up)."""
        c.catch_up(max(s.lag for s in self.rows if s.use_draft))
        for s in self.rows:
            s.lag = 0

    def _spec_cycle(self, shape: TreeShape) -> None:
        c = self.cycle(shape)
        P, D = shape.path_len, shape.draft_tokens
        ph = self.profiler.phase
        caught = None
        if any(s.lag for s in self.rows if s.use_draft):
            caught = time.perf_counter()
            with ph("catch_up"):
                self._catch_up(c)
        first = self._last_step != "cycle"
        if first:
            self._settled()  # the catch-up (a change of kind's cost) is not the cycle's
        t0 = time.perf_counter()
        if caught is not None and self.policy is not None:  # (settled: its device time too; a probe pays it)
            self.policy.observe_catch_up(self._padded(), self.stats.seen("catch_up", t0 - caught))
        for p in ("draft_tree", "verify"):
            with ph(p):
                c.run(p)
        with ph("accept"):
            c.run("accept")
            for b, s in enumerate(self.rows):
                if not s.req.sampling.greedy:  # (the lossless sampling rule, on this row's tree and target logits)
                    self._guard(s, c.resample, b, s.req.sampling, s.gen, s.use_draft)
        with ph("cache_update"):
            c.run("cache_update")
        with ph("host_sync"):
            host = c.out[: len(self.rows)].tolist()  # the one read per cycle
        with ph("draft_extend"):
            c.run("draft_extend")
        if first:
            self._settled()  # a first cycle's figure holds its own draft extend, as a cycle's in a run of cycles does
        self._last_step = "cycle"
        self.stats.cycle(P - 1)
        if self.policy is not None:
            # wall time up to the host read, which waits for the device: in a run of cycles each one's figure
            # holds the previous cycle's draft extend (queued behind the read), so it is the cycle's whole cost
            self.policy.observe_cycle(
                self._padded(),
                self.stats.seen("cycle", time.perf_counter() - t0),
                [row[0] - 1 for s, row in zip(self.rows, host) if s.use_draft],
                P - 1,
            )
        for s, row in zip(self.rows, host):
            n = row[0]
            if s.exc is not None:
                continue
            if s.use_draft:
                s.accepted, s.drafted = n - 1, D - 1
                if s.trail is not None:
                    s.trail.append((n - 1, row[1]))
                self.stats.drafted(D - 1, n - 1)
            self._guard(s, _emit, s, row[2 : 2 + n])

    def _plain_step(self) -> None:
        ph = self.profiler.phase
        if self._last_step != "plain":
            _release_drafts(self.policy, self.rows, self.state.use_draft, self._padded())
            self._settled()  # the last cycle's draft extend (or a prefill's) is not this step's cost
        keeping = any(s.use_draft for s in self.rows)
        c = self.runner.plain(len(self.rows), max(s.length for s in self.rows), keeping)
        self._last_step = "plain"
        t0 = time.perf_counter()
        with ph("decode"):
            c.run("plain")
            assert c.plogits is not None  # (the plain step made them)
            _draw(c.next, c.plogits, [s if s.exc is None else None for s in self.rows], self.shared_gen, self._guard)
            c.run("plain_commit")
        with ph("host_sync"):
            host = c.next[: len(self.rows)].tolist()
        self.stats.plain(keeping)
        if self.policy is not None:
            self.policy.observe_plain(self._padded(), self.stats.seen("plain", time.perf_counter() - t0))
        for r, (s, tok) in enumerate(zip(self.rows, host)):
            if s.exc is not None:
                continue
            if s.use_draft:
                s.lag += 1
                if s.lag > CATCH_UP:  # past the window the draft cannot catch up: this row decodes without it
                    s.use_draft = False
                    self.state.use_draft[r] = False
            self._guard(s, _emit, s, [tok])

    def _guard(self, s: Seq, fn, *args) -> None:
        """Run one row's own work: its prefill, sampling, stop matching. Invariant: the batched phases read only
        token ids, positions and the models' weights, the same for every request; what a request brings beyond them
        (sampling parameters, generator, stop strings) is used only in per-row work like this, so a failure here is
        that row's alone: the row is marked, ends with an error event once the step is over (nothing of this step
        emitted), and the other rows go on with outputs unchanged (rows never mix in a batched phase)."""
        if s.exc is not None:
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 -- this row's failure, reported on its event; the batch goes on
            log.error("request %s failed in its own step work:\n%s", s.req.rid, traceback.format_exc())
            s.exc = e

    def _settled(self) -> None:
        """Wait for the device's queued work where the policy times a step that changes kind (or follows a prefill). A
        step's wall time ends at its one host read, so on a GPU a cycle's figure holds the previous cycle's draft extend
        (queued behind the read) instead of its own: equal in a run of cycles, but the first plain step after a cycle
        would carry an extend it does not pay, and the first cycle after plain steps would miss its own and carry the
        catch-up; after a prefill either would carry the draft's extend over the prompt (the policy compares the two
        kinds: each figure must be its kind's steady cost). Only at a change, so runs keep the host ahead of the device;
        a CPU runs each phase to its end anyway."""
        if self.policy is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _emit(s: Seq, toks: list[int]) -> None:
    """Tokens the step decoded for row `s`, into its length and, up to its stop, its new tokens."""
    s.length += len(toks)
    taken = s.em.push(toks)
    s.new.extend(toks[:taken])


def _first_tokens(logits: torch.Tensor, seqs: list[Seq], shared) -> torch.Tensor:
    """The first tokens of rows prefilled together, from logits [k, V] (_draw; a failed draw raises)."""
    out = logits.argmax(-1)
    _draw(out, logits, seqs, shared)
    return out


def _chunks(seqs: list[Seq], limit: int):
    """seqs (shortest prompt first) in runs whose rows times their longest prompt stay within `limit` tokens (a
    longer prompt alone)."""
    while seqs:
        n = 1
        while n < len(seqs) and (n + 1) * len(seqs[n].req.prompt_ids) <= limit:
            n += 1
        yield seqs[:n]
        seqs = seqs[n:]


def _draw(out: torch.Tensor, logits: torch.Tensor, seqs: list, shared, guard=None) -> None:
    """The sampled rows' tokens into out [k] (greedy rows hold their argmax already; a None row is skipped) from
    logits [k, V]: a seeded row from its own generator (the same draw in any batch; through `guard`, the engine's
    per-row work, where given); the rows that share the engine's generator in one draw per sampling parameters (one
    draw a row was most of a sampled GPU step: docs/performance.md#d61). Where a shared draw fails, its rows draw one
    by one through `guard` (one row's bad logits end that row alone); without a guard the failure is raised."""
    groups: dict[tuple, list[int]] = {}
    for b, s in enumerate(seqs):
        if s is None or s.req.sampling.greedy:
            continue
        sp = s.req.sampling
        if s.gen is shared:
            groups.setdefault((sp.temperature, sp.top_k, sp.top_p), []).append(b)
        elif guard is not None:
            guard(s, _sample_into, out, b, logits[b], s)
        else:
            _sample_into(out, b, logits[b], s)
    for idx in groups.values():
        try:
            ix = torch.as_tensor(idx, device=out.device)
            out[ix] = sample(probs(logits[ix], seqs[idx[0]].req.sampling), shared)
        except Exception:  # noqa: BLE001 -- redone row by row: the failing row ends alone
            if guard is None:
                raise
            for b in idx:
                guard(seqs[b], _sample_into, out, b, logits[b], seqs[b])


def _sample_into(next_: torch.Tensor, b: int, logits: torch.Tensor, s: Seq) -> None:
    """A plain step's sampled token for row `b` (per-row work: BatchEngine._guard)."""
    next_[b] = sample(probs(logits, s.req.sampling), s.gen)


def _release_drafts(p, rows: list[Seq], use_draft: torch.Tensor, padded: int) -> None:
    """Where the draft does not pay at the padded size by the policy's figures (p: the SpecPolicy or None), a row that
    ends before the next probe can fall due gives its draft up (its plain steps keep no features; once no row keeps
    one, they run the quiet graph): the rule by which BatchEngine._admit admits a row without its draft, applied to
    the running rows once a probe has lost. A seeded sampled request keeps its draft (_admit)."""
    if p is None or p.draft_pays(padded):
        return
    for r, s in enumerate(rows):
        left = s.req.max_new_tokens - (s.length - len(s.req.prompt_ids))
        if s.use_draft and not seeded(s.req.sampling) and not p.probe_within(left):
            s.use_draft = False
            use_draft[r] = False
            trace.event("speculation", on=False, rid=s.req.rid, why=f"no probe falls due in its last {left} tokens")
