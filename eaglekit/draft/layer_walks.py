"""A draft's walks over its own layer: a chain's steps and a tree's levels as one function each, which compile()
turns into one graph each on a GPU (inductor fuses the picks, masks and id maps between the layer's kernels, where
an eager walk ran ~10 small kernels a step), and which run eagerly elsewhere.

The draft (eaglekit.draft.model.Eagle3Draft) is the network (draft.network) with its row caches and graphs; this is
the runner of its walks, held by it as `draft.walks`. The functions compiled take the draft (an Eagle3Draft) as their
first argument, as a method takes self (it is not imported here: the draft module imports this one).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..kernels.compiling import span_dynamic
from ..observe import trace


def narrowed(layer, span: int) -> tuple:
    """A cache layer (k, v) [B, Hkv, S_max, hd] narrowed to its first `span` slots (what a walk attends over)."""
    return tuple(t[:, :, :span] for t in layer)


def chain_steps(draft, h, logits_last, m, cols, kv, steps: int, root=None):
    """A chain's walk (Draft.walk_chain) over the layer itself (what compile() compiles whole; the step's
    inference-mode decorator stays outside the graph); kv: the cache narrowed to the span, cols: arange(span). The
    logits stay in the draft's dtype: the same argmax as their float32 copy."""
    pending = draft.takes_pending(1)

    def step(h, ids, slot, mask):  # (a chain node sees every slot below its own: base = its slot, block [[1]])
        h, logits, _ = draft._whole(
            h[None],
            ids[None],
            slot,
            kv,
            slot,
            mask[None],
            False,
            pending=(slot.view(1), draft._one) if pending else None,
        )
        return h[0], logits[0]

    return draft.walk_chain(step, h, logits_last, m, cols, steps, root)


def tree_steps(draft, h_last, logits_last, root, m, cols, kv, frame: tuple, steps: int, n_sel: int):
    """A tree's walk (what compile() compiles whole): walk.walk_tree over the layer
    itself. The frontier's masks are made but, where the attention takes the pending form, never read: inductor
    drops them (the layer reads only their width)."""
    from ..kernels import topk
    from .walk import WalkFns, walk_tree

    K = frame[1].numel()
    pending = draft.takes_pending(max((steps - 1) * K, 1))
    pick = draft.walks.pick

    def step(hidden, ids, pos, slots, mask, anc):
        h, logits, _ = draft._whole(
            hidden[None], ids[None], pos, kv, slots, mask[None], False, pending=(m.view(1), anc) if pending else None
        )
        return h[0], logits[0]

    def top(logits, k):
        if pick is None:
            return topk.torch_top_probs(logits, k)
        p, i = pick(logits.reshape(-1, logits.shape[-1]), k)
        return p.view(*logits.shape[:-1], k), i.view(*logits.shape[:-1], k)

    return walk_tree(WalkFns(step, draft.to_target_ids, top), h_last, logits_last, root, m, cols, frame, steps, n_sel)


def pick_op(logits_last, K: int):
    """A tree's pick: the top-k kernels as a registered op on a GPU (fetched before any trace), None (torch's)
    elsewhere."""
    from ..kernels import topk

    return topk.probs_op() if logits_last.is_cuda and topk.HAVE_TRITON and K <= topk.MAX_K else None


class LayerWalks:
    """The chain and tree walks of one draft over a cache layer: compiled graphs after compile() (None: eager), and
    the tree's pick op of the current walk."""

    def __init__(self) -> None:
        self.chain_graph: Callable[..., Any] | None = None
        self.tree_graph: Callable[..., Any] | None = None
        self.pick: Callable[..., Any] | None = None  # pick_op's, set before each tree walk

    def compile(self, options: dict | None = None) -> None:
        """Both walks through torch.compile for the decode shapes (Eagle3Draft.compile's `options`)."""
        from ..kernels.compiling import compile_decode

        self.chain_graph = compile_decode(chain_steps, options)
        self.tree_graph = compile_decode(tree_steps, options)

    @staticmethod
    def whole(draft) -> bool:
        """Whether a chain or a tree may run as one walk over the layer (compiled or not): tracing off (it records the
        steps' tensors) and no sliding window (its masks need slot positions)."""
        return not trace.ENABLED and draft.config.sliding_window is None

    def compiled(self, draft, graph) -> bool:
        """Whether a compiled walk (chain_graph, tree_graph) serves this call."""
        return graph is not None and self.whole(draft)

    def chain(self, draft, layer, m, span: int, h_last, logits_last, steps: int, root):
        """A chain over one sequence's cache layer (k, v) [1, Hkv, S_max, hd] with m committed entries: the compiled
        graph where there is one, the same walk eagerly elsewhere."""
        cols = torch.arange(span, device=logits_last.device)
        if self.chain_graph is None:
            return chain_steps(draft, h_last.view(1, -1), logits_last, m, cols, narrowed(layer, span), steps, root)
        kv = span_dynamic(cols, layer)  # the span symbolic (cols stands for a mask's last dimension)
        return self.chain_graph(draft, h_last.view(1, -1), logits_last, m, cols, kv, steps, root)

    def tree(self, draft, layer, m, span: int, h_last, logits_last, root, frame: tuple, steps: int, n_sel: int):
        """A tree over one sequence's cache layer with m committed entries (as chain)."""
        self.pick = pick_op(logits_last, frame[1].numel())
        cols = torch.arange(span, device=logits_last.device)
        if self.tree_graph is None:
            return tree_steps(draft, h_last, logits_last, root, m, cols, narrowed(layer, span), frame, steps, n_sel)
        kv = span_dynamic(cols, layer)  # the span symbolic, as in the chain
        return self.tree_graph(draft, h_last, logits_last, root, m, cols, kv, frame, steps, n_sel)
