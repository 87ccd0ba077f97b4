"""Regeneration: our decoders continue a batch of prompts through the engine with no draft (prompts prefilled
together, sampled rows drawing together from one seeded generator), the transformers adapter through its generate
over left-padded prompts; a batch of prompts of different lengths gives each prompt its own continuation."""

import pytest
import torch
from scipy.stats import chisquare

from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.sampling import SamplingParams, probs
from eaglekit.models import load_target
from eaglekit.train import regen
from eaglekit.train.regen import cut_at_eos, generate_batch, left_pad


def test_left_pad_and_cut_at_eos():
    ids, pad = left_pad([[5, 6, 7], [8]], "cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and pad.tolist() == [0, 2]
    assert cut_at_eos([[4, 2, 9, 2], [4, 5]], (2,)) == [[4, 2], [4, 5]]


@pytest.fixture(params=["alone", "together"])
def prefill(request, monkeypatch):
    """Regeneration's prefills as a CPU runs them (one forward a prompt) and as a GPU does (prompts together, here
    in forwards of at most 24 tokens: several per batch)."""
    if request.param == "together":
        monkeypatch.setattr(regen, "prefill_tokens", lambda device: 24)
    return request.param


def test_batched_greedy_equals_each_prompt_alone_on_both_backends(model_dirs, prefill):
    """In float64, where the products' rounding beside other rows cannot reach an argmax: padding, masks and each
    row's last token are right."""
    prompts = [[3 + (i * 11 + j * 5) % 90 for j in range(3 + 2 * i)] for i in range(4)]
    ours = load_target(model_dirs["llama"], backend="ours", dtype=torch.float64)
    eos = ours.info.eos_token_ids
    alone = [Decoder(ours).generate(p, 12).token_ids for p in prompts]  # stops at EOS too
    assert generate_batch(ours, prompts, 12, SamplingParams(), 0, eos) == alone
    hf = load_target(model_dirs["llama"], backend="hf", dtype=torch.float64)
    assert generate_batch(hf, prompts, 12, SamplingParams(), 0, eos) == alone


def test_sampled_batch_is_reproducible_by_its_seed(model_dirs):
    prompts = [[3 + (i * 7 + j * 3) % 90 for j in range(2 + 3 * i)] for i in range(3)]
    ours = load_target(model_dirs["llama"], backend="ours")
    sp = SamplingParams(temperature=1.0, top_k=20)
    got = generate_batch(ours, prompts, 10, sp, 40, ())
    assert generate_batch(ours, prompts, 10, sp, 40, ()) == got
    assert generate_batch(ours, prompts, 10, sp, 41, ()) != got
    assert len(set(map(tuple, got))) == 3 and all(len(g) == 10 for g in got)


def _p_value(tokens: list[int], p: torch.Tensor) -> float:
    counts = torch.bincount(torch.as_tensor(tokens), minlength=p.numel()).double()
    assert counts[p == 0].sum() == 0, "a token outside top-k / top-p was drawn"
    exp = p.double() * len(tokens)
    keep = exp >= 5  # rare cells folded into the largest, so the chi-square approximation holds
    obs, ex = counts[keep].clone(), exp[keep].clone()
    obs[ex.argmax()] += counts[~keep].sum()
    ex[ex.argmax()] += exp[~keep].sum()
    return float(chisquare(obs.numpy(), (ex * obs.sum() / ex.sum()).numpy()).pvalue)


@pytest.mark.parametrize("sp", [SamplingParams(0.2), SamplingParams(0.25, top_k=12, top_p=0.9)])
def test_rows_drawing_together_follow_the_targets_distribution(model_dirs, sp, prefill):
    """One prompt in 2,000 rows: their first tokens (drawn at the prefills: together where the prompts prefill
    together) and their second tokens after the most frequent first one (drawn together in a plain step) against
    the target's distributions."""
    ours = load_target(model_dirs["llama"], backend="ours")
    prompt, n = [5, 17, 33, 2], 2000
    out = generate_batch(ours, [prompt] * n, 2, sp, 3, ())
    p1 = probs(_last_logits(ours, prompt), sp)
    assert _p_value([o[0] for o in out], p1) > 1e-3
    first = max(set(o[0] for o in out), key=[o[0] for o in out].count)
    seconds = [o[1] for o in out if o[0] == first]
    assert len(seconds) > 150
    assert _p_value(seconds, probs(_last_logits(ours, prompt + [first]), sp)) > 1e-3


def _last_logits(target, ids: list[int]) -> torch.Tensor:
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine

    engine = BatchEngine(target, None, EngineOptions(max_batch=1))
    kv = target.row_cache(1, len(ids) + 1)
    t = torch.as_tensor(ids)[None]
    causal = torch.ones(1, len(ids), len(ids), dtype=torch.bool).tril_()
    logits, _ = target.forward_rows(kv, t, torch.arange(len(ids))[None], causal, len(ids), None, last=True)
    del engine
    return logits[0, 0]
