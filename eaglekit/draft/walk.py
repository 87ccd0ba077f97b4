"""How a draft tree grows over one sequence's cache, level by level, from any draft step: the walk of Eagle3Draft's
one-row tree (draft.layer_walks; one compiled graph on a GPU, eager elsewhere). The engine's walk over many rows
(eaglekit.decoding.tree.expand_rows) grows trees by the same rule (path probabilities, DECAY, the same selection);
tests/decoding/test_lossless.py holds the two to the same trees, field by field.

It lives with the draft, below the engine, because the draft compiles it into its own graph: a draft module may
import it, and decoding imports DECAY from here (imports go downward only: docs/architecture.md).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from ..kernels import topk

# Ties between a node and its child (a child probability of exactly 1.0) must not let the child be
# picked without its parent: selection uses score * DECAY**depth, strictly decreasing along a path.
DECAY = 1.0 - 1e-5


class WalkFns(NamedTuple):
    """What a tree's walk calls, given together: step(hidden [K, H], target ids [K], positions, slots, mask [K, span]
    or None, ancestors [K, P] bool) -> (hidden, logits [K, Vd]) runs a level; `to_target` maps draft ids to target
    ids; `top` is top_probs or its registered op. A NamedTuple: torch.compile traces the one built inside the draft's
    compiled tree (eaglekit.draft.layer_walks.tree_steps) as a tuple, with no graph break."""

    step: Callable
    to_target: Callable
    top: Callable


def walk_tree(
    fns: WalkFns, h_last, logits_last, root, m, cols, frame: tuple, steps: int, n_sel: int, with_mask: bool = True
) -> tuple:
    """The tree's levels and selection over `fns` (WalkFns); m committed entries, cols arange(span), frame
    eaglekit.decoding.tree's `_tree_frame`. -> (tokens, parents, depths, mask) of the tree. Eagle3Draft's one-row
    tree runs it eagerly or inside one compiled graph (the same code, so the same trees)."""
    step, to_target, top = fns
    no_parent, f_cand, f_anc, lv = frame
    K = f_cand.numel()
    top_p, top_i = top(logits_last, K)
    cand_scores, cand_tokens, cand_parents = [top_p], [top_i], [no_parent]
    f_scores, f_hidden = top_p, h_last.expand(K, -1)
    f_ids = to_target(top_i)  # the frontier's tokens as target ids (later levels': from `advance`)
    for _ in range(2, steps + 1):
        anc, mask, pos, slots = frontier(f_anc, cols, m, lv, K, with_mask)
        h, logits = step(f_hidden, f_ids, pos, slots, mask, anc)
        cp, ci = top(logits, K)  # [K, K]
        cs, toks, pars, f_scores, f_ids, f_cand, f_hidden, f_anc, lv = advance(
            f_scores, cp, ci, f_cand, h, anc, lv, K, to_target
        )
        cand_scores.append(cs)
        cand_tokens.append(toks)
        cand_parents.append(pars)
    return select(cand_scores, cand_tokens, cand_parents, K, steps, n_sel, root, to_target)


def frontier(f_anc, span_cols, m, lv, K: int, with_mask: bool = True):
    """The frontier of level lv + 2 (its K nodes; lv a 0-d tensor): their ancestors' pending slots and their own,
    their mask over the draft's span (span_cols: arange(span); every committed slot and those pending slots; None
    without `with_mask`), their positions and slots."""
    P = f_anc.shape[1]
    rel = span_cols - m  # draft slot -> index into the pending region
    cols = lv * K + torch.arange(K, device=f_anc.device)
    anc = f_anc | (torch.arange(P, device=f_anc.device)[None, :] == cols[:, None])
    mask = (rel < 0)[None, :] | (((rel >= 0) & (rel < P))[None, :] & anc[:, rel.clamp(0, P - 1)]) if with_mask else None
    # a frontier node at depth d is the draft entry for position m - 1 + d (its token is at m + d)
    return anc, mask, (m + lv).expand(K), m + cols


def advance(f_scores, cp, ci, f_cand, h, anc, lv, K: int, to_target):
    """The frontier's K x K children: their scores (the product of probabilities along the path), tokens and parent
    candidates; and the next frontier, the best K of them (scores, tokens as target ids through `to_target`,
    candidate ids, hidden, ancestors), and the next lv. Candidates are numbered in generation order: level 1's K,
    then K * K a level."""
    cs = (f_scores[:, None] * cp).reshape(-1)
    tokens = ci.reshape(-1)
    scores, pick = topk.small_topk(cs, K)
    row = pick // K
    offset = K + lv * (K * K)
    return (
        cs,
        tokens,
        f_cand.repeat_interleave(K),
        scores,
        to_target(tokens[pick]),
        offset + pick,
        h[row],
        anc[row],
        lv + 1,
    )


def select(cand_scores: list, cand_tokens: list, cand_parents: list, K: int, steps: int, n_sel: int, root, to_target):
    """The tree: the n_sel best candidates of all levels by score * DECAY**depth, in generation order (parents
    before children), under the root -> (the tree's tokens: `root` then theirs through `to_target`, target ids;
    parents, depths and the ancestor mask with the root)."""
    scores, tokens, parents = torch.cat(cand_scores), torch.cat(cand_tokens), torch.cat(cand_parents)
    dev = scores.device
    depths = torch.cat(
        [
            torch.full((K if level == 1 else K * K,), level, dtype=torch.long, device=dev)
            for level in range(1, steps + 1)
        ]
    )
    key = scores * torch.exp(depths.float() * math.log(DECAY))  # (no host scalar: recordable in a CUDA graph)
    sel = topk.small_top_sorted(key, n_sel)  # generation order: parents before children
    node_of = torch.full((scores.numel(),), -1, dtype=torch.long, device=dev)
    node_of[sel] = torch.arange(1, n_sel + 1, device=dev)
    par = parents[sel]
    node_parent = torch.where(par < 0, torch.zeros_like(par), node_of[par.clamp(min=0)])
    all_parents = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), node_parent])
    anc = torch.eye(n_sel + 1, dtype=torch.bool, device=dev)
    for _ in range(steps):  # each pass adds one more generation of ancestors
        anc = anc | anc[all_parents]
    return (
        torch.cat([root.view(1), to_target(tokens[sel])]),
        all_parents,
        torch.cat([torch.zeros(1, dtype=torch.long, device=dev), depths[sel]]),
        anc,
    )
