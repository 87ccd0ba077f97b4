"""The small interface every target backend gives the decoding engine.

A target holds one sequence's KV cache. `run` appends T pending tokens (a prompt, one token, or a
draft tree with its ancestor mask and per-node depths) and returns their logits and the captured
features; `commit` keeps some pending entries (the accepted path) and drops the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..capture import CaptureSpec
from ..errors import GenerationError
from ..observe import trace


@dataclass(frozen=True)
class TargetInfo:
    """What the rest of eaglekit needs to know about any target, whatever the backend."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    fingerprint: str


def attention_mask(length: int, tree_mask: torch.Tensor | None, T: int, device, span: int | None = None,
                   sliding_window: int | None = None, depths: torch.Tensor | None = None) -> torch.Tensor:
    """[1, T, S] bool: every new token sees the committed prefix [0, length) and, among the T new ones,
    the nodes its tree_mask row allows (None = causal). S = span or length + T; slots past length + T
    are never visible."""
    S = span if span is not None else length + T
    mask = torch.zeros(T, S, dtype=torch.bool, device=device)
    mask[:, :length] = True
    block = tree_mask if tree_mask is not None else torch.ones(T, T, dtype=torch.bool, device=device).tril_()
    mask[:, length:length + T] = block
    if sliding_window is not None and length + T > sliding_window:
        qpos = length + (depths if depths is not None else torch.arange(T, device=device))
        kpos = torch.arange(S, device=device)
        kpos[length:length + T] = qpos
        mask &= (qpos[:, None] - kpos[None, :]) < sliding_window
    return mask[None]


class Target(ABC):
    info: TargetInfo
    capture: CaptureSpec | None = None
    device: torch.device
    dtype: torch.dtype

    def set_capture(self, spec: CaptureSpec | None) -> None:
        self.capture = spec.validate(self.info.num_layers) if spec is not None else None

    # --- sequence state ------------------------------------------------------------------------
    @abstractmethod
    def reset(self, max_len: int) -> None: ...

    @property
    @abstractmethod
    def length(self) -> int: ...

    @abstractmethod
    def _run(self, ids: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor | None):
        """-> logits [T, V] (float32), features [T, C*H] or None when no capture is set."""

    @abstractmethod
    def commit(self, keep: torch.Tensor | None = None) -> None:
        """Keep the pending entries `keep` (indices into the last run's tokens, root first); None = all."""

    def run(self, ids: torch.Tensor, depths: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None):
        T = ids.numel()
        if self.length + T > self.max_len:
            raise GenerationError(
                f"the sequence needs {self.length + T} cache slots but the cache holds {self.max_len}",
                fix="shorten the prompt or lower --max-new-tokens", code="E301")
        if depths is None:
            depths = torch.arange(T, device=ids.device)
        logits, feats = self._run(ids, depths, tree_mask)
        if feats is not None and trace.ENABLED:
            trace.record("target.capture", feats, layers=list(self.capture.after_layers),
                         hidden=self.info.hidden_size, tokens=T)
        return logits, feats

    def prefill(self, ids: torch.Tensor):
        out = self.run(ids)
        self.commit(None)
        return out

    # --- batched, cacheless forward for feature extraction ---------------------------------------
    @abstractmethod
    def features(self, ids: torch.Tensor, pad_mask: torch.Tensor | None = None):
        """ids [B, T] -> (final normed hidden [B, T, H], captured features [B, T, C*H])."""

    @abstractmethod
    def lm_head_weight(self) -> torch.Tensor: ...

    @abstractmethod
    def embed_weight(self) -> torch.Tensor: ...

    max_len: int = 0
