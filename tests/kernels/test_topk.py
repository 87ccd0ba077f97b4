"""The draft tree's top-k kernels (eaglekit.kernels.topk) in Triton's interpreter on the CPU, against torch's
softmax + top-k: the same ids in the same order, probabilities within a few ulps, ties to the smaller id, -inf logits
and short chunks handled."""

import pytest
import torch
from helpers import use_triton_interpreter

use_triton_interpreter()  # before triton is imported

from eaglekit.kernels import topk  # noqa: E402

pytestmark = pytest.mark.skipif(not topk.HAVE_TRITON, reason="needs triton")


@pytest.mark.parametrize("rows,V,k", [((), 32000, 4), ((3,), 5000, 1), ((2, 4), 4100, 8), ((5,), 300, 3)])
def test_kernel_top_k_is_torchs(rows, V, k):
    g = torch.Generator().manual_seed(V + k)
    logits = torch.randn(*rows, V, generator=g) * 4
    p, i = topk.kernel_top_probs(logits, k)
    want_p, want_i = torch.softmax(logits, -1).topk(k, dim=-1)
    assert p.shape == want_p.shape and i.dtype == torch.int64
    assert torch.equal(i, want_i)
    assert torch.allclose(p, want_p, rtol=1e-5, atol=1e-12)


def test_bf16_logits_give_what_their_float32_copy_gives():
    """The tree hands the picks a draft step's logits unwidened (Draft.step widen=False): both paths widen them
    exactly first, so the same ids and the same probabilities, bit for bit."""
    logits = (torch.randn(4, 5000, generator=torch.Generator().manual_seed(3)) * 4).bfloat16()
    for pick in (topk.kernel_top_probs, topk.torch_top_probs):
        (p16, i16), (p32, i32) = pick(logits, 4), pick(logits.float(), 4)
        assert torch.equal(i16, i32) and torch.equal(p16, p32) and p16.dtype == torch.float32


def test_ties_go_to_the_smaller_id_and_minus_inf_is_never_picked_over_a_logit():
    V = 4500  # three chunks, the last one short
    logits = torch.full((2, V), float("-inf"))
    logits[0, [7, 2100, 4400, 9]] = torch.tensor([1.0, 3.0, 3.0, 1.0])  # ties within a chunk and across chunks
    logits[1, :] = 0.5  # every logit tied
    p, i = topk.kernel_top_probs(logits, 4)
    assert i[0].tolist() == [2100, 4400, 7, 9]
    assert i[1].tolist() == [0, 1, 2, 3]
    want = torch.softmax(logits, -1).gather(1, i)
    assert torch.allclose(p, want, rtol=1e-5)
    assert len(set(i[1].tolist())) == 4


def test_a_pick_wider_than_the_row_of_finite_logits_gives_zero_probabilities_not_nan():
    logits = torch.full((1, 3000), float("-inf"))
    logits[0, 5] = 2.0
    p, i = topk.kernel_top_probs(logits, 3)
    assert i[0, 0] == 5 and p[0, 0] == 1.0
    assert torch.all(p[0, 1:] == 0) and torch.all((i >= 0) & (i < 3000))


def test_top_probs_uses_torch_off_the_gpu():
    logits = torch.randn(2, 100)
    p, i = topk.top_probs(logits, 5)
    want_p, want_i = torch.softmax(logits, -1).topk(5, dim=-1)
    assert torch.equal(i, want_i) and torch.equal(p, want_p)


def test_two_stage_argmax_equals_torch_argmax_with_ties_and_nan():
    """topk.argmax (the engine's greedy pick) is torch.argmax: the first of equal maxima, a NaN taken as the largest,
    over widths that split in chunks and widths that do not, and batched rows."""
    from eaglekit.kernels.topk import argmax

    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        V = [8192, 128256, 32000, 1000, 4097][seed % 5]
        x = torch.randint(-4, 4, (3, V), generator=g).float()  # few values: many ties
        if seed % 3 == 0:
            x[seed % 3, torch.randint(0, V, (2,), generator=g)] = float("nan")
        for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            y = x.to(dev)
            assert torch.equal(argmax(y), y.argmax(-1)), (seed, dev)
            assert torch.equal(argmax(y[1]), y[1].argmax(-1)), (seed, dev)


@pytest.mark.parametrize("n,k", [(16, 4), (68, 7), (100, 47), (5, 5), (1, 1)])
def test_small_topk_is_topk_ties_by_index(n, k):
    """The tree's small top-k by pairwise comparison: torch's values always; its indices where nothing ties, the
    lower index first where values tie; and the chosen indices in increasing order for the selection."""
    g = torch.Generator().manual_seed(n * 100 + k)
    for t in range(100):
        v = torch.rand(n, generator=g)
        if t % 2:
            v = (v * 3).round() / 3  # many exact ties
        vals, idx = topk.small_topk(v, k)
        ref = v.topk(k)
        assert torch.equal(vals, ref.values) and torch.equal(v[idx], vals)
        order = sorted(range(n), key=lambda i: (-float(v[i]), i))[:k]
        assert idx.tolist() == order
        assert topk.small_top_sorted(v, k).tolist() == sorted(order)
