"""The speculative cycle and the baseline loop, on the same target code.

    prefill (features at the capture layers) -> draft extend -> [expand tree -> verify (one target
    forward, tree mask) -> accept (path + bonus) -> keep the path's KV -> draft extend on the path]*

Batch size 1. Each cycle is five fixed-shape phases over persistent device state (lengths, the root
token, the draft's last hidden and logits), so on a GPU each phase is recorded once in a CUDA graph and
replayed; on a CPU the same functions run eagerly. ("capture" in eaglekit means hidden-state capture
only; CUDA graphs are "recorded".) The engine talks to the target and the draft only through their
interfaces (models.base.Target, draft.base.Draft). The host reads one small tensor per cycle: the
accepted count, the tree depth and the emitted tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..capture import CaptureSpec
from ..draft import check_pair
from ..draft.base import Draft
from ..errors import GenerationError
from ..kernels.compiling import prompt_calls, twin
from ..kernels.graphs import record_graphs
from ..kernels.topk import argmax
from ..models.base import Target
from ..observe import trace
from ..observe.metrics import GenerationMetrics
from ..observe.profile import Profiler
from .accept import accept_greedy, accept_sampling
from .sampling import SamplingParams, make_generator, probs, sample
from .stops import Emitter
from .tree import TreeShape, expand

PHASES = ("draft_tree", "verify", "accept", "cache_update", "draft_extend")
# On a GPU the cache span is rounded up to a multiple of this, so that the CUDA graphs recorded for one
# generation (they bake in the span) serve the next generations of similar length.
SPAN_ROUNDING = 256
def resolve_baseline_rows(rows: int | str, target: Target, draft, shape: TreeShape) -> int:
    """How many rows the baseline step computes (its token is row 0; see Target.step). "auto": the tree's
    draft_tokens where one row and a tree of rows round differently (reduced precision on a GPU) and there is a
    draft to compare with, else 1. In float32, on a CPU, and with batch-invariant kernels (products "invariant",
    "hopper") one row already agrees with the verify."""
    if rows == "auto":
        low = target.dtype in (torch.bfloat16, torch.float16)
        invariant = target.batch_invariant
        return shape.draft_tokens if (draft is not None and target.device.type == "cuda" and low
                                      and not invariant) else 1
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise GenerationError(f"baseline rows must be an integer >= 1 or 'auto', got {rows!r}",
                              fix="pass baseline_rows=\"auto\" (the default) or an integer >= 1", code="E300")
    return rows


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    stop_reason: str
    metrics: GenerationMetrics


def emitted(tokens, depths, path, n, bonus):
    """-> (the tokens a cycle emits: after each path node the next one, after the last the bonus, padded as `path`;
    what the host reads: n, the tree's depth, those tokens)."""
    em = torch.cat([tokens[path[1:]], bonus.view(1)]).scatter(0, (n - 1).view(1), bonus.view(1))
    return em, torch.cat([n.view(1), depths.max().view(1), em])


class Cycle:
    """One EAGLE-3 cycle as fixed-shape phases over persistent state (recordable in CUDA graphs)."""

    def __init__(self, target: Target, draft: Draft, shape: TreeShape, capture: CaptureSpec):
        self.t, self.d, self.shape, self.spec = target, draft, shape, capture
        dev, P = target.device, shape.path_len
        self.root = torch.zeros((), dtype=torch.long, device=dev)
        self.h = torch.zeros(draft.hidden_size, dtype=draft.dtype, device=dev)
        self.dl = torch.zeros(draft.draft_vocab_size, dtype=torch.float32, device=dev)
        self.path = torch.zeros(P, dtype=torch.long, device=dev)
        self.n = torch.ones((), dtype=torch.long, device=dev)
        self.bonus = torch.zeros((), dtype=torch.long, device=dev)
        self.emitted = torch.zeros(P, dtype=torch.long, device=dev)
        self.out = torch.zeros(P + 2, dtype=torch.long, device=dev)  # n, tree depth, emitted tokens
        self.tree = self.logits = self.feats = None
        self.recorded: dict[str, torch.cuda.CUDAGraph] | None = None
        # a chain's accepted path is its first n nodes: its KV entries and features are already in path order
        self.chain = shape.topk == 1
        # the accept's and the emit's ~25 small operations: compiled (a few kernels) where the draft is
        compiled = getattr(draft, "compiled_layer", None) is not None
        self._accept, self._emit = twin(accept_greedy, compiled), twin(emitted, compiled)

    def start(self, root, h, dl) -> None:
        self.root.copy_(root)
        self.h.copy_(h)
        self.dl.copy_(dl)

    # --- the phases -----------------------------------------------------------------------------
    def draft_tree(self):
        self.tree = expand(self.d, self.h, self.dl, self.root, self.shape)

    def verify(self):
        self.logits, self.feats = self.t.verify(self.tree.tokens, self.tree.depths, self.tree.mask, self.spec)

    def accept(self):
        path, n, bonus = self._accept(self.tree, self.logits, self.shape.path_len)
        self.path.copy_(path)
        self.n.copy_(n)
        self.bonus.copy_(bonus)

    def cache_update(self):
        self.t.keep(self.path, self.n, in_place=self.chain)
        em, out = self._emit(self.tree.tokens, self.tree.depths, self.path, self.n, self.bonus)
        self.emitted.copy_(em)
        self.out.copy_(out)

    def draft_extend(self):
        h, dl = self.d.extend(self.feats if self.chain else self.feats[self.path], self.emitted, self.n)
        self.h.copy_(h)
        self.dl.copy_(dl)
        self.root.copy_(self.bonus)

    # --- CUDA graphs ----------------------------------------------------------------------------
    def record(self, greedy: bool, whole: bool = False) -> None:
        """Record each phase in a CUDA graph (sampling keeps its accept on the host side: not recorded); with
        `whole` (greedy only) also the five phases in order as one graph, "cycle" (on an H200 one graph ran a cycle
        slower than the five back to back, benchmarks/results/2026-12-03i_h200_whole_tree.json, so the Decoder
        replays the phases' graphs)."""
        fns = {p: getattr(self, p) for p in PHASES}
        record = {p: fn for p, fn in fns.items() if greedy or p != "accept"}
        if whole and greedy:
            record["cycle"] = self.whole
        self.recorded = record_graphs([list(fns.values())], record,
                                      [self.t.committed, self.d.committed, self.root, self.h, self.dl])

    def whole(self) -> None:
        """A greedy cycle's five phases in order (what the "cycle" graph holds)."""
        for p in PHASES:
            getattr(self, p)()

    def run(self, phase: str) -> None:
        if self.recorded is not None and phase in self.recorded:
            self.recorded[phase].replay()
        else:
            getattr(self, phase)()


class Decoder:
    def __init__(self, target: Target, draft: Draft | None = None, shape: TreeShape | None = None,
                 capture: CaptureSpec | None = None, allow_other_target: bool = False, profile: bool = False,
                 graphs: bool | str = "auto", profile_ranges: bool = False, baseline_rows: int | str = "auto"):
        self.target, self.draft = target, draft
        self.shape = shape or TreeShape.make()
        self.baseline_rows = resolve_baseline_rows(baseline_rows, target, draft, self.shape)
        self.profiler = Profiler(profile, target.device, ranges=profile_ranges)
        self.graphs = (target.device.type == "cuda" and target.static) if graphs == "auto" else bool(graphs)
        self._cycles: dict = {}  # recorded cycles by (shape, greedy, target and draft storage)
        self._steps: dict = {}  # recorded baseline steps by target storage
        if draft is not None:
            # the decoder's own: passed to the target on every call, never stored on the (shared) target
            self.capture = check_pair(draft, target, capture, allow_other_target)
        else:
            self.capture = None

    # --- helpers ---------------------------------------------------------------------------------
    def _prompt(self, prompt_ids, max_new_tokens: int) -> torch.Tensor:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.target.device).view(-1)
        if ids.numel() == 0:
            raise GenerationError("the prompt is empty", fix="give at least one token", code="E305")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise GenerationError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}",
                                  fix="e.g. --max-new-tokens 128", code="E306")
        V = self.target.info.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= V:
            raise GenerationError(f"prompt token ids must lie in 0..{V - 1}",
                                  fix="tokenize with the target's tokenizer", code="E305")
        ctx, n = self.target.info.max_position_embeddings, ids.numel()
        if n >= ctx and max_new_tokens > 0:  # no --max-new-tokens makes room: only a shorter prompt does
            raise GenerationError(f"the prompt is {n} tokens; the target's context is {ctx}, so it is {n - ctx + 1} "
                                  f"token(s) too long to leave room for one new token",
                                  fix=f"shorten the prompt by at least {n - ctx + 1} tokens", code="E309")
        if n + max_new_tokens > ctx:
            raise GenerationError(
                f"the prompt ({n} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the target's context of "
                f"{ctx} positions",
                fix=f"lower --max-new-tokens to {ctx - n}, or shorten the prompt by {n + max_new_tokens - ctx} tokens",
                code="E301")
        return ids

    def _span(self, need: int) -> int:
        # on a GPU, round up so that CUDA graphs recorded for one generation serve the next ones
        return -(-need // SPAN_ROUNDING) * SPAN_ROUNDING if self.graphs else need

    def _use_graphs(self) -> bool:
        return self.graphs and not trace.ENABLED  # tracing reads tensors on the host: eager only

    def _pick(self, logits_row, sp, gen):
        return argmax(logits_row) if sp.greedy else sample(probs(logits_row, sp), gen)

    # --- entry point -----------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new_tokens: int = 128, sampling: SamplingParams | None = None,
                 stop_strings=(), tokenizer=None, baseline: bool = False, eos_ids=None,
                 baseline_rows: int | None = None) -> GenerationResult:
        """`baseline_rows` (with baseline=True): this call's rows per baseline step instead of the decoder's."""
        sp = sampling or SamplingParams()
        ids = self._prompt(prompt_ids, max_new_tokens)
        eos = self.target.info.eos_token_ids if eos_ids is None else eos_ids
        em = Emitter(max_new_tokens, eos, stop_strings, tokenizer)
        gen = make_generator(sp, self.target.device)
        self.profiler.reset()
        t0 = time.perf_counter()
        if baseline or self.draft is None:
            m = self._baseline(ids, em, sp, gen, self.baseline_rows if baseline_rows is None else baseline_rows)
        else:
            m = self._speculative(ids, em, sp, gen)
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()
        m.elapsed_s = time.perf_counter() - t0
        m.prompt_tokens = ids.numel()
        m.new_tokens = len(em.tokens)
        m.phases = self.profiler.totals()
        return GenerationResult(em.tokens, em.text(), em.reason or "length", m)

    def _baseline(self, ids, em: Emitter, sp, gen, rows: int = 1) -> GenerationMetrics:
        t, ph = self.target, self.profiler.phase
        # the baseline captures no hidden states (no capture argument)
        t.reset(self._span(ids.numel() + em.max_new_tokens + rows))
        trace.set_cycle(0)
        with ph("prefill"):
            logits, _ = t.prefill(ids)
            tok = self._pick(logits[-1], sp, gen)
        em.push([int(tok)])
        step = self._graphed_step(tok, rows) if (self._use_graphs() and sp.greedy) else None
        while not em.done:
            if step is not None:
                with ph("decode"):
                    step[0].replay()
                with ph("host_sync"):
                    nxt = int(step[1])
            else:
                with ph("decode"):
                    tok = self._pick(t.step(tok.view(1), rows), sp, gen)
                with ph("host_sync"):
                    nxt = int(tok)
            em.push([nxt])
        return GenerationMetrics()

    def _graphed_step(self, tok, rows: int = 1):
        """A CUDA graph of one greedy decode step: feeds `buf` and writes the next token back into it."""
        t = self.target
        key = (t.storage_key(), rows)
        if key not in self._steps:
            buf = torch.zeros((), dtype=torch.long, device=t.device)

            def step():
                buf.copy_(argmax(t.step(buf.view(1), rows)))

            self._steps[key] = (record_graphs([[step]], {"step": step}, [t.committed])["step"], buf)
        g, buf = self._steps[key]
        buf.copy_(tok)
        return g, buf

    def _cycle(self, greedy: bool) -> Cycle:
        t, d = self.target, self.draft
        if not self._use_graphs():
            return Cycle(t, d, self.shape, self.capture)
        key = (self.shape, greedy, t.storage_key(), d.storage_key())
        if key not in self._cycles:
            self._cycles[key] = Cycle(t, d, self.shape, self.capture)
            self._cycles[key].record(greedy)  # a graph a phase (one graph a cycle measured slower: Cycle.record)
        return self._cycles[key]

    def _speculative(self, ids, em: Emitter, sp, gen) -> GenerationMetrics:
        t, d, shape, ph = self.target, self.draft, self.shape, self.profiler.phase
        m = GenerationMetrics(draft_tokens=shape.draft_tokens)
        span = self._span(ids.numel() + em.max_new_tokens + shape.draft_tokens + 1)
        t.reset(span)
        d.reset(span + shape.steps * shape.topk)
        trace.set_cycle(0)
        with ph("prefill"):
            logits, feats = t.prefill(ids, self.capture)
            tok = self._pick(logits[-1], sp, gen)
        em.push([int(tok)])
        if em.done:
            return m
        with ph("prefill"), prompt_calls():  # the prompt's draft entries: once a generation, not a cycle's cost
            h, dl = d.extend(feats, torch.cat([ids[1:], tok.view(1)]))
        c = self._cycle(sp.greedy)
        c.start(tok, h, dl)
        cycle = 0
        while True:
            cycle += 1
            trace.set_cycle(cycle)
            with ph("draft_tree"):
                c.run("draft_tree")
            with ph("verify"):
                c.run("verify")
            with ph("accept"):
                if sp.greedy:
                    c.run("accept")
                else:
                    path, n, bonus = accept_sampling(c.tree, c.logits, shape.path_len, sp, gen)
                    c.path.copy_(path)
                    c.n.copy_(n)
                    c.bonus.copy_(bonus)
            with ph("cache_update"):
                c.run("cache_update")
            with ph("host_sync"):  # the one read per cycle: accepted count, tree depth, emitted tokens
                host = c.out.tolist()
            n, depth = host[0], host[1]
            m.accepted.append(n - 1)
            m.depths.append(depth)
            em.push(host[2:2 + n])
            if em.done:
                return m
            with ph("draft_extend"):
                c.run("draft_extend")
