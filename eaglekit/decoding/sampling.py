"""Sampling parameters and the target distribution they define.

The same `probs` function serves the baseline and the speculative path, so "lossless" has one
meaning: every emitted token follows exactly the distribution the baseline samples from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import GenerationError, InputError

# a seed is a signed 64-bit integer, the range the CLI's --seed and the server's `seed` take (torch.Generator reads
# it as a 64-bit word; outside that range it fails with an OverflowError deep inside the first sampled step)
SEED_RANGE = (-(2**63), 2**63 - 1)

# A temperature below this is greedy (vLLM's rule, the same constant). Why: logits / t is computed in float32, and
# a t in (0, ~1e-38] rounds to 0 (logits / 0 = inf, softmax NaN) while a t a little larger turns a logit gap into
# inf; at t < 1e-5 the distribution is the argmax for any logit gap above ~1e-4 anyway. docs/serving.md says so.
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None

    def __post_init__(self):
        t, p, k = self.temperature, self.top_p, self.top_k
        if not isinstance(t, (int, float)) or t != t or t < 0 or t == float("inf"):
            raise GenerationError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}",
                fix="e.g. --temperature 0.7",
                code="E302",
            )
        if not isinstance(p, (int, float)) or p != p or not (0 < p <= 1):
            raise GenerationError(f"top_p must lie in (0, 1], got {p!r}", fix="e.g. --top-p 0.9", code="E302")
        if not isinstance(k, int) or k < 0:
            raise GenerationError(
                f"top_k must be an integer >= 0 (0 = off), got {k!r}", fix="e.g. --top-k 50", code="E302"
            )
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not SEED_RANGE[0] <= s <= SEED_RANGE[1]):
            raise InputError(
                f"seed must be a signed 64-bit integer (in [-2**63, 2**63 - 1]) or None, got {s!r}",
                fix="e.g. seed=1234 (None draws a fresh one)",
                code="E125",
            )
        if 0 < t < MIN_TEMPERATURE:  # greedy by definition (MIN_TEMPERATURE): every reader sees temperature 0
            object.__setattr__(self, "temperature", 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """`probs(logits, self)`: a target's batched generation (models/, a layer below) samples through the
        parameters it is given, so the one definition of the distribution is this module's."""
        return probs(logits, self)


def probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> the sampling distribution (temperature, then top-k, then top-p), float32."""
    x = logits.float() / sp.temperature
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = x.topk(sp.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    p = torch.softmax(x, dim=-1)
    if sp.top_p < 1.0:
        sp_, idx = p.sort(dim=-1, descending=True)
        before = sp_.cumsum(-1) - sp_  # mass of strictly more likely tokens
        drop_sorted = before >= sp.top_p  # keep the smallest prefix whose mass reaches top_p
        # ... which holds the most likely token whatever top_p is: a top_p below float32's smallest value (1e-300)
        # rounds to 0, and `0 >= 0` would drop every token (p / 0 = NaN)
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        p = p.masked_fill(drop, 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


def make_generator(sp: SamplingParams, device) -> torch.Generator | None:
    """A generator seeded by sp.seed, or from the system's entropy without one (Generator.seed: torch's global
    generator is left as it was); None for greedy decoding."""
    if sp.greedy:
        return None
    g = torch.Generator(device=device)
    if sp.seed is not None:
        g.manual_seed(sp.seed)
    else:
        g.seed()
    return g


def sample(p: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One token per row of `p` [..., V] (probabilities, or any non-negative weights: the accept rule's residuals),
    drawn by inverting the cumulative distribution at one uniform draw a row from `gen`: token i is taken with
    probability p[i] / sum(p), never a zero-weight one (the first cumulative sum strictly above the draw).

    Hand-written instead of torch.multinomial, whose one-row draw on a 2-core CPU took 778 us over a 49,152-token
    vocabulary against 46 here (8,192 tokens: 138 against 15): a sampled regeneration of 256 rows spent 74% of its
    time in it (docs/performance.md#d59). Weights that sum to no positive number (NaN logits) are refused as
    multinomial refused them.

    On a GPU torch.multinomial stays: a draw is a few device kernels with no host read (110 us of host time a call on
    an H100, so rows that can draw together do: BatchEngine's shared draws, docs/performance.md#d61)."""
    if p.is_cuda:
        return torch.multinomial(p, 1, generator=gen).squeeze(-1)
    c = p.float().cumsum(-1)
    total = c[..., -1:]
    if not bool((total > 0).all()):  # (NaN compares False)
        raise RuntimeError("sample: the weights sum to no positive number (NaN or all zero)")
    u = torch.rand(total.shape, generator=gen, device=c.device, dtype=torch.float64)
    idx = torch.searchsorted(c, (u * total).to(c.dtype), right=True)
    # a draw that rounds up to the total finds no sum above it: it takes the token where the sums reach the total
    # (the last one with weight), not the zero-weight ones after it
    return torch.minimum(idx, (c < total).sum(-1, keepdim=True)).squeeze(-1)
