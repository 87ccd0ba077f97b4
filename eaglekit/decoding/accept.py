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
    """The sampling rule (module docstring) on one row's tree [D] and target logits [D, V] -> (path [size], n, the
    emitted token), all on the device, with no host read (trying the children one by one read three numbers on the
    host a child: on a GPU up to 15 synchronisations a sampled row's (5,1,6) cycle).

    Every node's trial is computed at once: child c of node a, tried after its earlier siblings were rejected, sees
    what is left of p_a, total_c = sum(p_a) - (its earlier siblings' p_a), and is accepted when u_c * total_c <
    p_a(x_c) (surely where p_a(x_c) >= total_c), u_c one uniform draw per node (D draws a cycle from `gen`,
    whatever the path: a seeded row's draws do not depend on what was accepted). The walk from the root then takes
    each node's first accepted child, as trying them in order does; a trial whose parent the walk never reaches is
    never used, so each used trial's draw is independent of the others, as in the sequential rule. A token repeated
    among siblings counts once (the sequential rule zeroes it at its first rejection: a later copy has p 0). At the
    last node every child was rejected: the emitted token is drawn from p_a with the children's tokens zeroed."""
    p_all = probs(logits, sp)  # [D, V]
    tokens, parents = tree.tokens, tree.parents
    D, dev = tokens.numel(), logits.device
    idx = torch.arange(D, device=dev)
    child = idx > 0
    # earlier[c, j]: j is a sibling of c tried before it (the same parent, a lower index; index order is the draft's
    # score order within a parent)
    earlier = (parents[:, None] == parents[None, :]) & (idx[None, :] < idx[:, None]) & child[None, :] & child[:, None]
    repeated = (earlier & (tokens[:, None] == tokens[None, :])).any(1)
    px = torch.where(repeated, 0.0, p_all[parents, tokens])  # p of the parent at this node's token
    total = p_all.sum(-1)[parents] - (earlier.to(px.dtype) * px[None, :]).sum(1)
    u = torch.rand(D, generator=gen, device=dev, dtype=px.dtype)
    accepted = child & ((px >= total) | (u * total < px))
    # each node's first accepted child (-1: none), then the walk: at most size - 1 levels below the root
    kids = (parents[None, :] == idx[:, None]) & accepted[None, :]  # [a, c]: c an accepted child of a
    first = torch.where(kids.any(1), kids.to(torch.int8).argmax(1), -1)
    node = torch.zeros((), dtype=torch.long, device=dev)
    for _ in range(size - 1):  # (index_select: a 0-d index would be read on the host, as in _path_of)
        nxt = first.index_select(0, node.view(1))[0]
        node = torch.where(nxt >= 0, nxt, node)
    rejected = (parents == node) & child  # the last node's children: all tried, all rejected
    # their tokens zeroed in the node's p (by a sum over all nodes: a mask index would read its size on the host)
    hit = torch.zeros(p_all.shape[-1], dtype=p_all.dtype, device=dev).index_add_(0, tokens, rejected.to(p_all.dtype))
    p_node = p_all.index_select(0, node.view(1))[0]
    p = torch.where(hit > 0, 0.0, p_node)
    # (the children held all of p: the last one's total exceeded its p by rounding alone and a draw within it rejected
    # it, a chance of ~1e-16; its parent's p then stands, not an all-zero residual that no draw can take)
    p = torch.where(p.sum() > 0, p, p_node)
    path, n = _path_of(tree, node, size)
    return path, n, sample(p / p.sum(), gen)


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
