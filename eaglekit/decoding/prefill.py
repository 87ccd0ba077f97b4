"""A prompt into a free row: the target's prefill (features captured where the row drafts), the row's first token,
and the draft's extend over the prompt; and the prompt graphs' first compile before the first prefill counts."""

from __future__ import annotations

import torch

from ..errors import FeatureError
from ..kernels.compiling import prompt_calls
from ..models.base import check_finite
from ..models.layers import COMPILE_MAX_TOKENS
from ..observe import trace
from .requests import Seq
from .sampling import probs, sample
from .state import BatchState, Setup


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
        s.length = T
        s.em.push([int(tok)])
        s.new = list(s.em.tokens)
        st.root[r] = tok
        st.active[r] = True
        if with_draft:
            # (a row drafts only with the draft, whose cache and per-row state the allocator made)
            assert self.setup.draft is not None and st.dk is not None and st.h is not None and st.dl is not None
            dk = st.dk.rows(r, r + 1)
            dk.length.zero_()
            nxt = torch.cat([ids[1:], tok.view(1)])[None]
            h, dl = self.setup.draft.extend_rows(dk, feats, nxt, torch.full((1,), T, dtype=torch.long, device=dev), T)
            st.h[r] = h[0]
            st.dl[r] = dl[0]
        if st.lag_n is not None:
            st.lag_n[r] = 0
        s.use_draft = with_draft
        st.use_draft[r] = with_draft

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
