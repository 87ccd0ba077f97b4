"""Draft tree expansion (SGLang / EAGLE-3 style) with fixed shapes and no host synchronisation.

Level 1 is the top-k of the draft's last extend output. Each further level runs the draft once on the
current frontier (top-k nodes), scores the topk x topk children by the product of probabilities
along their path, and keeps the best topk as the next frontier. Finally the `draft_tokens - 1`
best-scored candidates of all levels plus the root form the tree that the target verifies.
topk = 1 is a chain of `steps` tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..draft.walk import DECAY
from ..errors import GenerationError
from ..kernels import topk
from ..kernels.topk import top_probs


@dataclass(frozen=True)
class TreeShape:
    steps: int
    topk: int
    draft_tokens: int

    @classmethod
    def make(cls, steps: int = 3, topk: int = 1, draft_tokens: int | None = None) -> "TreeShape":
        if draft_tokens is None:
            draft_tokens = steps + 1 if topk == 1 else min(1 + topk + (steps - 1) * topk * topk, 4 * steps)
        return cls(steps, topk, draft_tokens)

    def __post_init__(self):
        s, k, d = self.steps, self.topk, self.draft_tokens
        if not all(isinstance(v, int) for v in (s, k, d)) or s < 1 or k < 1:
            raise GenerationError(
                f"steps and topk must be integers >= 1, got steps={s!r} topk={k!r}",
                fix="e.g. --steps 3 --topk 1",
                code="E303",
            )
        if k == 1 and d != s + 1:
            raise GenerationError(
                f"topk 1 makes a chain of {s} draft tokens, so draft_tokens must be steps + 1 = {s + 1}, got {d}",
                fix=f"pass --draft-tokens {s + 1} or leave it out",
                code="E303",
            )
        most = 1 + k + (s - 1) * k * k
        if d < 2 or d > most:
            raise GenerationError(
                f"draft_tokens must lie in 2..{most} for steps={s}, topk={k} (root + candidates), got {d}",
                fix=f"pass --draft-tokens between 2 and {most}",
                code="E303",
            )

    def shorter(self) -> list["TreeShape"]:
        """This shape and the shallower ones an engine may run instead, one per accepted-path length, longest first:
        a chain's prefixes; a tree of the same width at each smaller depth, its draft tokens capped at what that
        depth holds."""
        out: dict[int, TreeShape] = {}
        for s in range(self.steps, 0, -1):
            d = s + 1 if self.topk == 1 else min(self.draft_tokens, 1 + self.topk + (s - 1) * self.topk**2)
            shape = self if s == self.steps else TreeShape(s, self.topk, d)
            out.setdefault(shape.path_len, shape)
        return list(out.values())

    @property
    def path_len(self) -> int:
        """The longest accepted path, root included: bounded by the depth and by the tree's size."""
        return min(self.steps + 1, self.draft_tokens)


@dataclass
class Tree:
    """A draft tree: expand_rows gives each field a leading row dimension ([B, D], mask [B, D, D]), tree_row one row's
    as below."""

    tokens: torch.Tensor  # [D] target ids; node 0 is the root (the last emitted token)
    parents: torch.Tensor  # [D] parent node index; the root points to itself
    depths: torch.Tensor  # [D]
    mask: torch.Tensor  # [D, D] bool: row i marks i's ancestors and i itself


_FRAMES: dict = {}


def _tree_frame(K: int, P: int, dev) -> tuple:
    """A tree's first frontier's constant parts: no parent, candidate ids 0..K-1, no ancestors among P pending
    slots, level 0. The same every cycle, so made once (not four small kernels a tree). Read only."""
    key = ("tree", K, P, str(dev))
    if key not in _FRAMES:
        _FRAMES[key] = (
            torch.full((K,), -1, dtype=torch.long, device=dev),
            torch.arange(K, device=dev),
            torch.zeros(K, P, dtype=torch.bool, device=dev),
            torch.zeros((), dtype=torch.long, device=dev),
        )
    return _FRAMES[key]


def _chain_frame(steps: int, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chain's parents, depths and mask: the same every cycle, so made once (not five kernels a cycle). Read only."""
    key = (steps, str(dev))
    if key not in _FRAMES:
        D = steps + 1
        _FRAMES[key] = (
            torch.arange(-1, steps, device=dev).clamp_(min=0),
            torch.arange(D, device=dev),
            torch.ones(D, D, dtype=torch.bool, device=dev).tril_(),
        )
    return _FRAMES[key]


# --- one tree per row -------------------------------------------------------------------------------
def expand_rows(
    draft, kv, h_last: torch.Tensor, logits_last: torch.Tensor, root: torch.Tensor, shape: TreeShape, span: int
) -> Tree:
    """Grow one tree per row from the draft's last extend output: h_last [B, H], logits_last [B, Vd], root [B] (each
    row's last emitted token); `kv` is the draft's row cache of those rows (committed lengths kv.length [B]). The
    draft's own walk where it offers one (chain_rows / tree_rows not None: Eagle3Draft's one-row walk, one compiled
    graph on a GPU, grown by eaglekit.draft.walk by the same rule), else one draft forward per level for the whole
    batch over its step_rows. Returns a Tree whose fields carry a leading batch dim: tokens/parents/depths [B, D],
    mask [B, D, D].

    Fixed shapes, no host synchronisation: the committed lengths are device tensors and every draft step attends
    over the span (committed slots + this tree's pending slots)."""
    if shape.topk == 1:
        return _chain_rows(draft, kv, h_last, logits_last, root, shape.steps, span)
    return _tree_rows(draft, kv, h_last, logits_last, root, shape, span)


def _chain_rows(draft, kv, h_last, logits_last, root, steps: int, span: int) -> Tree:
    """expand_rows for topk = 1: the tree `_tree_rows` builds for topk = 1 with a fraction of the operations (what a
    chain's cycle pays for in small-op overhead on a CPU, or in kernels on a GPU): no candidate scores and no
    selection, since every node is kept; a chain's mask, parents and depths are fixed. Each level takes the top 1 of
    the softmax, as the argmax of the logits."""
    dev, B = logits_last.device, root.shape[0]
    D = steps + 1
    tokens = draft.chain_rows(kv, h_last, logits_last, steps, root, span)
    if tokens is not None:  # one row, compiled: the one-sequence chain's graph (Eagle3Draft.chain_rows)
        parents, depths, mask = _chain_frame(steps, dev)
        return Tree(tokens=tokens, parents=parents[None], depths=depths[None], mask=mask[None])
    m = kv.length  # [B]
    cols = torch.arange(span, device=dev)
    tok = topk.top1(logits_last)  # [B, 1]
    toks, h = [tok], h_last[:, None, :]
    for level in range(2, steps + 1):
        # [B, 1, S]: node d (the entry for position m - 1 + d, written at slot m + d - 1) sees the committed entries
        # and the nodes before it
        mask = (cols[None, :] < (m + (level - 1))[:, None])[:, None, :]
        slot = (m + (level - 2))[:, None]
        h, logits = draft.step_rows(kv, h, draft.to_target_ids(tok), slot, slot, mask)
        tok = topk.top1(logits)[:, 0]  # [B, 1]
        toks.append(tok)
    return Tree(
        tokens=torch.cat([root[:, None], draft.to_target_ids(torch.cat(toks, 1))], 1),
        parents=torch.arange(-1, steps, device=dev).clamp_(min=0).repeat(B, 1),
        depths=torch.arange(D, device=dev).repeat(B, 1),
        mask=torch.ones(D, D, dtype=torch.bool, device=dev).tril_().repeat(B, 1, 1),
    )


def _tree_rows(
    draft, kv, h_last: torch.Tensor, logits_last: torch.Tensor, root: torch.Tensor, shape: TreeShape, span: int
) -> Tree:
    """The general batched expansion (expand_rows sends chains to `_chain_rows`)."""
    K, dev = shape.topk, logits_last.device
    B = root.shape[0]
    # the draft's own tree where it has one (Eagle3Draft.tree_rows: one row, its one-sequence graph); else walked here
    frame = _tree_frame(K, max((shape.steps - 1) * K, 1), dev)
    grown = draft.tree_rows(kv, h_last, logits_last, root, frame, shape.steps, shape.draft_tokens - 1, span)
    if grown is not None:
        return Tree(*grown)
    m = kv.length  # [B]
    top_p, top_i = top_probs(logits_last, K)  # [B, K]
    cand_scores, cand_tokens = [top_p], [top_i]
    cand_parents = [torch.full((B, K), -1, dtype=torch.long, device=dev)]
    cand_depths = [torch.ones(B, K, dtype=torch.long, device=dev)]
    f_scores, f_tokens = top_p, top_i
    f_cand = torch.arange(K, device=dev).expand(B, K)
    f_hidden = h_last[:, None, :].expand(B, K, h_last.shape[-1])
    P = max((shape.steps - 1) * K, 1)
    f_anc = torch.zeros(B, K, P, dtype=torch.bool, device=dev)
    rel = torch.arange(span, device=dev)[None, :] - m[:, None]  # [B, S]
    pending = (rel >= 0) & (rel < P)
    relc = rel.clamp(0, P - 1)[:, None, :].expand(B, K, span)
    offset = K
    slot_ids = torch.arange(P, device=dev)
    for level in range(2, shape.steps + 1):
        cols = torch.arange((level - 2) * K, (level - 1) * K, device=dev)
        anc = f_anc | (slot_ids[None, :] == cols[:, None])[None]  # [B, K, P]
        mask = (rel < 0)[:, None, :] | (pending[:, None, :] & anc.gather(2, relc))  # [B, K, S]
        pos = (m + (level - 2))[:, None].expand(B, K)
        h, logits = draft.step_rows(kv, f_hidden, draft.to_target_ids(f_tokens), pos, m[:, None] + cols[None], mask)
        cp, ci = top_probs(logits, K)  # [B, K, K]
        cs = (f_scores[:, :, None] * cp).reshape(B, K * K)
        cand_scores.append(cs)
        cand_tokens.append(ci.reshape(B, K * K))
        cand_parents.append(f_cand.repeat_interleave(K, dim=1))
        cand_depths.append(torch.full((B, K * K), level, dtype=torch.long, device=dev))
        f_scores, pick = cs.topk(K, dim=-1)
        row = pick // K
        f_tokens = ci.reshape(B, K * K).gather(1, pick)
        f_cand = offset + pick
        f_hidden = h.gather(1, row[:, :, None].expand(B, K, h.shape[-1]))
        f_anc = anc.gather(1, row[:, :, None].expand(B, K, P))
        offset += K * K
    scores = torch.cat(cand_scores, 1)
    tokens = torch.cat(cand_tokens, 1)
    parents = torch.cat(cand_parents, 1)
    depths = torch.cat(cand_depths, 1)
    n_sel = shape.draft_tokens - 1
    key = scores * torch.exp(depths.float() * math.log(DECAY))
    sel = key.topk(n_sel, dim=-1).indices.sort(dim=-1).values  # [B, n_sel]
    node_of = torch.full_like(scores, -1, dtype=torch.long)
    node_of.scatter_(1, sel, torch.arange(1, n_sel + 1, device=dev).expand(B, n_sel))
    par = parents.gather(1, sel)
    node_parent = torch.where(par < 0, torch.zeros_like(par), node_of.gather(1, par.clamp(min=0)))
    D = shape.draft_tokens
    all_parents = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), node_parent], 1)
    anc = torch.eye(D, dtype=torch.bool, device=dev).expand(B, D, D)
    for _ in range(shape.steps):
        anc = anc | anc.gather(1, all_parents[:, :, None].expand(B, D, D))
    return Tree(
        tokens=torch.cat([root[:, None], draft.to_target_ids(tokens.gather(1, sel))], 1),
        parents=all_parents,
        depths=torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), depths.gather(1, sel)], 1),
        mask=anc,
    )


def tree_row(tree: Tree, b: int) -> Tree:
    """Row b of a batched tree, as a batch-1 Tree (for the per-row sampling rule)."""
    return Tree(tree.tokens[b], tree.parents[b], tree.depths[b], tree.mask[b])
