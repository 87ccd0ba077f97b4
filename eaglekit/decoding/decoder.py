"""One request at a time: `Decoder.generate`, what generate, demo, eval, sweep and the doctor run.

A Decoder drives the one engine (decoding.engine.BatchEngine) with a batch of one row: the same tree expansion, the
same compiled draft walks, the same CUDA graphs per phase and the same accept as `serve` at any batch size (batch 1 is
a batch of one). What it adds is the one-request interface: the prompt's checks with their fixes, stop strings and
EOS, the baseline (the same engine without the draft, `baseline=True`), and per-cycle metrics (accepted tokens and
tree depth of each cycle, phase times with `profile`).

    prefill (features at the capture layers) -> draft extend -> [expand tree -> verify (one target
    forward, tree mask) -> accept (path + bonus) -> keep the path's KV -> draft extend on the path]*

A backend that holds one sequence (the transformers adapter, tests' doubles) gives the engine one row over its own
sequence (the row interface's defaults, models.layers.OwnRow) and runs eagerly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..capture import CaptureSpec
from ..draft import check_pair
from ..draft.model import Eagle3Draft
from ..errors import GenerationError
from ..models.base import Target
from ..observe import trace
from ..observe.metrics import GenerationMetrics
from .config import EngineOptions
from .engine import BatchEngine, Request
from .sampling import SamplingParams
from .stops import Emitter
from .tree import TreeShape


def resolve_baseline_rows(rows: int | str, target: Target, draft, shape: TreeShape) -> int:
    """How many rows the baseline step computes (its token is row 0; see the engine's plain step). "auto": the tree's
    draft_tokens where one row and a tree of rows round differently (reduced precision: bf16 products round a row
    alone and among k rows apart, on a GPU and on a CPU) and there is a draft to compare with, else 1. In float32 and
    with batch-invariant kernels (products "invariant", "hopper") one row already agrees with the verify."""
    if rows == "auto":
        low = target.dtype in (torch.bfloat16, torch.float16)
        return shape.draft_tokens if (draft is not None and low and not target.batch_invariant) else 1
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise GenerationError(
            f"baseline rows must be an integer >= 1 or 'auto', got {rows!r}",
            fix='pass baseline_rows="auto" (the default) or an integer >= 1',
            code="E300",
        )
    return rows


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    stop_reason: str
    metrics: GenerationMetrics


class Decoder:
    """One request at a time on a one-row BatchEngine. `profile`: phase times in each result's metrics.phases
    (`profile_ranges`: also torch.profiler / NVTX ranges). `graphs`: CUDA graphs per phase ("auto": on a GPU for a
    static target). `baseline_rows`: the baseline step's rows (resolve_baseline_rows). `draft` and `capture` may be
    set after construction (tests hand in doubles this way): the engine follows them."""

    def __init__(
        self,
        target: Target,
        draft: Eagle3Draft | None = None,
        shape: TreeShape | None = None,
        capture: CaptureSpec | None = None,
        allow_other_target: bool = False,
        profile: bool = False,
        graphs: bool | str = "auto",
        profile_ranges: bool = False,
        baseline_rows: int | str = "auto",
    ):
        self.target, self.draft = target, draft
        self.shape = shape or TreeShape.make()
        self.baseline_rows = resolve_baseline_rows(baseline_rows, target, draft, self.shape)
        self.profile, self.profile_ranges, self.graphs = profile, profile_ranges, graphs
        # the decoder's own: passed to the target on every call, never stored on the (shared) target
        self.capture = check_pair(draft, target, capture, allow_other_target) if draft is not None else None
        self._engines: dict = {}  # one-row engines by (draft, capture, plain rows) -> (draft, engine)

    def engine(self, plain: bool = False, rows: int = 1):
        """The one-row engine this decoder runs: with its draft and capture as they are now, or (`plain`) the target
        alone, its plain step `rows` rows (the baseline: no capture, no draft state, what a user without a draft runs).
        Each keeps its graphs; all of them use the target's own cache (one generation at a time)."""
        draft = None if plain else self.draft
        key = (id(draft), self.capture if draft is not None else None, rows)
        held, e = self._engines.get(key, (None, None))
        if e is None or held is not draft:
            e = BatchEngine(
                self.target,
                draft,
                EngineOptions(
                    shape=self.shape,
                    max_batch=1,
                    capture=key[1],
                    pair_checked=True,
                    graphs=self.graphs,
                    adaptive=False,
                    profile=self.profile,
                    profile_ranges=self.profile_ranges,
                    plain_rows=rows,
                    strict_features=True,
                ),
            )
            self._engines[key] = (draft, e)
        return e

    # --- helpers ---------------------------------------------------------------------------------
    def _prompt(self, prompt_ids, max_new_tokens: int) -> torch.Tensor:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).view(-1)
        if ids.numel() == 0:
            raise GenerationError("the prompt is empty", fix="give at least one token", code="E305")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise GenerationError(
                f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}",
                fix="e.g. --max-new-tokens 128",
                code="E306",
            )
        V = self.target.info.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= V:
            raise GenerationError(
                f"prompt token ids must lie in 0..{V - 1}", fix="tokenize with the target's tokenizer", code="E305"
            )
        ctx, n = self.target.info.max_position_embeddings, ids.numel()
        if n >= ctx and max_new_tokens > 0:  # no --max-new-tokens makes room: only a shorter prompt does
            raise GenerationError(
                f"the prompt is {n} tokens; the target's context is {ctx}, so it is {n - ctx + 1} "
                f"token(s) too long to leave room for one new token",
                fix=f"shorten the prompt by at least {n - ctx + 1} tokens",
                code="E309",
            )
        if n + max_new_tokens > ctx:
            raise GenerationError(
                f"the prompt ({n} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the target's context of "
                f"{ctx} positions",
                fix=f"lower --max-new-tokens to {ctx - n}, or shorten the prompt by {n + max_new_tokens - ctx} tokens",
                code="E301",
            )
        return ids

    # --- entry point -----------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids,
        max_new_tokens: int = 128,
        sampling: SamplingParams | None = None,
        stop_strings=(),
        tokenizer=None,
        baseline: bool = False,
        eos_ids=None,
        baseline_rows: int | None = None,
    ) -> GenerationResult:
        """`baseline` (or no draft): plain decoding, the target's own output. `baseline_rows` (with baseline=True):
        this call's rows per baseline step instead of the decoder's."""
        sp = sampling or SamplingParams()
        ids = self._prompt(prompt_ids, max_new_tokens)
        plain = baseline or self.draft is None
        m = GenerationMetrics(draft_tokens=0 if plain else self.shape.draft_tokens)
        eos = self.target.info.eos_token_ids if eos_ids is None else tuple(eos_ids)
        if max_new_tokens == 0:
            Emitter(0, eos, stop_strings, tokenizer)  # (its checks: stop strings need a tokenizer)
            m.prompt_tokens, m.new_tokens = ids.numel(), 0
            return GenerationResult([], "" if tokenizer is not None else None, "length", m)
        rows = self.baseline_rows if baseline_rows is None else baseline_rows
        e = self.engine(plain=True, rows=rows) if plain else self.engine()
        e.tokenizer = tokenizer
        e.profiler.reset()
        t0 = time.perf_counter()
        try:
            s = e.add(Request("generate", ids.tolist(), max_new_tokens, sp, tuple(stop_strings), eos))
            s.trail = []
            trace.set_cycle(0)
            e.admit()  # the prefill: cycle 0 of a trace
            cycle = 0
            while e.has_work:
                cycle += 1
                trace.set_cycle(cycle)
                e.step()
        except BaseException:
            self._engines = {k: v for k, v in self._engines.items() if v[1] is not e}  # its state is unknown now
            raise
        s.raise_failure()  # the engine ends a failed row alone; a batch of one has nothing else to finish
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()
        m.elapsed_s = time.perf_counter() - t0
        m.accepted = [a for a, _ in s.trail]
        m.depths = [d for _, d in s.trail]
        m.prompt_tokens = ids.numel()
        m.new_tokens = len(s.em.tokens)
        m.phases = e.profiler.totals()
        return GenerationResult(s.em.tokens, s.em.text(), s.em.reason or "length", m)
