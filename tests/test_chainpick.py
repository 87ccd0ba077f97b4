"""eaglekit.observe.chainpick: one teacher-forced pass predicts what every chain length accepts, cycle by cycle, on
the target's own text; the cycle times are pooled along a line; the pick is the fastest prediction."""

import pytest
import torch

from eaglekit.decoding.engine import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.demo import demo_paths
from eaglekit.observe import chainpick
from eaglekit.pair import load_pair
from eaglekit.tokenizer import encode, load_tokenizer, read_prompts


@pytest.fixture(scope="module")
def demo():
    t, d, p = demo_paths()
    tgt, drf = load_pair(t, d, "ours", "cpu", "float32")
    tok = load_tokenizer(t)
    return tgt, drf, [encode(tok, x) for x in read_prompts(p)][:6]


def _walk_cycles(run, start, n):
    """The per-cycle accepted counts accept_lengths walks (for comparing with a decoder's metrics)."""
    q, out = start, []
    while q < len(run) - 1:
        a = min(int(run[q - 1]), n, len(run) - 2 - q)
        out.append(a)
        q += a + 1
    return out


# the shortest and the longest chain (the one the runs are computed for) in the default tier; 2 and 4 (6 s each) walk
# the same runs in the slow one
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow), 6])
def test_the_model_gives_each_chain_the_accepted_counts_the_decoder_gets(demo, n):
    """The model's claim, checked against real decoding: along the decoder's own output, the walk over the
    teacher-forced runs (computed once, for the longest chain) accepts what the decoder accepted, cycle by cycle."""
    tgt, drf, prompts = demo
    dec = Decoder(tgt, drf, TreeShape.make(n, 1))
    texts, got = [], []
    for p in prompts:
        r = dec.generate(p, 40)
        texts.append(p + r.token_ids)
        got.append(r.metrics.accepted)
    runs = chainpick.accepted_runs(tgt, drf, texts, dec.capture, 6)
    walked = [_walk_cycles(r, len(p), n) for r, p in zip(runs, prompts)]
    # the last cycle may end inside the decoder's token budget rather than the text: compare the full cycles
    same = sum(w[:-1] == g[:len(w) - 1] for w, g in zip(walked, got))
    assert same >= len(prompts) - 1, (walked, got)  # a near-tie may round otherwise in a batched pass: one prompt
    predicted = chainpick.accept_lengths(runs, [len(p) for p in prompts], [n])[n]
    measured = sum(len(g) + sum(g) for g in got) / sum(len(g) for g in got)
    assert abs(predicted - measured) / measured < 0.05
    assert sum(map(sum, got)) > 0  # a trained draft: something was accepted


def test_accept_lengths_walk_each_text_from_its_first_generated_token():
    runs = [torch.tensor([0, 0, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 0]), torch.zeros(10, dtype=torch.long)]
    starts = [3, 4]
    got = chainpick.accept_lengths(runs, starts, [1, 3, 6])
    # text 0: tokens 4..14 come after the start (11), its runs are 6 until the end; text 1: 5..9 (5), nothing accepted
    assert _walk_cycles(runs[0], 3, 3) == [3, 3, 2]  # the last cycle stops at the text's last token
    assert _walk_cycles(runs[0], 3, 6) == [6, 3]
    assert _walk_cycles(runs[0], 3, 1) == [1, 1, 1, 1, 1, 0]
    assert _walk_cycles(runs[1], 4, 3) == [0] * 5
    # every chain emits the same 16 tokens, in fewer cycles the longer it is
    assert got == pytest.approx({1: 16 / (6 + 5), 3: 16 / (3 + 5), 6: 16 / (2 + 5)})


def test_line_fit_pools_the_samples_and_keeps_a_real_line():
    line = {n: [0.010 + 0.001 * n] * 3 for n in (2, 3, 4, 5, 6)}
    assert chainpick.line_fit(line) == pytest.approx({n: 0.010 + 0.001 * n for n in line})
    noisy = {n: [0.010 + 0.001 * n + e for e in (-0.002, 0.0, 0.002)] for n in (2, 3, 4, 5, 6)}
    noisy[2] = [0.012 + 0.004, 0.012, 0.012]  # one slow sample (the machine did something else) moves a median less
    fit = chainpick.line_fit(noisy)
    assert all(fit[a] < fit[b] for a, b in ((2, 3), (3, 4), (4, 5), (5, 6)))
    assert chainpick.line_fit({4: [0.02, 0.03, 0.01]}) == {4: 0.02}  # one chain: its median
    wild = {2: [0.030], 3: [0.001], 6: [0.0001]}  # a line through these crosses zero before chain 6: the medians
    assert chainpick.line_fit(wild) == {2: 0.030, 3: 0.001, 6: 0.0001}


def test_pick_chain_takes_the_fastest_prediction(demo, monkeypatch):
    tgt, drf, prompts = demo
    # cycle times that make chain 3 the fastest for accept lengths rising with n: the pick follows the numbers
    monkeypatch.setattr(chainpick, "cycle_seconds",
                        lambda t, d, p, chains: {n: [0.010 if n == 3 else 0.030] for n in chains})
    monkeypatch.setattr(chainpick, "line_fit", lambda s: {n: v[0] for n, v in s.items()})
    shape, info = chainpick.pick_chain(tgt, drf, prompts[:3], 24)
    assert (shape.steps, shape.topk, shape.draft_tokens) == (3, 1, 4) and info["by"] == "model"
    rows = {r["steps"]: r for r in info["candidates"]}
    assert list(rows) == list(chainpick.CHAINS)
    assert all(rows[a]["accept_length"] <= rows[b]["accept_length"] for a, b in ((2, 3), (3, 4), (4, 5), (5, 6)))
    assert rows[3]["tokens_per_s"] == pytest.approx(rows[3]["accept_length"] / 0.010, rel=1e-3)
