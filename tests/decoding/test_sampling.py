"""Sampling losslessness: the speculative sampler's tokens follow the target's distribution exactly.

A target with an 8-token vocabulary; for each configuration, 750 seeded generations of three
tokens; chi-square tests of the first token, the (first, second) pair and the third token against the
exact distributions computed from the target. A deliberately wrong acceptance rule must fail the same
test (the test has power). Everything is seeded: the outcome is deterministic, not flaky.
"""


import pytest
import sequence
import torch
from helpers import make_hf_model
from scipy.stats import chisquare

import eaglekit.decoding.phases as engine_mod  # (the one engine's phases: where the accept rule is called)
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.sampling import SamplingParams, probs, sample
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import new_draft
from eaglekit.models import load_target

V = 8
PROMPT = [3, 5, 1, 6]


@pytest.fixture(scope="module")
def small_target(tmp_path_factory):
    d = tmp_path_factory.mktemp("v8")
    # two layers: the rule under test does not care how deep the target is, and 8 cost twice the time (the wrong
    # rule's chi-square p is ~1e-21 with two: the test keeps its power)
    make_hf_model(d, "llama", seed=7, vocab=V, hidden=32, layers=2, heads=4, kv_heads=2, inter=48, std=1.5,
                  bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return load_target(d, backend="ours", dtype="float64")


def _exact(target, sp):
    """P(x1), P(x1, x2), P(x3) by enumeration."""
    def dist(seq):
        target.reset(16)
        lg, _ = sequence.prefill(target, torch.tensor(seq))
        return probs(lg[-1], sp).double()

    p1 = dist(PROMPT)
    p12 = torch.zeros(V, V, dtype=torch.float64)
    p3 = torch.zeros(V, dtype=torch.float64)
    for a in range(V):
        if p1[a] == 0:
            continue
        p2 = dist(PROMPT + [a])
        p12[a] = p1[a] * p2
        for b in range(V):
            if p12[a, b] > 0:
                p3 += p12[a, b] * dist(PROMPT + [a, b])
    return p1, p12.reshape(-1), p3


def _chi2_p(counts, p, n):
    exp = p * n
    keep = exp >= 5  # pool rare cells so the chi-square approximation holds
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)]).double()
    ex = torch.cat([exp[keep], exp[~keep].sum().view(1)])
    if ex[-1] < 5:  # fold the pooled cell into the largest one
        obs, ex = obs[:-1].clone(), ex[:-1].clone()
        obs[ex.argmax()] += counts[~keep].sum()
        ex[ex.argmax()] += exp[~keep].sum()
    ex = ex * obs.sum() / ex.sum()
    return float(chisquare(obs.numpy(), ex.numpy()).pvalue)


def _run(target, draft, shape, sp, n):
    dec = Decoder(target, draft, shape)
    c1, c12, c3 = torch.zeros(V), torch.zeros(V * V), torch.zeros(V)
    accepted = 0
    for seed in range(n):
        r = dec.generate(PROMPT, 3, SamplingParams(sp.temperature, sp.top_p, sp.top_k, seed=seed), eos_ids=())
        a, b, c = r.token_ids
        c1[a] += 1
        c12[a * V + b] += 1
        c3[c] += 1
        accepted += sum(r.metrics.accepted)
    return c1, c12, c3, accepted


# generations per configuration (2000 took 30 s a test). With 750 the right rule's lowest p-value is 0.078 (the top-p
# tree's third token; 0.42 with 1000, 0.19 with 2000). The wrong rule is caught with fewer, N_WRONG: its first+second
# p is ~1e-21 with 500 (~1e-32 with 750, ~1e-85 with 2000), and what 500 samples catch, 750 catch too
N, N_WRONG = 750, 500

CONFIGS = [
    ("tree t=1", TreeShape(2, 3, 5), SamplingParams(1.0)),
    ("chain t=0.7 top-k 5", TreeShape(3, 1, 4), SamplingParams(0.7, top_k=5)),
    ("tree t=1.3 top-p 0.85", TreeShape(2, 2, 4), SamplingParams(1.3, top_p=0.85)),
]


# the plain t=1 tree in the slow tier (14 s; a tree and a chain with filtered distributions stay in the default one)
@pytest.mark.parametrize("name,shape,sp", [pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] == "tree t=1"
                                                        else []) for c in CONFIGS])
def test_sampled_tokens_follow_target_distribution(small_target, name, shape, sp):
    draft = new_draft(small_target, seed=1, dtype=torch.float64)
    # a draft that proposes the target's likely tokens makes acceptance (the path under test) frequent
    with torch.no_grad():
        draft.lm_head.weight.copy_(small_target.net.lm_head.weight)
    n = N
    c1, c12, c3, accepted = _run(small_target, draft, shape, sp, n)
    assert accepted > n // 10, "too few accepted drafts: the acceptance path would go untested"
    p1, p12, p3 = _exact(small_target, sp)
    for what, counts, p in (("first", c1, p1), ("first+second", c12, p12), ("third", c3, p3)):
        pv = _chi2_p(counts, p, n)
        assert pv > 1e-3, f"{name}: {what} token(s) deviate from the target distribution (chi-square p={pv:.2e})"
    # tokens outside top-k / top-p are never emitted
    assert torch.all(c1[p1 == 0] == 0) and torch.all(c3[p3 == 0] == 0)


def _wrong_rule(tree, logits, size, sp, gen):
    """The classic mistake: after the children are rejected, sample from p *without* removing them."""
    p_all = probs(logits, sp)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    node, path = 0, [0]
    while True:
        kids = [i for i in range(1, len(tokens)) if parents[i] == node]
        nxt = None
        for c in kids:
            if float(torch.rand((), generator=gen)) < float(p_all[node][tokens[c]]):
                nxt = c
                break
        if nxt is None:
            pad = torch.tensor(path + [0] * (size - len(path)))
            return pad, torch.tensor(len(path)), sample(p_all[node], gen)
        node = nxt
        path.append(node)


def test_chi_square_catches_a_wrong_rule(small_target, monkeypatch):
    draft = new_draft(small_target, seed=1, dtype=torch.float64)
    with torch.no_grad():
        draft.lm_head.weight.copy_(small_target.net.lm_head.weight)
    monkeypatch.setattr(engine_mod, "accept_sampling", _wrong_rule)
    sp = SamplingParams(1.0)
    n = N_WRONG
    _, c12, _, _ = _run(small_target, draft, TreeShape(2, 3, 5), sp, n)
    _, p12, _ = _exact(small_target, sp)
    assert _chi2_p(c12, p12, n) < 1e-3


def test_greedy_and_sampling_agree_at_tiny_temperature(small_target):
    """Near-zero temperature concentrates p on the argmax: sampling then reproduces greedy output."""
    draft = new_draft(small_target, seed=2, dtype=torch.float64)
    dec = Decoder(small_target, draft, TreeShape(3, 2, 6))
    g = dec.generate(PROMPT, 12, eos_ids=()).token_ids
    for seed in range(5):
        s = dec.generate(PROMPT, 12, SamplingParams(1e-6, seed=seed), eos_ids=()).token_ids
        assert s == g


@pytest.mark.parametrize("children", [(2, 5, 1), (2, 2, 5), (6, 3)], ids=["three", "repeated token", "low mass"])
def test_the_rule_emits_the_roots_distribution_whatever_its_children(children):
    """accept_sampling directly, on a root whose children (leaves) carry most of its mass: the first token it emits
    (an accepted child's, else the residual's) follows the root's p exactly. Each later child is tried on what its
    earlier siblings left (tried on the whole of p instead, (2, 5, 1)'s token 5 comes out at 0.18 where p has 0.3:
    chi-square p ~1e-159 here), and a repeated token counts once (its second copy has p 0: counted twice, p 0.0)."""
    from eaglekit.decoding.accept import accept_sampling
    from eaglekit.decoding.tree import Tree

    D = len(children) + 1
    p_root = torch.tensor([0.02, 0.03, 0.4, 0.05, 0.1, 0.3, 0.05, 0.05], dtype=torch.float64)
    logits = torch.randn(D, V, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logits[0] = p_root.log()
    tree = Tree(tokens=torch.tensor([7, *children]), parents=torch.zeros(D, dtype=torch.long),
                depths=torch.tensor([0] + [1] * (D - 1)),
                mask=torch.eye(D, dtype=torch.bool) | (torch.arange(D) == 0)[None, :])
    gen = torch.Generator().manual_seed(1)
    n = 6000
    counts = torch.zeros(V)
    for _ in range(n):
        path, k, bonus = accept_sampling(tree, logits, 2, SamplingParams(1.0), gen)
        counts[int(tree.tokens[path[1]]) if int(k) == 2 else int(bonus)] += 1
    assert _chi2_p(counts, p_root, n) > 1e-3


def test_children_holding_all_of_p_never_leave_an_empty_residual(monkeypatch):
    """Where the children hold all of p, the last one's total (p's sum less its earlier siblings') can exceed its p by
    rounding alone (float32 probabilities of these three logits: by 3e-8), so a draw just under 1 rejects every
    child: the rule then draws from the parent's p (a ~1e-16 event), never from an all-zero residual that no draw
    can take (that raised in `sample`)."""
    from eaglekit.decoding.accept import accept_sampling
    from eaglekit.decoding.tree import Tree

    logits = torch.full((4, V), -1e9)
    logits[0, :3] = torch.tensor([1.6283140182495117, -6.656337738037109, 0.7769535779953003])
    p = probs(logits[0], SamplingParams(1.0))
    assert p.sum() - (p[0] + p[1]) > p[2]  # (the rounding this test needs)
    tree = Tree(tokens=torch.tensor([7, 0, 1, 2]), parents=torch.zeros(4, dtype=torch.long),
                depths=torch.tensor([0, 1, 1, 1]),
                mask=torch.eye(4, dtype=torch.bool) | (torch.arange(4) == 0)[None, :])
    rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full_like(rand(*a, **k), 1 - 2**-24))
    path, n, bonus = accept_sampling(tree, logits, 2, SamplingParams(1.0), None)
    assert int(n) == 1 and int(bonus) in (0, 1, 2)
