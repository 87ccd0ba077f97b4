"""A prompt into a free row: the target's prefill (features captured where the row drafts), the row's first token,
and the draft's extend over the prompt; and the prompt graphs' first compile before the first prefill counts."""

from __future__ import annotations

import logging

import torch

from ..errors import FeatureError
from ..kernels.compiling import prompt_calls
from ..models.base import check_finite
from ..models.layers import COMPILE_MAX_TOKENS
from ..observe import trace
from .requests import Seq
from .sampling import probs, sample
from .state import BatchState, Setup

log = logging.getLogger(__name__)


class Prefiller:
    """Prefills rows of `st`. `strict`: a prompt whose captured features are not finite raises E401 (the one-request
    Decoder); otherwise (serve) that request decodes without its draft, its output the target's either way."""

    def __init__(self, setup: Setup, st: BatchState, strict: bool):
        self.setup, self.st, self.strict = setup, st, strict
        # a prompt graph compiled for every length (compile_prompts()) still compiles at its first call: `warm`
        # makes that call at warm-up or before the first prefill
        self.cold = setup.target.compiled_prompts or (
            setup.draft is not None and setup.draft.compiled_prompt is not None
        )

    def warm_span(self) -> int:
        """The slots a row needs for `warm`'s longest call while it is still due (else 1)."""
        return COMPILE_MAX_TOKENS + 1 if self.cold else 1

    @prompt_calls()  # a prompt's length changes from call to call: no per-shape preparation (compiling.prompt_calls)
    def prefill(self, s: Seq, r: int, with_draft: bool) -> None:
        """s's prompt into row r, its first token picked (and pushed to its emitter), the row active; with_draft: the
        draft extended over the prompt and the row drafting (unless its features are not finite)."""
        if self.cold:
            self.warm(r)
        st, dev, target = self.st, self.st.device, self.setup.target
        ids = torch.as_tensor(s.req.prompt_ids, dtype=torch.long, device=dev)
        T = ids.numel()
        assert st.tk is not None  # (the row allocator makes the caches before any prefill)
        kv = st.tk.rows(r, r + 1)
        kv.length.zero_()
        causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
        capture = self.setup.capture if with_draft else None
        logits, feats = target.forward_rows(
            kv, ids[None], torch.arange(T, device=dev)[None], causal, T, capture, last=True
        )
        if feats is not None:  # (one host read a prompt)
            assert capture is not None  # (the target captures features only at a capture spec)
            try:
                check_finite(feats[0], capture, target.info.hidden_size)
            except FeatureError:
                if self.strict:
                    raise
                trace.event("speculation", on=False, rid=s.req.rid, why="non-finite captured features")
                with_draft = False
        kv.length += T
        sp = s.req.sampling
        tok = logits[0, -1].argmax(-1) if sp.greedy else sample(probs(logits[0, -1], sp), s.gen)
        self._begin([s], r, [T], tok.view(1), with_draft)
        if with_draft:
            # (a row drafts only with the draft, whose cache and per-row state the allocator made)
            assert self.setup.draft is not None and st.dk is not None and st.h is not None and st.dl is not None
            dk = st.dk.rows(r, r + 1)
            dk.length.zero_()
            nxt = torch.cat([ids[1:], tok.view(1)])[None]
            h, dl = self.setup.draft.extend_rows(dk, feats, nxt, torch.full((1,), T, dtype=torch.long, device=dev), T)
            st.h[r] = h[0]
            st.dl[r] = dl[0]

    def prefill_together(self, seqs: list[Seq], r0: int, pick, alone) -> bool:
        """The prompts of `seqs` into rows r0, r0 + 1, ... in one forward (_together) -> True; where that fails, each
        by `alone(seq, row)` instead -> False (the engine's prefill of one row, whose failure is that row's own)."""
        try:
            self._together(seqs, r0, pick)
            return True
        except Exception:  # noqa: BLE001 -- redone row by row, where a row's own failure ends it alone
            log.warning("a batched prefill of %d rows failed; prefilling them one by one", len(seqs))
            for i, s in enumerate(seqs):
                alone(s, r0 + i)
            return False

    @prompt_calls()
    def _together(self, seqs: list[Seq], r0: int, pick) -> None:
        """The prompts of `seqs` into rows r0, r0 + 1, ... in one forward, right-padded to the longest, none of them
        drafting (EngineOptions.prefill_tokens): each row's tokens see only its own prompt (causal over slots that
        start at 0), its length is its own, and the padding's slots lie past it, where nothing reads. `pick`
        (logits [k, V], seqs) -> their first tokens [k] (the engine's draws: one call for the rows that share a
        generator)."""
        if self.cold:
            self.warm(r0)
        st, dev, target = self.st, self.st.device, self.setup.target
        assert st.tk is not None  # (the row allocator makes the caches before any prefill)
        k, n = len(seqs), [len(s.req.prompt_ids) for s in seqs]
        T = max(n)
        ids = torch.zeros(k, T, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : n[i]] = torch.as_tensor(s.req.prompt_ids, dtype=torch.long)
        lengths = torch.as_tensor(n, dtype=torch.long, device=dev)
        kv = st.tk.rows(r0, r0 + k)
        kv.length.zero_()
        causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
        depths = torch.arange(T, device=dev)[None].expand(k, T)
        logits, _ = target.forward_rows(kv, ids.to(dev), depths, causal, T, None, last=lengths - 1)
        kv.length += lengths
        self._begin(seqs, r0, n, pick(logits[:, 0], seqs), False)

    def _begin(self, seqs: list[Seq], r0: int, lengths: list[int], toks: torch.Tensor, drafting: bool) -> None:
        """Rows r0, r0 + 1, ... started after their prompts: first tokens toks [k] their roots, the rows active, their
        catch-up windows empty, drafting or not; each request's committed length and first token on the host (one
        host read for all k)."""
        st, k = self.st, len(seqs)
        st.root[r0 : r0 + k] = toks
        st.active[r0 : r0 + k] = True
        st.use_draft[r0 : r0 + k] = drafting
        if st.lag_n is not None:
            st.lag_n[r0 : r0 + k] = 0
        for s, length, tok in zip(seqs, lengths, toks.tolist()):
            s.length = length
            s.em.push([tok])
            s.new = list(s.em.tokens)
            s.use_draft = drafting

    @prompt_calls()
    def warm(self, r: int) -> None:
        """Compile the prompt graphs (eaglekit.kernels.compiling.compile_prompt) before a prefill counts: row r's
        target prefill and the draft's extend over it with junk tokens at 2 and COMPILE_MAX_TOKENS + 1 tokens (the
        row span makes room: warm_span), the two sides of the row limit where the products and the attention branch.
        The row's lengths go back to 0: the prefill that follows writes over the entries it reads, and nothing reads
        past a length."""
        self.cold = False
        st, dev, draft = self.st, self.st.device, self.setup.draft
        assert st.tk is not None  # (warm-up follows the allocator's first sizing)
        kv, dk = st.tk.rows(r, r + 1), (st.dk.rows(r, r + 1) if st.dk is not None else None)
        extend = dk is not None and draft is not None and draft.compiled_prompt is not None
        with trace.paused():
            for T in (2, COMPILE_MAX_TOKENS + 1):
                ids = torch.arange(T, device=dev)[None]
                causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
                kv.length.zero_()
                _, feats = self.setup.target.forward_rows(
                    kv, ids, ids, causal, T, self.setup.capture if extend else None, last=True
                )
                if extend:
                    assert dk is not None and draft is not None  # (`extend` says so)
                    dk.length.zero_()
                    draft.extend_rows(dk, feats, ids, torch.full((1,), T, dtype=torch.long, device=dev), T)
        kv.length.zero_()
        if dk is not None:
            dk.length.zero_()
