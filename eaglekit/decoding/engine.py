"""The speculative cycle and the baseline loop, on the same target code.

    prefill (features at the capture layers) -> draft extend -> [expand tree -> verify (one target
    forward, tree mask) -> accept (path + bonus) -> keep the path's KV -> draft extend on the path]*

Batch size 1. One small host read per cycle (the accepted tokens); everything else stays on the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..capture import CaptureSpec
from ..draft import Eagle3Draft, check_pair
from ..errors import GenerationError
from ..models.base import Target
from ..observe import trace
from ..observe.metrics import GenerationMetrics
from ..observe.profile import Profiler
from .accept import accept
from .sampling import SamplingParams, make_generator, probs, sample
from .stops import Emitter
from .tree import TreeShape, expand


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    stop_reason: str
    metrics: GenerationMetrics


class Decoder:
    def __init__(self, target: Target, draft: Eagle3Draft | None = None, shape: TreeShape | None = None,
                 capture: CaptureSpec | None = None, allow_other_target: bool = False, profile: bool = False):
        self.target, self.draft = target, draft
        self.shape = shape or TreeShape.make()
        self.profiler = Profiler(profile, target.device)
        if draft is not None:
            self.capture = check_pair(draft, target, capture, allow_other_target)
            target.set_capture(self.capture)
        else:
            self.capture = None

    # --- helpers ---------------------------------------------------------------------------------
    def _prompt(self, prompt_ids, max_new_tokens: int) -> torch.Tensor:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.target.device).view(-1)
        if ids.numel() == 0:
            raise GenerationError("the prompt is empty", fix="give at least one token", code="E305")
        V = self.target.info.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= V:
            raise GenerationError(f"prompt token ids must lie in 0..{V - 1}", fix="tokenize with the target's tokenizer",
                                  code="E305")
        ctx = self.target.info.max_position_embeddings
        if ids.numel() + max_new_tokens > ctx:
            raise GenerationError(
                f"the prompt ({ids.numel()} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the target's "
                f"context of {ctx} positions",
                fix=f"shorten the prompt or lower --max-new-tokens to {max(ctx - ids.numel(), 0)}", code="E301")
        return ids

    def _pick(self, logits_row, sp, gen):
        return logits_row.argmax(-1) if sp.greedy else sample(probs(logits_row, sp), gen)

    # --- entry point -----------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new_tokens: int = 128, sampling: SamplingParams | None = None,
                 stop_strings=(), tokenizer=None, baseline: bool = False, eos_ids=None) -> GenerationResult:
        sp = sampling or SamplingParams()
        ids = self._prompt(prompt_ids, max_new_tokens)
        eos = self.target.info.eos_token_ids if eos_ids is None else eos_ids
        em = Emitter(max_new_tokens, eos, stop_strings, tokenizer)
        gen = make_generator(sp, self.target.device)
        self.profiler.reset()
        t0 = time.perf_counter()
        if baseline or self.draft is None:
            m = self._baseline(ids, em, sp, gen)
        else:
            m = self._speculative(ids, em, sp, gen)
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()
        m.elapsed_s = time.perf_counter() - t0
        m.prompt_tokens = ids.numel()
        m.new_tokens = len(em.tokens)
        m.phases = self.profiler.totals()
        return GenerationResult(em.tokens, em.text(), em.reason or "length", m)

    def _baseline(self, ids, em: Emitter, sp, gen) -> GenerationMetrics:
        t, ph = self.target, self.profiler.phase
        saved = t.capture
        t.set_capture(None)  # the baseline needs no features
        try:
            t.reset(ids.numel() + em.max_new_tokens + 1)
            trace.set_cycle(0)
            with ph("prefill"):
                logits, _ = t.prefill(ids)
                tok = self._pick(logits[-1], sp, gen)
            em.push([int(tok)])
            while not em.done:
                with ph("decode"):
                    logits, _ = t.run(tok.view(1))
                    t.commit(None)
                    tok = self._pick(logits[-1], sp, gen)
                em.push([int(tok)])
        finally:
            t.set_capture(saved)
        return GenerationMetrics()

    def _speculative(self, ids, em: Emitter, sp, gen) -> GenerationMetrics:
        t, d, shape, ph = self.target, self.draft, self.shape, self.profiler.phase
        m = GenerationMetrics(draft_tokens=shape.draft_tokens)
        max_len = ids.numel() + em.max_new_tokens + shape.draft_tokens + 1
        t.reset(max_len)
        d.reset(max_len + shape.steps * shape.topk)
        trace.set_cycle(0)
        with ph("prefill"):
            logits, feats = t.prefill(ids)
            tok = self._pick(logits[-1], sp, gen)
        em.push([int(tok)])
        if em.done:
            return m
        with ph("draft_extend"):
            h, dl = d.extend(feats, torch.cat([ids[1:], tok.view(1)]))
        cycle = 0
        while True:
            cycle += 1
            trace.set_cycle(cycle)
            with ph("draft_tree"):
                tree = expand(d, h[-1], dl[-1], tok, shape)
            with ph("verify"):
                logits, feats = t.run(tree.tokens, tree.depths, tree.mask)
            with ph("accept"):
                path, bonus = accept(tree, logits, sp, gen)
            with ph("cache_update"):
                t.commit(path)
            with ph("host_sync"):  # the one read per cycle: accepted tokens, bonus, tree depth
                host = torch.cat([tree.tokens[path], bonus.view(1), tree.depths.max().view(1)]).tolist()
            accepted, depth = len(host) - 3, host[-1]
            m.accepted.append(accepted)
            m.depths.append(depth)
            em.push(host[1:-1])
            if em.done:
                return m
            with ph("draft_extend"):
                h, dl = d.extend(feats[path], torch.cat([tree.tokens[path[1:]], bonus.view(1)]))
            tok = bonus
