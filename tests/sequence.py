"""A target's one sequence driven directly, for tests that check a model's arithmetic against transformers or against
itself: a prompt, a verify of pending tokens, a plain step, a kept path. Our decoders run them through their row
interface (`Target.forward_rows`, what the engine calls) on their own cache seen as one row, the view a batch of one
takes (models.layers.own_row) without its reset; a target whose rows are its sequence (the transformers adapter, a
SequenceTarget) through its own `_forward`."""

import torch

from eaglekit.capture import CaptureSpec
from eaglekit.kernels.compiling import prompt_calls
from eaglekit.models.base import SequenceTarget, check_finite


def _row(target):
    """Our decoder's own cache as a one-row batch (its committed length a view of the cache's); None for a
    SequenceTarget."""
    if isinstance(target, SequenceTarget):
        return None
    from eaglekit.models.deepseek import DeepSeekTarget
    from eaglekit.models.layers import RowKV
    from eaglekit.models.mla import RowLatent

    assert target.cache is not None, "reset the target first"
    return (RowLatent.over if isinstance(target, DeepSeekTarget) else RowKV.over)(target.cache)


@torch.inference_mode()
def verify(
    target, ids: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor, capture: CaptureSpec | None = None
):
    """T pending tokens at slots [length, length + T), each seeing the committed prefix and what its row of
    `tree_mask` allows -> (logits [T, V] float32, features or None). Nothing is committed."""
    kv = _row(target)
    if kv is None:
        logits, feats = target._forward(ids, depths, tree_mask, capture)
        target._trace(feats, ids.numel(), capture)
        return logits, feats
    logits, feats = target.forward_rows(kv, ids[None], depths[None], tree_mask[None], target.span, capture)
    return logits[0], (feats[0] if feats is not None else None)


def _advance(target, n: int) -> None:
    """Commit the n tokens just written (a prompt, a plain step's token)."""
    if isinstance(target, SequenceTarget):
        target._advance(n)
    else:
        target.cache.length += n


@torch.inference_mode()
def keep(target, path: torch.Tensor, n: torch.Tensor, in_place: bool = False) -> None:
    """Commit the pending tokens path[:n] (root first, padded) and drop the rest; `in_place`: path[:n] is 0 .. n - 1
    (a chain's accepted path), committed where it lies, as the engine commits a chain."""
    kv = _row(target)
    if kv is None:
        target.keep(path, n, in_place)
    elif in_place:
        kv.length += n
    else:
        kv.keep(path[None], n.view(1))


def length(target) -> int:
    """Committed tokens (a host read)."""
    return target.length if isinstance(target, SequenceTarget) else int(target.cache.length)


@torch.inference_mode()
def prefill(target, ids: torch.Tensor, capture: CaptureSpec | None = None):
    """The prompt `ids` [T] committed after what the sequence holds -> (logits [T, V], features or None); the features
    checked finite as the engine checks a prompt's."""
    T = ids.numel()
    assert T <= target.span, f"the prompt needs {T} cache slots but the cache holds {target.span}"
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril_()
    with prompt_calls():  # a prompt's length changes from call to call: no compiled graph per length
        logits, feats = verify(target, ids, torch.arange(T, device=ids.device), causal, capture)
    _advance(target, T)
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
    with torch.inference_mode():
        _advance(target, 1)  # the one pending token is already in place: commit it without a KV copy
    return logits[0]
