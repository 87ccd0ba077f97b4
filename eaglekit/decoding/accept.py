"""Acceptance: which tree path the target agrees with, and the token it adds after it.

Greedy: walk from the root taking the child equal to the target's argmax; emit the path and the
argmax at its last node (the bonus). Computed on the device; the caller reads one small result.

Sampling ("target-only" rule of the EAGLE reference and SGLang, lossless for deterministic
candidates): at a node with target distribution p, try its children in order; accept child x with
probability p(x) / sum(p); on rejection set p(x) = 0 and try the next; if all are rejected, sample the
emitted token from what is left of p and stop. Each emitted token then follows p exactly.
"""

from __future__ import annotations

import torch

from .sampling import SamplingParams, probs, sample
from .tree import Tree


def _path_of(tree: Tree, best: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Root-to-`best` node indices, padded to `size` (fixed shape), and how many are real."""
    D = tree.mask.shape[0]
    row = tree.mask.index_select(0, best.view(1))[0]  # (a 0-d index would be read on the host)
    # ancestors first, in index order (== root-to-leaf order, parents precede children)
    order = ((~row).long() * D + torch.arange(D, device=row.device)).argsort()
    return order[:size], row.sum()


def accept_greedy(tree: Tree, logits: torch.Tensor, size: int):
    """-> (path [size] node indices root first, padded; n real entries; bonus token), all on device."""
    pred = logits.argmax(-1)
    D = tree.tokens.numel()
    match = (tree.tokens == pred[tree.parents]) | (torch.arange(D, device=pred.device) == 0)  # root matches
    ok = ~(tree.mask & ~match[None, :]).any(1)  # every node on the path (itself included) matches
    best = torch.where(ok, tree.depths, -1).argmax()
    path, n = _path_of(tree, best, size)
    return path, n, pred.index_select(0, best.view(1))[0]


def accept_sampling(tree: Tree, logits: torch.Tensor, size: int, sp: SamplingParams, gen: torch.Generator | None):
    p_all = probs(logits, sp)
    tokens = tree.tokens.tolist()
    parents = tree.parents.tolist()
    children: dict[int, list[int]] = {}
    for i in range(1, len(tokens)):
        children.setdefault(parents[i], []).append(i)  # index order == draft score order within a parent
    node = 0
    while True:
        p = p_all[node].clone()
        nxt = None
        for c in children.get(node, ()):
            x = tokens[c]
            total = float(p.sum())
            px = float(p[x])
            u = float(torch.rand((), generator=gen, device=p.device)) if gen is not None else float(torch.rand(()))
            if px >= total or u * total < px:  # (px >= total: all mass on x, accept surely)
                nxt = c
                break
            p[x] = 0.0
        if nxt is None:
            p = p / p.sum()
            path, n = _path_of(tree, torch.tensor(node, device=logits.device), size)
            return path, n, sample(p, gen)
        node = nxt


def accept(tree: Tree, logits: torch.Tensor, size: int, sp: SamplingParams, gen=None):
    if sp.greedy:
        return accept_greedy(tree, logits, size)
    return accept_sampling(tree, logits, size, sp, gen)


def accept_greedy_rows(tree: Tree, logits: torch.Tensor, size: int, use_draft: torch.Tensor | None = None):
    """`accept_greedy` per row of a batched tree (tokens [B, D], mask [B, D, D]; logits [B, D, V]).
    Rows where `use_draft` is False accept only the root (a plain decode step: the bonus is the argmax after
    it). -> (path [B, size], n [B], bonus [B]), all on device."""
    pred = logits.argmax(-1)  # [B, D]
    match = tree.tokens == pred.gather(1, tree.parents)
    return _deepest_match(tree, match, pred, size, use_draft)


def accept_synthetic_rows(
    tree: Tree, logits: torch.Tensor, size: int, rate: float, use_draft: torch.Tensor | None = None
):
    """BENCHMARK ONLY, NOT LOSSLESS (vLLM's synthetic acceptance): along each row's top-1 branch (every node the
    first child of its parent, the draft's best guess) each draft position is accepted with probability `rate`,
    whatever the target says; the bonus is still the target's argmax after the last accepted node. The emitted
    tokens are the draft's: speed at a chosen accept length with random weights, never output to read."""
    pred = logits.argmax(-1)
    B, D = tree.tokens.shape
    idx = torch.arange(D, device=pred.device)
    sibling_before = (tree.parents[:, :, None] == tree.parents[:, None, :]) & (idx[None, :] < idx[:, None])[None]
    first_child = ~(sibling_before & (idx > 0)[None, None, :]).any(-1)  # [B, D]
    u = torch.rand(B, D, device=pred.device).gather(1, tree.depths)  # one draw per row and depth
    return _deepest_match(tree, first_child & (u < rate), pred, size, use_draft)


def _deepest_match(tree: Tree, match: torch.Tensor, pred: torch.Tensor, size: int, use_draft):
    """The deepest node whose whole root path matches (the root always does) -> (path, n, bonus) per row."""
    B, D = tree.tokens.shape
    first = torch.arange(D, device=pred.device) == 0
    match = match | first[None]
    if use_draft is not None:
        match = match & (use_draft[:, None] | first[None])
    ok = ~(tree.mask & ~match[:, None, :]).any(-1)
    best = torch.where(ok, tree.depths, -1).argmax(-1)  # [B]
    row = tree.mask.gather(1, best[:, None, None].expand(B, 1, D))[:, 0]  # [B, D]
    order = ((~row).long() * D + torch.arange(D, device=row.device)).argsort(-1)
    return order[:, :size], row.sum(-1), pred.gather(1, best[:, None])[:, 0]


def synthetic_rate(accept_length: float, positions: int) -> float:
    """The per-position rate at which `accept_synthetic_rows` gives `accept_length` tokens per verify (bonus
    included) on a path of `positions` draft tokens: 1 + r + r^2 + ... + r^positions = accept_length."""
    if not 1.0 <= accept_length <= positions + 1:
        from ..errors import InputError

        raise InputError(
            f"a synthetic accept length of {accept_length} is outside 1..{positions + 1} for a tree "
            f"path of {positions} draft tokens",
            fix="pass a length in that range (or a deeper tree)",
            code="E317",
        )
    lo, hi = 0.0, 1.0
    for _ in range(60):
        r = (lo + hi) / 2
        if sum(r**i for i in range(positions + 1)) < accept_length:
            lo = r
        else:
            hi = r
    return (lo + hi) / 2
