"""The parts every training loop here shares, written once: the LR schedule, fitting the step count to a time
budget, the atomic checkpoint, the held-out split, and the data-parallel wrapper.

Used by the draft trainer (trainer.py) and the target pretrainer (pretrain.py).
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import torch

from ..io import atomic_write_bytes


def warmup_steps(warmup: float, total: int) -> int:
    """A fraction of the run (< 1) or a step count."""
    return int(warmup * total) if warmup < 1 else int(warmup)


def lr_at(step: int, total: int, lr: float, warmup: float, min_lr_ratio: float) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at `total`."""
    warm = warmup_steps(warmup, total)
    if step < warm:
        return lr * (step + 1) / warm
    frac = (step - warm) / max(total - warm, 1)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


class StepBudget:
    """Fit the step count to a time budget: time steps `first`..`last` (the first steps carry one-off costs:
    allocator, kernel selection), cap the total at what the rest of the budget holds, then fit it once more at
    `again` (a tenth of that total, at least 4 x `last`) from the steps since `last`, so the cosine schedule always
    completes. The second fit is there because the early steps are not a fair sample: with length-grouped batches
    each new padded length meets the allocator and the kernels for the first time (an H100 timed 561 ms a step over
    steps 10-30 and then ran 160-200 ms a step: a 650 s budget fitted 1,133 steps that took ~250 s). Only for a run
    that starts at step 0 (a resumed run keeps its fitted total)."""

    def __init__(self, budget_s: float | None, start: int, cuda: bool, first: int = 10, last: int = 30):
        self.budget_s = budget_s if start == 0 else None
        self.cuda, self.first, self.last = cuda, first, last
        self.again: int | None = None  # the step of the second fit, set by the first
        self.t0 = time.time()
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.per_step: float | None = None

    def check(self, step: int, total: int, cap: int) -> int | None:
        """Call before each step; returns the new total at steps `last` and `again`, else None. `cap`: the most
        steps the run asked for."""
        if not self.budget_s or step not in (self.first, self.last, self.again):
            return None
        if self.cuda:
            torch.cuda.synchronize()
        now = time.time()
        if step == self.first:
            self.t_first = now
            return None
        if step == self.last:
            assert self.t_first is not None  # step `first` comes before step `last`: the run starts at step 0
            self.t_last = now
            self.per_step = (now - self.t_first) / (self.last - self.first)
            fitted = self._fit(step, now, cap)
            self.again = max(fitted // 10, 4 * self.last) if fitted > 4 * self.last else None
            return fitted
        assert self.t_last is not None  # `again` is set at step `last`
        self.again = None
        self.per_step = (now - self.t_last) / (step - self.last)
        return self._fit(step, now, cap)

    def _fit(self, step: int, now: float, cap: int) -> int:
        assert self.budget_s is not None and self.per_step is not None
        return max(min(cap, step + int((self.budget_s - (now - self.t0)) / self.per_step)), step + 1)


def save_state(path: Path, state: dict) -> None:
    """torch.save to memory, then one atomic write: a killed run (or a full disk) leaves the previous checkpoint."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_state(path: Path, device) -> dict | None:
    return torch.load(path, map_location=device, weights_only=False) if Path(path).is_file() else None


def heldout_split(n: int, share: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): a seeded permutation, `share` of it held out (at least one sample when
    share > 0 and there are two or more). The one split of every training path (online, offline, the recipe)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    k = max(int(n * share), 1) if share > 0 and n > 1 else 0
    return order[k:], order[:k]


def length_grouped(order: list[int], lengths, batch: int, g: torch.Generator, window: int = 64) -> list[int]:
    """`order` rearranged so that each consecutive `batch` of it holds samples of similar length: windows of
    `window` batches of the shuffled order are sorted by length and cut into batches, and all batches are shuffled.
    A batch is padded to its longest sample, so a few long conversations mixed into random batches of short answers
    would multiply the tokens computed (a 2,048-token conversation pads 31 answers of ~300 tokens 7-fold); grouped,
    each sample is still seen once an epoch and the batches' order stays random."""
    if batch <= 1:
        return list(order)
    w = batch * window
    batches: list[list[int]] = []
    for s in range(0, len(order), w):
        chunk = sorted(order[s : s + w], key=lambda i: -lengths[i])
        batches += [chunk[k : k + batch] for k in range(0, len(chunk), batch)]
    full = [b for b in batches if len(b) == batch]  # a short batch goes last, as an epoch's remainder did before
    rest = [i for b in batches if len(b) < batch for i in b]
    return [i for k in torch.randperm(len(full), generator=g).tolist() for i in full[k]] + rest


class Indexed:
    """Train on `train_idx` of a source while evaluation batches may address the rest. With `lengths` (every
    sample's token count) and `batch` (the global batch), each batch of the epoch order is length-grouped."""

    def __init__(self, src, train_idx, lengths=None, batch: int = 0):
        self.src, self.idx, self.n = src, list(train_idx), len(train_idx)
        self.lengths, self.group = lengths, batch

    def epoch_order(self, g):
        order = [self.idx[i] for i in torch.randperm(self.n, generator=g).tolist()]
        return length_grouped(order, self.lengths, self.group, g) if self.lengths is not None else order

    def batch(self, indices, device):
        return self.src.batch(indices, device)


class TTTModule(torch.nn.Module):
    """The TTT unroll as one module call, so DistributedDataParallel sees a forward and all-reduces (averages)
    the gradients in backward, bucketed and overlapped, instead of a hand-written all-reduce."""

    def __init__(self, draft):
        super().__init__()
        self.draft = draft

    def forward(self, batch, p, in_dv, length: int, decay: float):
        from .ttt import ttt_forward

        return ttt_forward(self.draft, batch, p, in_dv, length, decay)


def data_parallel(draft, world: int, device):
    """The TTT module, under DDP when there is more than one process (gloo on CPU, NCCL on GPU)."""
    m = TTTModule(draft)
    if world <= 1:
        return m
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [torch.device(device).index] if str(device).startswith("cuda") else None
    return DDP(m, device_ids=ids, broadcast_buffers=False)
