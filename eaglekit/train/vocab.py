"""Draft vocabulary: the draft_vocab_size most frequent target tokens under the loss mask.

d2t[i] = hot[i] - i (offsets: target_id = i + d2t[i]); t2d marks the target ids in the draft vocab.
When the data holds fewer distinct tokens than draft_vocab_size, the rest is padded with the lowest
unused ids so that the mapping stays a valid, distinct set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


@dataclass
class VocabMap:
    hot: torch.Tensor  # [Vd] target ids, ascending
    coverage: float  # share of loss-masked token occurrences the draft vocab covers

    @property
    def d2t(self) -> torch.Tensor:
        return self.hot - torch.arange(self.hot.numel())

    def t2d(self, vocab_size: int) -> torch.Tensor:
        t = torch.zeros(vocab_size, dtype=torch.bool)
        t[self.hot] = True
        return t


def count_tokens(examples, vocab_size: int) -> torch.Tensor:
    """Occurrences of each target id among loss-masked tokens."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for e in examples:
        ids = torch.tensor(e.input_ids)
        m = torch.tensor(e.loss_mask, dtype=torch.bool)
        counts += torch.bincount(ids[m], minlength=vocab_size)[:vocab_size]
    return counts


def build_vocab_map(examples, vocab_size: int, draft_vocab_size: int) -> VocabMap:
    return vocab_map_from_counts(count_tokens(examples, vocab_size), draft_vocab_size)


def vocab_map_from_counts(counts: torch.Tensor, draft_vocab_size: int) -> VocabMap:
    vocab_size = counts.numel()
    if draft_vocab_size > vocab_size:
        raise InputError(
            f"draft_vocab_size {draft_vocab_size} is larger than the target vocabulary {vocab_size}",
            fix=f"use --draft-vocab-size {vocab_size} or less",
            code="E206",
        )
    order = torch.argsort(counts, descending=True, stable=True)  # ties: lower id first
    nonzero = int((counts > 0).sum())
    chosen = order[: min(draft_vocab_size, nonzero)]
    if chosen.numel() < draft_vocab_size:
        used = torch.zeros(vocab_size, dtype=torch.bool)
        used[chosen] = True
        pad = (~used).nonzero().squeeze(1)[: draft_vocab_size - chosen.numel()]
        chosen = torch.cat([chosen, pad])
    total = int(counts.sum())
    cov = float(counts[chosen].sum()) / total if total else 0.0
    return VocabMap(chosen.sort().values, cov)
