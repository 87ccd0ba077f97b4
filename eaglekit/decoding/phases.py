"""One cycle's phases over rows [0, B) of the batch's state, and the plain step over the same rows.

    draft_tree (one draft forward per level for the whole batch) -> verify (one target forward for the whole
    batch, per-row tree masks) -> accept (per row: greedy on the device; sampled rows are redone on the host by
    `resample`, the lossless rule of accept.py) -> cache_update (keep each row's path) -> draft_extend (one draft
    forward over the paths)

Each phase reads and writes the BatchState and this Cycle's own buffers only, at fixed shapes, so that on a GPU each
is recorded in a CUDA graph (decoding.runner) and replayed. The host reads one small tensor per cycle (`out`: each
row's accepted count, tree depth and emitted tokens).
"""

from __future__ import annotations

import torch

from ..kernels.compiling import twin
from .accept import accept_greedy_rows, accept_sampling, accept_synthetic_rows
from .sampling import probs, sample
from .state import CATCH_UP, BatchState, Setup
from .tree import Tree, TreeShape, expand_rows, tree_row


def emitted_rows(tokens, depths, path, n, bonus):
    """-> (the tokens each row's cycle emits: after each path node the next one, after the last
    the bonus, padded as `path` [B, P]; what the host reads per row: n, the tree's depth, those tokens)."""
    em = torch.cat([tokens.gather(1, path[:, 1:]), bonus[:, None]], 1)
    em = em.scatter(1, (n - 1).clamp(min=0)[:, None], bonus[:, None])
    return em, torch.cat([n[:, None], depths.max(-1).values[:, None], em], 1)


def pending_slots(shape: TreeShape) -> int:
    """Draft slots a cycle of `shape` writes past a row's committed entries: its tree's pending nodes, then the extend
    over the accepted path."""
    return max(shape.path_len, (shape.steps - 1) * shape.topk)


class Cycle:
    """One fixed-shape cycle of tree shape `shape` over rows [0, B) of `st`, as phases (recordable in CUDA graphs),
    and the plain step over the same rows. S, Sd: the attention spans of the target and the draft (the runner sets
    them per step where the rows run eagerly)."""

    SPEC = ("draft_tree", "verify", "accept", "cache_update", "draft_extend")

    # each phase's output for the next (None before the phase first runs)
    tree: Tree | None
    logits: torch.Tensor | None
    feats: torch.Tensor | None
    plogits: torch.Tensor | None
    pfeats: torch.Tensor | None

    def __init__(self, setup: Setup, st: BatchState, B: int, S: int, Sd: int, shape: TreeShape, quiet: bool = False):
        self.setup, self.st, self.B, self.S, self.Sd, self.shape = setup, st, B, S, Sd, shape
        assert st.tk is not None  # (the row allocator makes the caches before any cycle)
        self.tk = st.tk.rows(0, B)
        self.dk = st.dk.rows(0, B) if st.dk is not None else None
        self.root, self.active, self.use_draft = st.root[:B], st.active[:B], st.use_draft[:B]
        self.h = st.h[:B] if st.h is not None else None
        self.dl = st.dl[:B] if st.dl is not None else None
        dev, P = st.device, shape.path_len
        self.path = torch.zeros(B, P, dtype=torch.long, device=dev)
        self.n = torch.ones(B, dtype=torch.long, device=dev)
        self.neff = torch.zeros(B, dtype=torch.long, device=dev)
        self.bonus = torch.zeros(B, dtype=torch.long, device=dev)
        self.emitted = torch.zeros(B, P, dtype=torch.long, device=dev)
        self.out = torch.zeros(B, P + 2, dtype=torch.long, device=dev)  # n, tree depth, emitted tokens
        self.next = torch.zeros(B, dtype=torch.long, device=dev)
        self.tree = self.logits = self.feats = self.plogits = self.pfeats = None
        # whether the plain step captures the target's features (for rows that keep their draft): a recorded graph
        # holds one kind, so an engine with a draft records both, this Cycle capturing and a `quiet` one for steps
        # where no row keeps its draft (GraphRunner.plain); eager, it is set per step (there too)
        self.capturing = not quiet
        self.quiet = quiet
        self.recorded: dict[str, torch.cuda.CUDAGraph] | None = None
        # a chain's accepted path is each row's first n nodes: its KV entries and features are already in path order
        self.chain = shape.topk == 1
        # the accept's and the emit's ~25 small operations: compiled (a few kernels) where the draft is
        compiled = setup.draft is not None and setup.draft.compiled_layer is not None
        self._accept, self._emit = twin(accept_greedy_rows, compiled), twin(emitted_rows, compiled)

    # --- speculative phases ----------------------------------------------------------------------
    def draft_tree(self):
        assert self.h is not None and self.dl is not None  # (a speculative cycle runs with the draft's per-row state)
        self.tree = expand_rows(self.setup.draft, self.dk, self.h, self.dl, self.root, self.shape, self.Sd)

    def verify(self):
        t = self.tree
        assert t is not None  # (draft_tree ran)
        self.logits, self.feats = self.setup.target.forward_rows(
            self.tk, t.tokens, t.depths, t.mask, self.S, self.setup.capture
        )

    def accept(self):
        if self.setup.synthetic is not None:
            path, n, bonus = accept_synthetic_rows(
                self.tree, self.logits, self.shape.path_len, self.setup.synthetic, self.use_draft
            )
        else:
            path, n, bonus = self._accept(self.tree, self.logits, self.shape.path_len, self.use_draft)
        self.path.copy_(path)
        self.n.copy_(n)
        self.bonus.copy_(bonus)

    def resample(self, b: int, sp, gen, drafting: bool) -> None:
        """Row b is sampled: its path and bonus by the lossless sampling rule on its tree and target logits (after
        `accept`, before `cache_update`; on the host, outside the recorded graphs), or without its draft one token
        sampled from its root's logits."""
        P = self.shape.path_len
        assert self.tree is not None and self.logits is not None  # (verify ran)
        if drafting:
            path, n, bonus = accept_sampling(tree_row(self.tree, b), self.logits[b], P, sp, gen)
        else:
            path, n = torch.zeros(P, dtype=torch.long, device=self.st.device), 1
            bonus = sample(probs(self.logits[b, 0], sp), gen)
        self.path[b] = path
        self.n[b] = n
        self.bonus[b] = bonus

    def cache_update(self):
        self.neff.copy_(self.n * self.active)  # padding rows commit nothing
        if self.chain:
            self.tk.length += self.neff
        else:
            self.tk.keep(self.path, self.neff)
        assert self.tree is not None  # (draft_tree ran)
        em, out = self._emit(self.tree.tokens, self.tree.depths, self.path, self.n, self.bonus)
        self.emitted.copy_(em)
        self.out.copy_(out)

    def draft_extend(self):
        # (a speculative cycle runs with the draft and its per-row state; verify captured the features)
        assert self.setup.draft is not None and self.dk is not None and self.h is not None and self.dl is not None
        assert self.feats is not None
        F = self.feats.shape[-1]
        feats = (
            self.feats
            if self.chain
            else self.feats.gather(1, self.path[:, :, None].expand(self.B, self.path.shape[1], F))
        )
        h, dl = self.setup.draft.extend_rows(self.dk, feats, self.emitted, self.neff, self.Sd)
        self.h.copy_(h)
        self.dl.copy_(dl)
        self.root.copy_(self.bonus)

    def catch_up(self, m: int) -> None:
        """Rows that went through plain steps: the draft extends over their window of plain tokens (the first `m`
        slots: the longest row's; one eager draft forward for all of them), so the tree cycle starts from each row's
        current token. The window is empty after it."""
        st, B = self.st, self.B
        # (rows catch up only with the draft: its cache and per-row tensors are made)
        assert self.setup.draft is not None and st.dk is not None and st.h is not None and st.dl is not None
        assert st.lag_feats is not None and st.lag_ids is not None and st.lag_n is not None
        n = st.lag_n[:B] * self.use_draft
        h, dl = self.setup.draft.extend_rows(st.dk.rows(0, B), st.lag_feats[:B, :m], st.lag_ids[:B, :m], n, self.Sd)
        moved = (n > 0)[:, None]
        st.h[:B] = torch.where(moved, h.to(st.h.dtype), st.h[:B])
        st.dl[:B] = torch.where(moved, dl, st.dl[:B])
        st.lag_n.zero_()

    # --- the plain batched decode step (no draft) ------------------------------------------------
    def plain(self):
        """One token per row; with the setup's plain_rows k > 1 the token is row 0 of a k-token chain of copies of it
        (written past it, never committed): a verify's shapes, so a kernel that rounds 1 row and k rows apart gives the
        token the arithmetic a speculative verify gives it (decoding.decoder.resolve_baseline_rows)."""
        B, k, dev = self.B, self.setup.plain_rows, self.root.device
        causal = torch.ones(1, k, k, dtype=torch.bool, device=dev).tril_()
        logits, feats = self.setup.target.forward_rows(
            self.tk,
            self.root[:, None].expand(B, k).contiguous(),
            torch.arange(k, device=dev).expand(B, k),
            causal,
            self.S,
            self.setup.capture if self.capturing else None,
        )
        self.plogits = logits[:, 0]
        self.pfeats = feats[:, :1] if feats is not None else None
        self.next.copy_(self.plogits.argmax(-1))

    def plain_commit(self):
        self.tk.length += self.active.long()  # the one pending token is in place: commit it
        st = self.st
        if self.pfeats is not None and st.lag_feats is not None:  # the draft's input for this token, for its catch-up
            assert st.lag_ids is not None and st.lag_n is not None  # (made with lag_feats)
            B, F = self.B, self.pfeats.shape[-1]
            at = st.lag_n[:B].clamp(max=CATCH_UP - 1)[:, None]
            st.lag_feats[:B].scatter_(1, at[:, :, None].expand(B, 1, F), self.pfeats.to(st.lag_feats.dtype))
            st.lag_ids[:B].scatter_(1, at, self.next[:, None])
            st.lag_n[:B] += self.active.long()
        self.root.copy_(self.next)

    # --- running -----------------------------------------------------------------------------------
    def moving(self) -> list[torch.Tensor]:
        """What a cycle or a plain step over these rows moves (committed lengths, roots, the draft's last hidden and
        logits, the catch-up counts): a replay made only to warm up or to time puts these back after it (both kinds
        write the same pending slots past the lengths, which the next real step overwrites)."""
        moving = [self.tk.length, self.root]
        if self.dk is not None:
            assert self.h is not None and self.dl is not None  # (made with the draft's cache)
            moving += [self.dk.length, self.h, self.dl]
        if self.st.lag_n is not None:
            moving.append(self.st.lag_n)
        return moving

    def run(self, phase: str) -> None:
        if self.recorded is not None:
            self.recorded[phase].replay()
        else:
            getattr(self, phase)()
