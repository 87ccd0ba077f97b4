"""A request's sampling parameters give finite arithmetic, whatever their value: a temperature too small for float32
is greedy by definition (MIN_TEMPERATURE, docs/serving.md), a top_p too small for it keeps the most likely token."""

import math

import pytest
import torch

from eaglekit.decoding.sampling import MIN_TEMPERATURE, SamplingParams, probs, sample
from eaglekit.errors import GenerationError


@pytest.mark.parametrize("t", [1e-300, 5e-324, 1e-38, 1e-30, MIN_TEMPERATURE / 2])
def test_tiny_temperature_is_greedy(t):
    sp = SamplingParams(t)
    assert sp.greedy and sp.temperature == 0.0


def test_temperature_at_the_bound_samples_finitely():
    sp = SamplingParams(MIN_TEMPERATURE)
    assert not sp.greedy
    logits = torch.tensor([[30.0, 29.9, -1e4, 0.0]])
    p = probs(logits, sp)
    assert torch.isfinite(p).all() and math.isclose(float(p.sum()), 1.0, rel_tol=1e-5)
    assert int(sample(p, torch.Generator().manual_seed(0))) == 0


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, 1e-45, 1e-9])
def test_tiny_top_p_keeps_the_most_likely_token(top_p):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    p = probs(logits, SamplingParams(1.0, top_p=top_p))
    assert torch.isfinite(p).all()
    assert torch.equal(p.argmax(-1), logits.argmax(-1)) and torch.equal(p.max(-1).values, torch.ones(3))
    assert torch.equal(sample(p, torch.Generator().manual_seed(0)), logits.argmax(-1))  # (one token holds all weight)


def test_normal_top_p_unchanged():
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(2))
    p = torch.softmax(logits.float() / 0.7, -1)
    sp_, idx = p.sort(-1, descending=True)
    keep = (sp_.cumsum(-1) - sp_) < 0.9
    ref = torch.zeros_like(p).scatter(-1, idx, sp_ * keep)
    ref = ref / ref.sum(-1, keepdim=True)
    assert torch.allclose(probs(logits, SamplingParams(0.7, top_p=0.9)), ref)


@pytest.mark.parametrize("kw", [dict(temperature=float("inf")), dict(temperature=float("nan")),
                                dict(temperature=-1e-300), dict(top_p=0.0), dict(top_p=float("nan"))])
def test_still_refused(kw):
    with pytest.raises(GenerationError) as e:
        SamplingParams(**{"temperature": 1.0, **kw})
    assert e.value.code == "E302"


def test_a_draw_never_takes_a_zero_weight_token(monkeypatch):
    """The inverse-CDF draw: a uniform that rounds up to the total takes the last weighted token, and weights summing to
    no positive number are refused, as torch.multinomial refused them."""
    w = torch.tensor([[0.25, 0.75, 0.0, 0.0], [0.0, 0.3, 0.0, 0.7]])
    for u, want in ((0.0, [0, 1]), (0.2499, [0, 1]), (0.25, [1, 1]), (1 - 2**-53, [1, 3])):
        monkeypatch.setattr(torch, "rand", lambda *a, u=u, **k: torch.full(a[0], u, dtype=torch.float64))
        assert sample(w, None).tolist() == want, u
    monkeypatch.undo()
    for bad in (torch.zeros(1, 4), torch.tensor([[0.5, float("nan"), 0.5, 0.0]])):
        with pytest.raises(RuntimeError, match="no positive number"):
            sample(bad, torch.Generator().manual_seed(0))
