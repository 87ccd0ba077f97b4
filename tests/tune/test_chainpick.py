"""eaglekit.tune.chainpick: one teacher-forced pass predicts what every chain length accepts, cycle by cycle, on
the target's own text; the cycle times are pooled along a line; the pick is the fastest prediction."""

import json
from typing import ClassVar

import pytest
import torch

from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.demo import demo_paths
from eaglekit.pair import load_pair
from eaglekit.tokenizer import encode, load_tokenizer, read_prompts
from eaglekit.tune import chainpick


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
    # cycles (in target steps) that make chain 3 the fastest for accept lengths rising with n: the pick follows them
    monkeypatch.setattr(chainpick, "cycle_ratios",
                        lambda t, d, p, chains, clock, until: ({n: [1.2 if n == 3 else 2.0] for n in chains}, [0.01]))
    monkeypatch.setattr(chainpick, "line_fit", lambda s: {n: v[0] for n, v in s.items()})
    # the pick's clock stands still: the model walks every slice whatever this machine's speed (on a loaded one the
    # budget ran out after the first half-slice: model_prompts 2); how the budget cuts the walk is the FakeClock tests'
    monkeypatch.setattr(chainpick.Progress, "elapsed", property(lambda self: 0.0))
    shape, info = chainpick.pick_chain(tgt, drf, prompts[:3], 24)
    assert (shape.steps, shape.topk, shape.draft_tokens) == (3, 1, 4) and info["by"] == "model"
    assert info["chain"] == 3 and info["why"].startswith("chain 3:") and info["model_prompts"] == 3
    rows = {r["steps"]: r for r in info["candidates"]}
    assert list(rows) == list(chainpick.CHAINS)
    assert all(rows[a]["accept_length"] <= rows[b]["accept_length"] for a, b in ((2, 3), (3, 4), (4, 5), (5, 6)))
    assert rows[3]["speedup"] == pytest.approx(rows[3]["accept_length"] / 1.2, rel=1e-3) == info["speedup"]
    assert rows[3]["tokens_per_s"] == pytest.approx(rows[3]["accept_length"] / 0.012, rel=1e-3)
    assert info["baseline_tokens_per_s"] == 100.0


def test_spread_slices_stand_for_the_whole_set():
    slices = chainpick.spread(list(range(30)), 8)
    assert sorted(x for s in slices for x in s) == list(range(30))  # every prompt once
    assert slices[0] == [0, 4, 8, 12, 16, 20, 24, 28] and all(len(s) <= 8 for s in slices)
    assert chainpick.spread([1, 2], 8) == [[1, 2]]


class FakeClock:
    """A Progress whose time advances only when the fakes below say so (no wall clock in the tests)."""

    def __init__(self):
        self.elapsed, self.said = 0.0, []

    def say(self, what):
        self.said.append(what)


def test_the_model_stops_at_its_share_of_the_budget(monkeypatch):
    import eaglekit.draft
    import eaglekit.train.regen

    clock = FakeClock()

    def texts(target, part, n, eos):
        clock.elapsed += 3.0  # each slice costs 3 s
        return [p + [7] * n for p in part]

    monkeypatch.setattr(eaglekit.train.regen, "greedy_texts", texts)
    monkeypatch.setattr(eaglekit.draft, "check_pair", lambda d, t: None)
    monkeypatch.setattr(chainpick, "accepted_runs", lambda t, d, xs, c, s: [torch.full((len(x),), 2) for x in xs])

    class T:
        class info:
            eos_token_ids = ()

    prompts = [[1, 2, 3]] * 32
    _, used = chainpick.model_accept_lengths(T, None, prompts, 8, (2, 4), clock, until_s=0.0)
    assert used == 4  # half a slice at least, however tight the budget
    clock.elapsed = 0.0
    _, used = chainpick.model_accept_lengths(T, None, prompts, 8, (2, 4), clock, until_s=7.0)
    assert used == 8  # the first slice's two halves, 3 s each; a third would end at 9 s, past the 7 s share
    clock.elapsed = 0.0
    _, used = chainpick.model_accept_lengths(T, None, prompts, 8, (2, 4), clock, until_s=13.0)
    assert used == 24  # halves, then whole slices of 8
    assert any("accept lengths" in s for s in clock.said)


class FakeDecoder:
    """Generations whose time is (a baseline step or a chain's cycle, in units) x the machine's slowness, which
    changes under the run: the cost the ratios must see through."""

    calls: ClassVar[list] = []
    slowness: ClassVar[list] = [1.0]

    def __init__(self, target, draft, shape, profile=False):
        self.n = shape.steps

    def generate(self, prompt, tokens, baseline=False):
        from eaglekit.observe.metrics import GenerationMetrics

        FakeDecoder.calls.append(None if baseline else self.n)
        s = FakeDecoder.slowness[len(FakeDecoder.calls) % len(FakeDecoder.slowness)]
        if baseline:
            m = GenerationMetrics(new_tokens=tokens, elapsed_s=(tokens - 1) * 0.010 * s + 0.5)
        else:
            m = GenerationMetrics(new_tokens=tokens, accepted=[1] * 4, elapsed_s=4 * 0.010 * (1 + 0.1 * self.n) * s
                                  + 0.5)
        m.phases = {"prefill": 0.5}
        clock.elapsed += 0.1
        return type("R", (), {"metrics": m})()


clock = FakeClock()


def test_cycles_are_timed_interleaved_as_ratios_to_the_step(monkeypatch):
    """Each round times the target's step and every chain, in an order that rotates; a machine that slows down
    threefold every other generation leaves the medians of the ratios where the quiet machine puts them."""
    monkeypatch.setattr(chainpick, "Decoder", FakeDecoder)
    FakeDecoder.calls = []
    FakeDecoder.slowness = [1.0, 3.0, 1.0, 1.0, 3.0, 1.0, 1.0]  # (a period prime to the round's 6 generations)
    clock.elapsed = 0.0
    ratios, steps = chainpick.cycle_ratios(None, None, [[1, 2]], (2, 4, 6), clock, until_s=0.0)
    assert len(steps) == 1  # past the budget after the warm-up: one round
    FakeDecoder.calls, clock.elapsed = [], 0.0
    ratios, steps = chainpick.cycle_ratios(None, None, [[1, 2]], (2, 4, 6), clock, until_s=0.95)
    assert len(steps) == chainpick.MIN_ROUNDS  # within the budget, though the next round would end past it
    timed = FakeDecoder.calls[4:]  # after the warm-up (the step, then each chain once)
    assert timed[:4] == [None, 2, 4, 6] and timed[4:8] == [2, 4, 6, None]  # the order rotates round by round
    FakeDecoder.calls, clock.elapsed = [], 0.0
    ratios, steps = chainpick.cycle_ratios(None, None, [[1, 2]], (2, 4, 6), clock, until_s=12.0)
    assert 2 < len(steps) < chainpick.MAX_ROUNDS  # rounds until the budget is spent
    for n in (2, 4, 6):
        assert sorted(ratios[n])[len(ratios[n]) // 2] == pytest.approx(1 + 0.1 * n, rel=0.01)


def test_threads_are_chosen_by_the_target_step(monkeypatch):
    monkeypatch.setattr(chainpick, "Decoder", FakeDecoder)
    before = torch.get_num_threads()
    try:
        # one thread ten times faster (two threads waiting on each other on a loaded machine): one thread
        monkeypatch.setattr(FakeDecoder, "slowness", [1.0])
        real = torch.set_num_threads
        monkeypatch.setattr(chainpick.torch, "set_num_threads", lambda c: setattr(FakeDecoder, "slowness",
                                                                                  [10.0 if c == 2 else 1.0]))
        got = chainpick.pick_threads(None, None, [1, 2], (2, 1))
        assert got["threads"] == 1 and got["step_ms"]["2"] == pytest.approx(10 * got["step_ms"]["1"])
        # as fast, or a little faster (noise): the default stays
        monkeypatch.setattr(chainpick.torch, "set_num_threads", lambda c: setattr(FakeDecoder, "slowness",
                                                                                  [1.0 if c == 2 else 0.95]))
        assert chainpick.pick_threads(None, None, [1, 2], (2, 1))["threads"] == 2
    finally:
        real(before)


def test_the_cache_keeps_a_pick_per_key_under_the_users_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fields = {"processor": "X", "threads": 2, "pair": "abc"}
    assert chainpick.cache_file() == tmp_path / "eaglekit" / "chain_pick.json"
    assert chainpick.cached_pick(fields) is None
    picked = {"chain": 4, "seconds": 12.0, "speedup": 1.8}
    assert chainpick.remember_pick(fields, picked) == chainpick.cache_file()
    got = chainpick.cached_pick(fields)
    assert got["chain"] == 4 and got["speedup"] == 1.8 and got["picked_at"]
    assert chainpick.cached_pick({**fields, "threads": 1}) is None  # another key: picked anew
    chainpick.remember_pick({**fields, "threads": 1}, {**picked, "chain": 2})
    assert chainpick.cached_pick(fields)["chain"] == 4 and chainpick.cached_pick({**fields, "threads": 1})["chain"] == 2
    assert not list((tmp_path / "eaglekit").glob(".*tmp"))  # written atomically: no temporary left
    chainpick.cache_file().write_text("{not json")  # a damaged file: no pick, and the next pick rewrites it
    assert chainpick.cached_pick(fields) is None
    chainpick.remember_pick(fields, picked)
    assert chainpick.cached_pick(fields)["chain"] == 4
    chainpick.cache_file().write_text(json.dumps({"entries": {chainpick.cache_key(fields): {"picked": {"chain": 99}}}}))
    assert chainpick.cached_pick(fields) is None  # a chain the pick never offers
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "eaglekit" / "chain_pick.json"))  # a file: cannot be written
    assert chainpick.remember_pick(fields, picked) is None
