"""A target's one sequence driven directly, for tests that check a model's arithmetic against transformers or against
itself: a prompt, a verify of pending tokens, a plain step. The product decodes through the row interface
(`Target.forward_rows`) only; these calls reach the same forward (`Target._forward`) on the target's own cache."""

import torch

from eaglekit.capture import CaptureSpec
from eaglekit.kernels.compiling import prompt_calls
from eaglekit.models.base import check_finite


@torch.inference_mode()
def verify(
    target, ids: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, capture: CaptureSpec | None = None
):
    """T pending tokens at slots [length, length + T), each seeing the committed prefix and what its row of
    `tree_mask` allows -> (logits [T, V] float32, features or None). Nothing is committed."""
    logits, feats = target._forward(ids, depths, tree_mask, capture)
    target._trace(feats, ids.numel(), capture)
    return logits, feats


@torch.inference_mode()
def prefill(target, ids: torch.Tensor, capture: CaptureSpec | None = None):
    """The prompt `ids` [T] committed after what the sequence holds -> (logits [T, V], features or None); the features
    checked finite as the engine checks a prompt's."""
    T = ids.numel()
    assert T <= target.span, f"the prompt needs {T} cache slots but the cache holds {target.span}"
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril_()
    with prompt_calls():  # a prompt's length changes from call to call: no compiled graph per length
        logits, feats = target._forward(ids, torch.arange(T, device=ids.device), causal, capture)
    target._advance(T)
    target._trace(feats, T, capture)
    if feats is not None:
        check_finite(feats, capture, target.info.hidden_size)
    return logits, feats


def step(target, token: torch.Tensor, rows: int = 1) -> torch.Tensor:
    """One plain decode step -> logits [V]. With rows > 1 the token is row 0 of a chain of `rows` pending tokens (the
    others copies of it, written past it and never committed): the forward has the shapes of a verify of a
    `rows`-token chain, so a kernel that rounds differently for 1 row and for k rows gives the token the arithmetic
    the speculative verify gives it."""
    dev = token.device
    block = torch.ones(rows, rows, dtype=torch.bool, device=dev).tril_()
    logits, _ = verify(target, token.view(1).expand(rows).contiguous(), torch.arange(rows, device=dev), block)
    target._advance(1)  # the one pending token is already in place: commit it without a KV copy
    return logits[0]
