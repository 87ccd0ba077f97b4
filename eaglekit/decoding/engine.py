"""The one EAGLE-3 decode engine, with continuous batching: `eaglekit serve` runs it with many rows, and generate,
demo, eval, sweep and the doctor with a batch of one (eaglekit.decoding.decoder.Decoder).

Every running sequence owns one row of the target's and the draft's KV caches (eaglekit.models.layers.RowKV:
per-row committed lengths on the device, per-row slots). A step that finds requests waiting admits them into free
rows (one prefill each) and returns their first tokens; any other step runs ONE cycle for all running rows together:

    draft tree (one draft forward per level for the whole batch) -> verify (one target forward for the
    whole batch, per-row tree masks) -> accept (per row: greedy on the device, or the lossless sampling
    rule of accept.py for sampled rows) -> keep each row's path -> draft extend on the paths (one forward)

Running rows are kept compact in rows [0, b): a finished or cancelled sequence's row is refilled by the last
row (its KV copied), so a cycle works on a block of rows padded to the next recorded size (1, 2, 4, 8, ...,
capped at max_batch); padding rows are inactive (their accepted count is forced to 0, so their lengths never
move) and write only their own pending slots. On a GPU each phase is recorded in a CUDA graph per padded
size; on a CPU the phases run eagerly over the span the rows actually use.

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

The host reads one small tensor per cycle: each row's accepted count, tree depth and emitted tokens.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from ..capture import CaptureSpec
from ..errors import FeatureError, GenerationError
from ..kernels.compiling import prompt_calls, twin
from ..kernels.graphs import record_graphs
from ..models.base import Target, check_finite
from ..models.layers import COMPILE_MAX_TOKENS
from ..observe import trace
from ..observe.profile import Profiler
from .accept import accept_greedy_rows, accept_sampling, accept_synthetic_rows, synthetic_rate
from .adaptive import LONGEST_PROBE, SpecPolicy
from .one_row import one_row
from .sampling import SamplingParams, make_generator, probs, sample
from .stops import Emitter
from .tree import TreeShape, expand_rows, tree_row

# Plain tokens a row may go without its draft and still catch up (a window of captured features per row: 1024 x 3
# hidden sizes, 25 MB a row at the 8B shape in bf16); longer than the policy's longest probe interval, so rows keep
# their draft while the policy probes.
CATCH_UP = LONGEST_PROBE + 16
# replays per length when the policy's costs are timed at warm-up (the fastest counts)
WARMUP_REPS = 3


@dataclass
class Request:
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()  # its `seed` seeds this request's own generator
    stop_strings: tuple[str, ...] = ()
    eos_ids: tuple[int, ...] | None = None  # None: the target's own


@dataclass
class Event:
    rid: str
    token_ids: list[int]  # emitted for this request in this step (after stop / EOS / max handling)
    finished: bool
    stop_reason: str | None  # "stop" (EOS or stop string), "length", "cancelled"; None while running
    accepted: int | None  # draft tokens accepted in this request's verify this step (None: no draft used)
    drafted: int | None  # draft tokens proposed to this request this step (None: no draft used)


_REASON = {"eos": "stop", "stop_string": "stop", "length": "length"}


def _seeded(sp: SamplingParams) -> bool:
    """A sampled request with a seed: its output must be the same whatever shares the batch or ran before it."""
    return sp.seed is not None and not sp.greedy


def emitted_rows(tokens, depths, path, n, bonus):
    """-> (the tokens each row's cycle emits: after each path node the next one, after the last
    the bonus, padded as `path` [B, P]; what the host reads per row: n, the tree's depth, those tokens)."""
    em = torch.cat([tokens.gather(1, path[:, 1:]), bonus[:, None]], 1)
    em = em.scatter(1, (n - 1).clamp(min=0)[:, None], bonus[:, None])
    return em, torch.cat([n[:, None], depths.max(-1).values[:, None], em], 1)


def _pending(shape: TreeShape) -> int:
    """Draft slots a cycle of `shape` writes past a row's committed entries: its tree's pending nodes, then the extend
    over the accepted path."""
    return max(shape.path_len, (shape.steps - 1) * shape.topk)


def padded_size(b: int, max_batch: int) -> int:
    """The captured batch size that holds b rows: the next power of two, capped at max_batch."""
    p = 1
    while p < b:
        p *= 2
    return min(p, max_batch)


class _Seq:
    __slots__ = ("req", "em", "gen", "length", "use_draft", "new", "accepted", "drafted", "lag", "trail")

    def __init__(self, req: Request, em: Emitter, gen):
        self.req, self.em, self.gen = req, em, gen
        self.length = 0  # committed target (== draft) entries, host copy
        self.use_draft = False
        self.new: list[int] = []  # tokens emitted this step
        self.accepted = self.drafted = None
        self.lag = 0  # plain tokens the draft has not seen yet (in the engine's catch-up window)
        self.trail: list[tuple[int, int]] | None = None  # set to a list: each cycle's (accepted, tree depth) kept


class _Rows:
    """One fixed-shape cycle of tree shape `shape` over rows [0, B) of the engine's state, as phases (recordable in
    CUDA graphs), and the plain step over the same rows. S, Sd: the attention spans of the target and the draft."""

    def __init__(self, eng: "BatchEngine", B: int, S: int, Sd: int, shape: TreeShape, quiet: bool = False):
        self.e, self.B, self.S, self.Sd, self.shape = eng, B, S, Sd, shape
        self.tk = eng.tk.rows(0, B)
        self.dk = eng.dk.rows(0, B) if eng.dk is not None else None
        self.root, self.active, self.use_draft = eng.root[:B], eng.active[:B], eng.use_draft[:B]
        self.h = eng.h[:B] if eng.h is not None else None
        self.dl = eng.dl[:B] if eng.dl is not None else None
        dev, P = eng.device, shape.path_len
        self.path = torch.zeros(B, P, dtype=torch.long, device=dev)
        self.n = torch.ones(B, dtype=torch.long, device=dev)
        self.neff = torch.zeros(B, dtype=torch.long, device=dev)
        self.bonus = torch.zeros(B, dtype=torch.long, device=dev)
        self.emitted = torch.zeros(B, P, dtype=torch.long, device=dev)
        self.out = torch.zeros(B, P + 2, dtype=torch.long, device=dev)  # n, tree depth, emitted tokens
        self.next = torch.zeros(B, dtype=torch.long, device=dev)
        self.tree = self.logits = self.feats = self.plogits = self.pfeats = None
        # whether the plain step captures the target's features (for rows that keep their draft): a recorded graph
        # holds one kind, so an engine with a draft records both, this _Rows capturing and a `quiet` one for steps
        # where no row keeps its draft (BatchEngine._plain_rows); eager, it is set per step (there too)
        self.capturing = not quiet
        self.quiet = quiet
        self.recorded: dict[str, torch.cuda.CUDAGraph] | None = None
        # a chain's accepted path is each row's first n nodes: its KV entries and features are already in path order
        self.chain = shape.topk == 1
        # the accept's and the emit's ~25 small operations: compiled (a few kernels) where the draft is
        compiled = getattr(eng.draft, "compiled_layer", None) is not None
        self._accept, self._emit = twin(accept_greedy_rows, compiled), twin(emitted_rows, compiled)

    # --- speculative phases ----------------------------------------------------------------------
    def draft_tree(self):
        e = self.e
        self.tree = expand_rows(e.draft, self.dk, self.h, self.dl, self.root, self.shape, self.Sd)

    def verify(self):
        t = self.tree
        self.logits, self.feats = self.e.target.forward_rows(self.tk, t.tokens, t.depths, t.mask, self.S,
                                                             self.e.capture)

    def accept(self):
        e = self.e
        if e.synthetic is not None:
            path, n, bonus = accept_synthetic_rows(self.tree, self.logits, self.shape.path_len, e.synthetic,
                                                   self.use_draft)
        else:
            path, n, bonus = self._accept(self.tree, self.logits, self.shape.path_len, self.use_draft)
        self.path.copy_(path)
        self.n.copy_(n)
        self.bonus.copy_(bonus)

    def cache_update(self):
        self.neff.copy_(self.n * self.active)  # padding rows commit nothing
        if self.chain:
            self.tk.length += self.neff
        else:
            self.tk.keep(self.path, self.neff)
        em, out = self._emit(self.tree.tokens, self.tree.depths, self.path, self.n, self.bonus)
        self.emitted.copy_(em)
        self.out.copy_(out)

    def draft_extend(self):
        F = self.feats.shape[-1]
        feats = self.feats if self.chain else self.feats.gather(1, self.path[:, :, None].expand(
            self.B, self.path.shape[1], F))
        h, dl = self.e.draft.extend_rows(self.dk, feats, self.emitted, self.neff, self.Sd)
        self.h.copy_(h)
        self.dl.copy_(dl)
        self.root.copy_(self.bonus)

    # --- the plain batched decode step (no draft) ------------------------------------------------
    def plain(self):
        """One token per row; with the engine's plain_rows k > 1 the token is row 0 of a k-token chain of copies of it
        (written past it, never committed): a verify's shapes, so a kernel that rounds 1 row and k rows apart gives the
        token the arithmetic a speculative verify gives it (decoding.decoder.resolve_baseline_rows)."""
        B, k, dev = self.B, self.e.plain_rows, self.root.device
        causal = torch.ones(1, k, k, dtype=torch.bool, device=dev).tril_()
        logits, feats = self.e.target.forward_rows(self.tk, self.root[:, None].expand(B, k).contiguous(),
                                                   torch.arange(k, device=dev).expand(B, k), causal, self.S,
                                                   self.e.capture if self.capturing else None)
        self.plogits = logits[:, 0]
        self.pfeats = feats[:, :1] if feats is not None else None
        self.next.copy_(self.plogits.argmax(-1))

    def plain_commit(self):
        self.tk.length += self.active.long()  # the one pending token is in place: commit it
        e = self.e
        if self.pfeats is not None and e.lag_feats is not None:  # the draft's input for this token, for its catch-up
            B, F = self.B, self.pfeats.shape[-1]
            at = e.lag_n[:B].clamp(max=CATCH_UP - 1)[:, None]
            e.lag_feats[:B].scatter_(1, at[:, :, None].expand(B, 1, F), self.pfeats.to(e.lag_feats.dtype))
            e.lag_ids[:B].scatter_(1, at, self.next[:, None])
            e.lag_n[:B] += self.active.long()
        self.root.copy_(self.next)

    SPEC = ("draft_tree", "verify", "accept", "cache_update", "draft_extend")

    # --- CUDA graphs -----------------------------------------------------------------------------
    def state(self) -> list[torch.Tensor]:
        """What a cycle or a plain step over these rows moves (committed lengths, roots, the draft's last hidden and
        logits, the catch-up counts): a replay made only to warm up or to time puts these back after it (both kinds
        write the same pending slots past the lengths, which the next real step overwrites)."""
        state = [self.tk.length, self.root]
        if self.dk is not None:
            state += [self.dk.length, self.h, self.dl]
        if self.e.lag_n is not None:
            state.append(self.e.lag_n)
        return state

    def record(self, plain: bool = True) -> None:
        """Record each phase in a CUDA graph (`plain`: the plain step's too; one shape per padded size records them).
        Warm-up runs the speculative group and the plain group, each restoring `state()` after it."""
        state = self.state()
        spec = self.e.draft is not None and not self.quiet  # (a quiet _Rows holds the plain step alone)
        groups = ([[getattr(self, p) for p in self.SPEC]] if spec else []) + \
            ([[self.plain, self.plain_commit]] if plain else [])
        names = (list(self.SPEC) if spec else []) + (["plain", "plain_commit"] if plain else [])
        self.recorded = record_graphs(groups, {p: getattr(self, p) for p in names}, state)

    def run(self, phase: str) -> None:
        if self.recorded is not None:
            self.recorded[phase].replay()
        else:
            getattr(self, phase)()


class BatchEngine:
    """Continuous-batching EAGLE-3 decoder over one target (and optionally one draft). Not thread-safe by
    itself beyond a lock around add / cancel / step: call them from any thread, one at a time."""

    def __init__(self, target: Target, draft=None, shape: TreeShape | None = None, max_batch: int = 8,
                 tokenizer=None, spec_max_batch: int | None = None, capture: CaptureSpec | None = None,
                 allow_other_target: bool = False, graphs: bool | str = "auto", adaptive: bool = True,
                 synthetic_accept_length: float | None = None, profile: bool = False, profile_ranges: bool = False,
                 plain_rows: int = 1, pair_checked: bool = False, strict_features: bool = False):
        if not isinstance(max_batch, int) or max_batch < 1:
            raise GenerationError(f"max_batch must be an integer >= 1, got {max_batch!r}", fix="e.g. --max-batch 8",
                                  code="E307")
        if draft is not None:
            from ..draft import check_pair

            # `pair_checked`: the caller checked the pair and passes the capture to run with (decoding.decoder.Decoder)
            self.capture = capture if pair_checked else check_pair(draft, target, capture, allow_other_target)
        else:
            self.capture = None
        # a backend that holds one sequence runs as a batch of one (decoding.one_row; more rows: E308)
        target, draft, self.adapted = one_row(target, draft, max_batch)
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.shape = shape or TreeShape.make()
        self.max_batch = max_batch
        self.device = target.device
        self.spec_max_batch = max_batch if spec_max_batch is None else spec_max_batch
        # (an adapted backend reads its row's length on the host each call: never in CUDA graphs)
        self.graphs = not self.adapted and ((self.device.type == "cuda" and target.static) if graphs == "auto"
                                            else bool(graphs))
        self.pad = self.graphs  # fixed padded shapes pay off only with graphs; eager runs the real rows
        if isinstance(plain_rows, bool) or not isinstance(plain_rows, int) or plain_rows < 1:
            raise GenerationError(f"plain rows must be an integer >= 1, got {plain_rows!r}",
                                  fix="pass plain_rows=1 (the default), or the rows of the verify whose rounding the "
                                      "plain step should share (decoding.decoder.resolve_baseline_rows)", code="E300")
        self.plain_rows = plain_rows
        # `strict_features`: a prompt whose captured features are not finite raises E401 (the one-request Decoder);
        # otherwise (serve) that request decodes without its draft, its output the target's either way
        self.strict_features = strict_features
        dev, B = self.device, max_batch
        self.tk = self.dk = None
        self.S = 0  # cache span (slots per row)
        self.root = torch.zeros(B, dtype=torch.long, device=dev)
        self.active = torch.zeros(B, dtype=torch.bool, device=dev)
        self.use_draft = torch.zeros(B, dtype=torch.bool, device=dev)
        self.h = self.dl = None  # the draft's last hidden and logits per row (made with the caches)
        self.rows: list[_Seq] = []  # running; index == cache row
        self.waiting: deque[_Seq] = deque()
        self._cancelled: list[Event] = []
        self._pending_admitted: list[_Seq] = []  # admitted by `admit`, their events due with the next step
        self._cycles: dict = {}  # (padded rows, span, shape) -> the recorded (or eager) cycle and plain step
        self._quiet: dict = {}  # (padded rows, span) -> the recorded plain step that keeps no features (_plain_rows)
        self._lock = threading.RLock()
        P = self.shape.path_len
        # the shapes a step may run, by draft length (accepted-path positions): the tree and its shallower versions
        self.shapes = {s.path_len - 1: s for s in self.shape.shorter()}
        self.spec_stats = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                           "accepted_per_pos": [0] * (P - 1), "spec_cycles": 0, "plain_steps": 0,
                           "switches_to_plain": 0, "switches_to_spec": 0,
                           "cycles_by_length": {j: 0 for j in sorted(self.shapes)}}
        self.policy = SpecPolicy(P - 1, tuple(self.shapes)) if draft is not None and adaptive else None
        self.synthetic = None
        if synthetic_accept_length is not None:
            if draft is None:
                raise GenerationError("synthetic acceptance needs a draft", fix="serve with --draft", code="E317")
            self.synthetic = synthetic_rate(float(synthetic_accept_length), P - 1)
            self.policy = None  # a synthetic run measures the whole tree's cycle: no choice from its timings
        self.lag_feats = self.lag_ids = self.lag_n = None  # the catch-up window (made with the caches)
        # `profile`: time each phase of the steps (observe.profile.Profiler: CUDA events on a GPU); profile() reads it
        self.profiler = Profiler(profile, self.device, ranges=profile_ranges)
        self.prefills = 0  # requests admitted (each one prefill)
        # a prompt graph compiled for every length (compile_prompts()) still compiles at its first call: _warm_prompts
        # makes that call at warm-up or before the first prefill
        self._cold_prompts = (getattr(target, "compiled_prompts", False)
                              or getattr(draft, "compiled_prompt", None) is not None)
        self._last_step: str | None = None  # "cycle" or "plain": the step before this one (None: a prefill) (_settled)

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

    def validate(self, req: Request) -> None:
        ids = req.prompt_ids
        if not isinstance(req.max_new_tokens, int) or isinstance(req.max_new_tokens, bool) or req.max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be an integer >= 1, got {req.max_new_tokens!r}",
                                  fix="ask for at least one new token", code="E301")
        if not isinstance(req.sampling, SamplingParams):
            raise GenerationError("sampling must be a SamplingParams", fix="build it with SamplingParams(...)",
                                  code="E302")
        if len(ids) == 0:
            raise GenerationError("the prompt is empty", fix="give at least one token", code="E305")
        V = self.target.info.vocab_size
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < V for i in ids):
            raise GenerationError(f"prompt token ids must be integers in 0..{V - 1}",
                                  fix="tokenize with the target's tokenizer", code="E305")
        ctx = self.target.info.max_position_embeddings
        if len(ids) + req.max_new_tokens > ctx:
            raise GenerationError(
                f"the prompt ({len(ids)} tokens) plus max_new_tokens ({req.max_new_tokens}) exceeds the target's "
                f"context of {ctx} positions",
                # a prompt of the whole context leaves room for no token: only a shorter prompt helps then
                fix=(f"lower max_new_tokens to {ctx - len(ids)}, or shorten the prompt" if len(ids) < ctx else
                     f"shorten the prompt by at least {len(ids) - ctx + 1} tokens"),
                code="E301")
        if any(s for s in req.stop_strings) and self.tokenizer is None:
            raise GenerationError("stop strings need a tokenizer to decode the output",
                                  fix="give the engine the target folder's tokenizer, or use token ids", code="E304")

    def add(self, req: Request) -> "_Seq":
        """Queue a request (admitted by the next step, or by `admit`) -> its running state (the engine's own)."""
        self.validate(req)
        with self._lock:
            if any(s.req.rid == req.rid for s in (*self.rows, *self.waiting)):
                raise GenerationError(f"request id {req.rid!r} is already in the engine",
                                      fix="give every request its own id", code="E307")
            eos = self.target.info.eos_token_ids if req.eos_ids is None else req.eos_ids
            em = Emitter(req.max_new_tokens, eos, req.stop_strings, self.tokenizer)
            s = _Seq(req, em, make_generator(req.sampling, self.device))
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
                if s in done:
                    continue
                done.append(s)
                fin = s.em.done
                events.append(Event(s.req.rid, s.new, fin, _REASON.get(s.em.reason) if fin else None,
                                    s.accepted, s.drafted))
                s.new, s.accepted, s.drafted = [], None, None
            for r in range(len(self.rows) - 1, -1, -1):
                if self.rows[r].em.done:
                    self._free(r)
            return events

    # --- rows ----------------------------------------------------------------------------------
    def _ensure_span(self, need: int) -> None:
        if need <= self.S and self.tk is not None:
            return
        q = 256 if self.graphs else 64
        S = -(-need // q) * q
        extra = max(self.shape.steps * self.shape.topk, _pending(self.shape))  # (the cycles' draft spans: _record)
        if self.draft is not None:  # a catch-up extend's padding writes up to CATCH_UP slots past a row's length
            extra = max(extra, CATCH_UP)
        if self.tk is None or not self.rows:  # (nothing to keep: fresh caches, a one-row cache the backend's own)
            self.tk = self.target.row_cache(self.max_batch, S)
            self.dk = self.draft.row_cache(self.max_batch, S + extra) if self.draft is not None else None
            if self.draft is not None:
                d, B = self.draft, self.max_batch
                self.h = torch.zeros(B, d.hidden_size, dtype=d.dtype, device=self.device)
                self.dl = torch.zeros(B, d.draft_vocab_size, dtype=torch.float32, device=self.device)
                F = self.target.info.hidden_size * len(self.capture.after_layers)
                self.lag_feats = torch.zeros(B, CATCH_UP, F, dtype=self.target.dtype, device=self.device)
                self.lag_ids = torch.zeros(B, CATCH_UP, dtype=torch.long, device=self.device)
                self.lag_n = torch.zeros(B, dtype=torch.long, device=self.device)
        else:
            self.tk = self.tk.grown(S)
            self.dk = self.dk.grown(S + extra) if self.dk is not None else None
            # (the catch-up window is per row, not per slot: it survives the growth as it is)
        self.S = S
        self._cycles.clear()  # graphs hold the old caches' addresses
        self._quiet.clear()

    def _free(self, r: int) -> None:
        """Drop row r: the last running row moves into it (rows stay compact), the last row is cleared."""
        last = len(self.rows) - 1
        if r != last:
            upto = self.rows[last].length + self.shape.draft_tokens + 1
            self.tk.move(last, r, upto)
            if self.dk is not None:
                self.dk.move(last, r, upto + self.shape.steps * self.shape.topk)
                self.h[r] = self.h[last]
                self.dl[r] = self.dl[last]
                self.lag_feats[r] = self.lag_feats[last]
                self.lag_ids[r] = self.lag_ids[last]
                self.lag_n[r] = self.lag_n[last]
            self.root[r] = self.root[last]
            self.use_draft[r] = self.use_draft[last]
            self.rows[r] = self.rows[last]
        self.rows.pop()
        self.active[last] = False
        self.use_draft[last] = False
        self.tk.length[last] = 0
        if self.dk is not None:
            self.dk.length[last] = 0
            self.lag_n[last] = 0

    def _admit(self) -> list[_Seq]:
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
        out = []
        for _ in range(k):
            s = self.waiting.popleft()
            n = len(s.req.prompt_ids)
            # (a cycle writes draft_tokens pending slots past a row's length, a plain step plain_rows; the prompt
            # graphs' warm-up, before the first prefill, writes COMPILE_MAX_TOKENS + 1)
            self._ensure_span(max(n + s.req.max_new_tokens + max(self.shape.draft_tokens, self.plain_rows) + 1,
                                  self._warm_span()))
            r = len(self.rows)
            self.rows.append(s)
            take = with_draft and (pays or _seeded(s.req.sampling) or
                                   (not sentinel and self.policy.probe_within(s.req.max_new_tokens)))
            with self.profiler.phase("prefill"):
                self._prefill(s, r, take)
            sentinel = sentinel or take
            out.append(s)
        self._last_step = None  # (the prefills' queued work is not the next step's cost: _settled)
        # a request that stopped at its first token leaves before the cycle
        for r in range(len(self.rows) - 1, -1, -1):
            if self.rows[r].em.done:
                self._free(r)
        return out

    def _pick(self, logits_row, s: _Seq):
        sp = s.req.sampling
        return logits_row.argmax(-1) if sp.greedy else sample(probs(logits_row, sp), s.gen)

    @prompt_calls()  # a prompt's length changes from call to call: no per-shape preparation (compiling.prompt_calls)
    def _prefill(self, s: _Seq, r: int, with_draft: bool) -> None:
        if self._cold_prompts:
            self._warm_prompts(r)
        dev = self.device
        ids = torch.as_tensor(s.req.prompt_ids, dtype=torch.long, device=dev)
        T = ids.numel()
        kv = self.tk.rows(r, r + 1)
        kv.length.zero_()
        causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
        capture = self.capture if with_draft else None
        logits, feats = self.target.forward_rows(kv, ids[None], torch.arange(T, device=dev)[None], causal, T, capture,
                                                 last=True)
        if feats is not None:  # (one host read a prompt)
            try:
                check_finite(feats[0], capture, self.target.info.hidden_size)
            except FeatureError:
                if self.strict_features:
                    raise
                trace.event("speculation", on=False, rid=s.req.rid, why="non-finite captured features")
                with_draft = False
        kv.length += T
        tok = self._pick(logits[0, -1], s)
        s.length = T
        s.em.push([int(tok)])
        s.new = list(s.em.tokens)
        self.root[r] = tok
        self.active[r] = True
        if with_draft:
            dk = self.dk.rows(r, r + 1)
            dk.length.zero_()
            nxt = torch.cat([ids[1:], tok.view(1)])[None]
            h, dl = self.draft.extend_rows(dk, feats, nxt, torch.full((1,), T, dtype=torch.long, device=dev), T)
            self.h[r] = h[0]
            self.dl[r] = dl[0]
        if self.lag_n is not None:
            self.lag_n[r] = 0
        s.use_draft = with_draft
        self.use_draft[r] = with_draft
        self.prefills += 1

    def _warm_span(self) -> int:
        """The slots a row needs for _warm_prompts' longest call while it is still due (else 1)."""
        return COMPILE_MAX_TOKENS + 1 if self._cold_prompts else 1

    @prompt_calls()
    def _warm_prompts(self, r: int) -> None:
        """Compile the prompt graphs (eaglekit.kernels.compiling.compile_prompt) before a prefill counts: row r's
        target prefill and the draft's extend over it with junk tokens at 2 and COMPILE_MAX_TOKENS + 1 tokens (the
        row span makes room: _warm_span), the two sides of the row limit where the products and the attention branch.
        The row's lengths go back to 0: the prefill that follows writes over the entries it reads, and nothing reads
        past a length."""
        self._cold_prompts = False
        dev = self.device
        kv, dk = self.tk.rows(r, r + 1), (self.dk.rows(r, r + 1) if self.dk is not None else None)
        extend = dk is not None and getattr(self.draft, "compiled_prompt", None) is not None
        with trace.paused():
            for T in (2, COMPILE_MAX_TOKENS + 1):
                ids = torch.arange(T, device=dev)[None]
                causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
                kv.length.zero_()
                _, feats = self.target.forward_rows(kv, ids, ids, causal, T, self.capture if extend else None,
                                                    last=True)
                if extend:
                    dk.length.zero_()
                    self.draft.extend_rows(dk, feats, ids, torch.full((1,), T, dtype=torch.long, device=dev), T)
        kv.length.zero_()
        if dk is not None:
            dk.length.zero_()

    # --- cycles --------------------------------------------------------------------------------
    def _speculate(self) -> TreeShape | None:
        """This step's choice: the tree shape of a cycle, or None for a plain step (logged under EAGLE3_DEBUG when it
        changes)."""
        b = len(self.rows)
        if self.draft is None or b > self.spec_max_batch or not any(s.use_draft for s in self.rows):
            return None
        if self.policy is None:  # --no-adaptive, or a synthetic run (it measures the whole tree's cycle)
            return self.shape
        if any(_seeded(s.req.sampling) for s in self.rows):
            # a seeded sampled request draws its random numbers per cycle or per step: a choice made from timings
            # would change its output with the machine's load; the whole tree runs while one does
            return self.shape
        # the policy's figures are kept per padded size even where the rows run unpadded (a CPU): a handful of
        # sizes to time, not one per row count
        B = padded_size(b, self.max_batch)
        last = self.policy.length
        length, why = self.policy.choose(B, sum(s.use_draft for s in self.rows) / b)
        if self.policy.switched(length):
            key = "switches_to_spec" if length else "switches_to_plain"
            self.spec_stats[key] += 1
        if length != last:
            trace.event("speculation", on=length > 0, length=length, rows=b, padded=B, why=why)
        return self.shapes[length] if length else None

    @prompt_calls()  # the window's length changes from call to call, as a prompt's does
    def _catch_up(self, c: _Rows) -> None:
        """Rows that went through plain steps: the draft extends over their window of plain tokens (one eager
        draft forward for all of them), so the tree cycle starts from each row's current token."""
        m = max(s.lag for s in self.rows if s.use_draft)
        n = self.lag_n[:c.B] * c.use_draft
        h, dl = self.draft.extend_rows(self.dk.rows(0, c.B), self.lag_feats[:c.B, :m], self.lag_ids[:c.B, :m], n,
                                       c.Sd)
        moved = (n > 0)[:, None]
        self.h[:c.B] = torch.where(moved, h.to(self.h.dtype), self.h[:c.B])
        self.dl[:c.B] = torch.where(moved, dl, self.dl[:c.B])
        self.lag_n.zero_()
        for s in self.rows:
            s.lag = 0

    def _use_graphs(self) -> bool:
        return self.graphs and not trace.ENABLED  # tracing reads tensors on the host: eager only

    def _rows(self, shape: TreeShape | None = None) -> _Rows:
        """The cycle of `shape` (default the whole tree; its _Rows also holds the plain step) over the running rows."""
        shape = shape or self.shape
        b = len(self.rows)
        B = padded_size(b, self.max_batch) if self.pad else b
        if not self._use_graphs():
            # eager: attend over the slots the rows actually use; one _Rows per size and shape (its buffers are
            # overwritten by every step), its spans set for this step
            top = max(s.length for s in self.rows)
            key = ("eager", B, self.S, shape)
            if key not in self._cycles:
                self._cycles[key] = _Rows(self, B, 0, 0, shape)
            c = self._cycles[key]
            c.S, c.Sd = top + shape.draft_tokens, top + _pending(shape)
            return c
        key = (B, self.S, shape)
        if key not in self._cycles:
            self._record(B)
        return self._cycles[key]

    def _record(self, B: int) -> None:
        """Record the graphs of padded size B over the current span: the whole tree's cycle and the plain step, and
        with the policy on every shorter length's cycle too, all at once (a length recorded on the policy's first
        try would put a recording inside a running step). The first time B is seen, the policy's costs at B are
        timed here, at warm-up (_time_at_warmup)."""
        shapes = list(self.shapes.values()) if self.policy is not None else [self.shape]
        for shape in shapes:
            # the draft attends over the slots a cycle can reach (rows hold at most S entries), not over the whole
            # allocation, whose catch-up room (CATCH_UP slots) only the eager catch-up's padding writes use: an SDPA
            # draft reads every slot of its span
            Sd = self.S + _pending(shape) if self.dk is not None else 0
            c = _Rows(self, B, self.S, Sd, shape)
            c.record(plain=shape == self.shape)
            self._cycles[B, self.S, shape] = c
        if self.dk is not None:  # the plain step without the capture and the catch-up window's writes
            q = _Rows(self, B, self.S, 0, self.shape, quiet=True)
            q.record()
            self._quiet[B, self.S] = q
        if self.policy is not None and B not in self.policy.plain:
            self._time_at_warmup(B, {shape: self._cycles[B, self.S, shape] for shape in shapes})

    def _time_at_warmup(self, B: int, cycles: dict) -> None:
        """Seed the policy's costs at padded size B with the time of each length's cycle and of the plain step (the
        fastest of WARMUP_REPS runs each, from the same state, restored after; `cycles`: each shape's _Rows, recorded
        or eager), so that serving spends no step on timing a length. The running wall times refine them as the engine
        runs (SpecPolicy)."""
        c0 = cycles[self.shape]
        state = c0.state()
        snap = [x.clone() for x in state]
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

        def timed(fn) -> float:
            best = float("inf")
            for _ in range(WARMUP_REPS):
                for x, v in zip(state, snap):
                    x.copy_(v)
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                best = min(best, time.perf_counter() - t0)
            for x, v in zip(state, snap):
                x.copy_(v)
            return best

        plain = timed(lambda: (c0.run("plain"), c0.run("plain_commit")))
        spec = {}
        for j, shape in self.shapes.items():
            c = cycles[shape]
            spec[j] = timed(lambda c=c: [c.run(p) for p in c.SPEC])
        self.policy.seed_costs(B, plain, spec)

    @torch.inference_mode()  # the caches are inference tensors
    def warm_up(self, span: int, sizes: list[int] | None = None, progress: bool = False) -> dict:
        """Before serving (an idle engine): for each padded size (default every one up to max_batch) record its CUDA
        graphs where the engine records them, and time the policy's costs, so that no serving step records, compiles
        or times (each would hold every running request for its length: seconds where the layers compile). `span`:
        the cache slots per row to prepare (a request longer than that grows the caches and records again). The sizes
        are timed with their rows standing at half the span, drafting (what the timings depend on: shapes and
        lengths, not values). Prompt graphs (compile_prompts()) compile here too. -> {"span", "sizes", "seconds"}."""
        from tqdm import tqdm

        graphs = self._use_graphs()  # (read before tracing pauses: traced steps run eagerly)
        with self._lock, trace.paused():  # a trace shows requests' steps, not the warm-up's standing rows
            if self.rows or self.waiting:
                raise RuntimeError("warm_up needs an idle engine (no request running or waiting)")
            t0 = time.perf_counter()
            self._ensure_span(max(int(span), self._warm_span()))
            if self.adapted:  # a one-sequence backend: nothing to record, and its rows cannot stand at a length
                return {"span": self.S, "sizes": [], "seconds": round(time.perf_counter() - t0, 2)}
            wanted = range(1, self.max_batch + 1) if sizes is None else sizes
            sizes = sorted({padded_size(b, self.max_batch) for b in wanted})
            at = max(0, min(self.S // 2, self.S - self.shape.draft_tokens - 1))
            for B in tqdm(sizes, desc="warming up: batch sizes", unit="size", disable=not progress, leave=False):
                self.tk.length[:B] = at
                self.active[:B] = True
                if self.dk is not None:
                    self.dk.length[:B] = at
                    self.use_draft[:B] = True
                try:
                    if graphs:
                        if (B, self.S, self.shape) not in self._cycles:
                            self._record(B)
                    elif self.policy is not None and B not in self.policy.plain:
                        self._time_at_warmup(B, {s: _Rows(self, B, at + s.draft_tokens, at + _pending(s), s)
                                                 for s in self.shapes.values()})
                finally:  # back to an idle engine
                    self.tk.length.zero_()
                    self.active.zero_()
                    self.use_draft.zero_()
                    if self.dk is not None:
                        self.dk.length.zero_()
                        self.lag_n.zero_()
            if self._cold_prompts:
                if progress:
                    tqdm.write("warming up: compiling the prompt graphs (one for every prompt length)")
                self._warm_prompts(0)
            return {"span": self.S, "sizes": sizes, "seconds": round(time.perf_counter() - t0, 2)}

    def profile(self, since: dict | None = None) -> dict | None:
        """With profile=True: the time each phase has taken since the engine started, or since `since` (an earlier
        reading of this method) (ms in all; per speculative cycle, per plain step for `decode`, per request for
        `prefill`, per step of either kind for `host_sync`; and its share of the phases' total), for /server_info;
        None without it. Safe from another thread (it takes the engine's lock: on a GPU it waits for the work in
        flight)."""
        if not self.profiler.enabled:
            return None
        with self._lock:
            totals = self.profiler.totals()
            st = self.spec_stats
            steps = {"cycles": st["spec_cycles"], "plain_steps": st["plain_steps"], "prefills": self.prefills}
        if since is not None:
            steps = {k: v - since[k] for k, v in steps.items()}
            totals = {p: v - since["ms"].get(p, 0.0) / 1e3 for p, v in totals.items()}
        everything = sum(totals.values()) or 1.0
        # what each phase is counted per: a prefill per admitted request, the host read per step of either kind
        count = {"decode": steps["plain_steps"], "prefill": steps["prefills"],
                 "host_sync": steps["cycles"] + steps["plain_steps"]}
        per = {p: count.get(p, steps["cycles"]) for p in totals}
        return {**steps,
                "ms": {p: round(1e3 * v, 3) for p, v in totals.items()},
                "ms_per_step": {p: round(1e3 * v / per[p], 4) if per[p] else None for p, v in totals.items()},
                "share": {p: round(v / everything, 4) for p, v in totals.items()}}

    def _spec_cycle(self, shape: TreeShape) -> None:
        c = self._rows(shape)
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
            self.policy.observe_catch_up(padded_size(len(self.rows), self.max_batch), t0 - caught)
        for p in ("draft_tree", "verify"):
            with ph(p):
                c.run(p)
        with ph("accept"):
            c.run("accept")
            for b, s in enumerate(self.rows):
                sp = s.req.sampling
                if sp.greedy:
                    continue
                if s.use_draft:  # the lossless sampling rule, on this row's tree and target logits
                    path, n, bonus = accept_sampling(tree_row(c.tree, b), c.logits[b], P, sp, s.gen)
                else:
                    path, n = torch.zeros(P, dtype=torch.long, device=self.device), 1
                    bonus = sample(probs(c.logits[b, 0], sp), s.gen)
                c.path[b] = path
                c.n[b] = n
                c.bonus[b] = bonus
        with ph("cache_update"):
            c.run("cache_update")
        with ph("host_sync"):
            host = c.out[:len(self.rows)].tolist()  # the one read per cycle
        with ph("draft_extend"):
            c.run("draft_extend")
        if first:
            self._settled()  # a first cycle's figure holds its own draft extend, as a cycle's in a run of cycles does
        self._last_step = "cycle"
        st = self.spec_stats
        st["spec_cycles"] += 1
        st["cycles_by_length"][P - 1] += 1
        if self.policy is not None:
            # wall time up to the host read, which waits for the device: in a run of cycles each one's figure
            # holds the previous cycle's draft extend (queued behind the read), so it is the cycle's whole cost
            self.policy.observe_cycle(padded_size(len(self.rows), self.max_batch), time.perf_counter() - t0,
                                      [row[0] - 1 for s, row in zip(self.rows, host) if s.use_draft], P - 1)
        for s, row in zip(self.rows, host):
            n = row[0]
            if s.use_draft:
                s.accepted, s.drafted = n - 1, D - 1
                if s.trail is not None:
                    s.trail.append((n - 1, row[1]))
                st["num_drafts"] += 1
                st["num_draft_tokens"] += D - 1
                st["num_accepted_tokens"] += n - 1
                for i in range(n - 1):
                    st["accepted_per_pos"][i] += 1
            self._emit(s, row[2:2 + n])

    def _plain_rows(self) -> _Rows:
        """The plain step's _Rows: where no row keeps its draft, one that neither captures the target's features nor
        writes the catch-up window (recorded: the quiet graph; eager: the same _Rows told so for this step)."""
        c = self._rows()
        keeping = any(s.use_draft for s in self.rows)
        if c.recorded is None:
            c.capturing = keeping
        elif not keeping and self.dk is not None:
            c = self._quiet[c.B, self.S]
        return c

    def _release_drafts(self) -> None:
        """Where the draft does not pay by the policy's figures, a row that ends before the next probe can fall due
        gives its draft up (its plain steps keep no features; once no row keeps one, they run the quiet graph): the rule
        by which _admit admits a row without its draft, applied to the running rows once a probe has lost. A seeded
        sampled request keeps its draft (_admit)."""
        p = self.policy
        if p is None or p.draft_pays(padded_size(len(self.rows), self.max_batch)):
            return
        for r, s in enumerate(self.rows):
            left = s.req.max_new_tokens - (s.length - len(s.req.prompt_ids))
            if s.use_draft and not _seeded(s.req.sampling) and not p.probe_within(left):
                s.use_draft = False
                self.use_draft[r] = False
                trace.event("speculation", on=False, rid=s.req.rid, why=f"no probe falls due in its last {left} tokens")

    def _plain_step(self) -> None:
        ph = self.profiler.phase
        if self._last_step != "plain":
            self._release_drafts()
            self._settled()  # the last cycle's draft extend (or a prefill's) is not this step's cost
        c = self._plain_rows()
        self._last_step = "plain"
        t0 = time.perf_counter()
        with ph("decode"):
            c.run("plain")
            for b, s in enumerate(self.rows):
                if not s.req.sampling.greedy:
                    c.next[b] = sample(probs(c.plogits[b], s.req.sampling), s.gen)
            c.run("plain_commit")
        with ph("host_sync"):
            host = c.next[:len(self.rows)].tolist()
        self.spec_stats["plain_steps"] += 1
        if self.policy is not None:
            self.policy.observe_plain(padded_size(len(self.rows), self.max_batch), time.perf_counter() - t0)
        for r, (s, tok) in enumerate(zip(self.rows, host)):
            if s.use_draft:
                s.lag += 1
                if s.lag > CATCH_UP:  # past the window the draft cannot catch up: this row decodes without it
                    s.use_draft = False
                    self.use_draft[r] = False
            self._emit(s, [tok])

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

    def _emit(self, s: _Seq, toks: list[int]) -> None:
        s.length += len(toks)
        taken = s.em.push(toks)
        s.new.extend(toks[:taken])
