"""How far the engine speculates (eaglekit.decoding.adaptive.SpecPolicy, BatchEngine's policy): the draft length
(0: a plain step) follows expected tokens per second, a draft that stops paying is switched off within a bounded
number of cycles and probed back, a shorter draft wins where its cycle is cheap enough, every length decodes the
target's output, and rows keep their draft state through plain steps (the catch-up).

Costs are injected (the policy's figures), never read from the clock: the tests do not depend on the machine."""

import pytest
import torch

from eaglekit.capture import CaptureSpec
from eaglekit.decoding.accept import accept_synthetic_rows, synthetic_rate
from eaglekit.decoding.adaptive import LONGEST_PROBE, MAX_PROBE, MIN_PROBE, PROBE_SHARE, SpecPolicy
from eaglekit.decoding.config import EngineOptions
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.engine import BatchEngine, Request
from eaglekit.decoding.tree import Tree, TreeShape
from eaglekit.draft import new_draft
from eaglekit.errors import EaglekitError
from eaglekit.models import load_target


class FixedCosts(SpecPolicy):
    """The engine's policy with the wall times replaced: a cycle costs `spec` (a number, or a function of the draft
    length), a plain step `plain`."""

    def __init__(self, positions, spec=1.5, plain=1.0, lengths=()):
        super().__init__(positions, lengths)
        self.c_spec, self.c_plain = spec, plain

    def observe_cycle(self, rows, seconds, accepted, length=None):
        j = self.positions if length is None else length
        super().observe_cycle(rows, self.c_spec(j) if callable(self.c_spec) else self.c_spec, accepted, length)

    def observe_plain(self, rows, seconds):
        super().observe_plain(rows, self.c_plain)


def test_expected_tokens_follow_the_per_position_rates():
    p = SpecPolicy(3)
    p.reached, p.accepted = [10, 8, 4], [8, 4, 1]  # rates 0.8, 0.5, 0.25
    assert p.expected_tokens() == pytest.approx(1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.25)
    assert p.expected_tokens(1) == pytest.approx(1.8) and p.expected_tokens(2) == pytest.approx(2.2)


def test_choice_times_each_size_once_then_compares_tokens_per_second():
    p = FixedCosts(3, spec=1.5, plain=1.0)
    assert p.choose(4)[0] == 3  # untimed: a cycle first
    p.observe_cycle(4, 0, [3, 3, 3, 3])
    assert p.choose(4)[0] == 0  # then a plain step, to time it
    p.observe_plain(4, 0)
    assert p.expected_tokens() > 1.5 and p.choose(4)[0] == 3  # good acceptance: speculate
    for _ in range(10):
        p.observe_cycle(4, 0, [0, 0, 0, 0])  # the draft stops being right
    assert p.expected_tokens() < 1.5 and p.choose(4)[0] == 0
    assert p.choose(8)[0] == 3  # another padded size has its own figures


@pytest.mark.parametrize("rows,bound", [(1, 5), (4, 2)])
def test_costs_timed_at_warmup_switch_an_untrained_draft_off_within_a_bound(rows, bound):
    """With the costs seeded at warm-up (the GPU engine's recording: no timing cycles), a draft that never hits is
    off after at most `bound` cycles when its lengths cost 1.1-1.3 plain steps (docs/serving.md quotes the bound),
    and no step before that is spent timing."""
    cost = {3: 1.3, 2: 1.2, 1: 1.1}
    p = FixedCosts(3, spec=cost.get, plain=1.0, lengths=(1, 2, 3))
    p.seed_costs(rows, 1.0, cost)
    cycles = 0
    while True:
        j, why = p.choose(rows)
        assert "timing" not in why
        if j == 0:
            break
        cycles += 1
        p.observe_cycle(rows, 0, [0] * rows, j)
    assert 1 <= cycles <= bound


def test_the_summary_reports_the_running_figures_not_the_prior():
    """/server_info's spec_policy shows the rates and gains the policy decides by, not its prior (0.6 at every
    position)."""
    p = FixedCosts(3, spec=1.5, plain=1.0)
    p.observe_cycle(4, 0, [3, 0, 1, 2])
    p.observe_plain(4, 0)
    s = p.summary()
    assert s["rates"] == [round(r, 4) for r in p.rates()] != [0.6, 0.6, 0.6]
    assert s["sizes"]["4"]["gain"] == round(p.gain(4), 4) and s["sizes"]["4"]["cycle_ms"]["3"] == 1500.0


def test_a_shorter_draft_wins_where_its_cycle_is_cheap_enough():
    """Each length is timed once at a size, then the best expected tokens/s runs: with a cycle of 1 + 0.3 j steps and
    every position accepted half the time, one draft token beats three (1.5 / 1.3 > 1.875 / 1.9) and plain steps
    (1 / 1); the longest length still runs as a probe every `probe` steps, and a plain step every `plain_probe`
    steps, so their figures stay fresh; both lose here, so both intervals back off."""
    p = FixedCosts(3, spec=lambda j: 1.0 + 0.3 * j, lengths=(1, 2))
    p.reached, p.accepted = [1e6] * 3, [5e5] * 3  # rates 0.5, held by their weight
    seen = []
    for _ in range(200):
        j, _ = p.choose(2)
        seen.append(j)
        if j:
            p.observe_cycle(2, 0, [min(j, 1)] * 2, j)
        else:
            p.observe_plain(2, 0)
    assert seen[:4] == [3, 0, 2, 1]  # the longest first, a plain step, then the shorter lengths once each
    assert seen[-40:].count(1) >= 36
    plain = [i for i, j in enumerate(seen) if j == 0]  # the first timing step, then the plain probes
    gaps = [b - a for a, b in zip(plain, plain[1:])]
    assert 1 <= len(gaps) <= 3 and gaps[0] > MIN_PROBE and gaps == sorted(gaps) and p.plain_probe > 2 * MIN_PROBE
    # the probe: MIN_PROBE steps after the first full cycle; it loses, so the next comes twice as late
    assert set(seen[3:MIN_PROBE + 1]) == {1} and seen[MIN_PROBE + 1] == 3 and p.probe > 2 * MIN_PROBE
    assert p.best(2)[0] == 1 and p.gain(2) == pytest.approx(1.5 / 1.3, rel=0.01)
    # a cheaper long cycle makes the long draft the best again
    q = FixedCosts(3, spec=lambda j: 1.0 + 0.05 * j, lengths=(1, 2))
    q.reached, q.accepted = [1e6] * 3, [5e5] * 3
    for _ in range(20):
        j, _ = q.choose(2)
        q.observe_cycle(2, 0, [1, 1], j) if j else q.observe_plain(2, 0)
    assert q.choose(2)[0] == 3


def test_one_slow_timing_does_not_decide_the_next_steps():
    """Wall time is work plus interference, never less than the work: a first cycle that caught a set-up (10x) is
    corrected by the next faster one at once, while a slower sample moves the cost only by COST_MEAN."""
    p = SpecPolicy(3)
    p.reached, p.accepted = [1e6] * 3, [8e5] * 3  # rates 0.8: E = 2.95 tokens a cycle
    p.observe_cycle(1, 15.0, [3])  # the first cycle at this size, with a set-up inside
    p.observe_plain(1, 1.0)
    assert p.choose(1)[0] == 0  # 2.95 / 15 < 1 / 1
    p.observe_cycle(1, 1.5, [3])  # a probe at the real cost
    assert p.spec[1, 3] == 1.5 and p.choose(1)[0] == 3
    p.observe_plain(1, 3.0)  # a slow plain step (another process): the cost rises by COST_MEAN only
    assert p.plain[1] == pytest.approx(1.0 + 0.3 * 2.0)


@pytest.mark.parametrize("seed", range(12))
def test_a_burst_of_load_does_not_hold_a_losing_draft_on(seed):
    """Every step costs `load` times its quiet cost while a burst lasts (steps 200-400; load 1 + 2 Exp(1), a fresh draw
    per step), then the machine is quiet again. A draft that is never right must be off after the burst: the plain
    figure inflated during it is measured again by a plain probe (without one, the first quiet cycle took the quiet
    time at once and beat the stale plain figure on every later step: 7 of 20 such seeds ran cycles to the end)."""
    import random

    rng = random.Random(seed)
    cost = {0: 1.0, 1: 1.4, 2: 1.5, 3: 1.6}  # quiet seconds of a plain step and of each length's cycle
    p = SpecPolicy(3, (1, 2, 3))
    p.seed_costs(1, cost[0], {j: cost[j] for j in (1, 2, 3)})
    seen = []
    for step in range(3000):
        load = 1.0 + (2 * rng.expovariate(1.0) if 200 <= step < 400 else 0.0)
        j, _ = p.choose(1)
        seen.append(j)
        if j:
            p.observe_cycle(1, load * cost[j], [0], j)
        else:
            p.observe_plain(1, load * cost[0])
    after = seen[600:]
    assert sum(1 for j in after if j) <= len(after) // MAX_PROBE + 1  # the full-length probes alone


def test_an_inflated_plain_figure_does_not_turn_on_a_draft_that_gets_nothing_accepted():
    """A cycle costs at least a plain step: one slow plain step (the running figure 1.0 -> ~1.6) makes every timed
    cycle (1.1-1.3) look cheaper than plain decoding, but a draft with no acceptance gains nothing by that, so no
    cycle runs before the full-length probe falls due (before the cap, the length-1 cycle ran at once)."""
    cost = {1: 1.1, 2: 1.2, 3: 1.3}
    p = SpecPolicy(3, (1, 2, 3))
    p.seed_costs(1, 1.0, cost)
    p.reached, p.accepted = [1e3] * 3, [0.0] * 3  # nothing accepted, held by its weight
    assert p.choose(1)[0] == 0
    p.observe_plain(1, 3.0)
    assert p.plain[1] > max(cost.values()) and p.gain(1, 1) == pytest.approx(1.0)  # capped: one token, one step
    seen = [p.choose(1)[0]]
    while p.since_full < p.probe:
        p.observe_plain(1, 1.0)
        seen.append(p.choose(1)[0])
    assert seen[:-1] == [0] * (len(seen) - 1) and seen[-1] == 3  # plain steps, then the probe


def test_probe_interval_backs_off_and_resets():
    p = FixedCosts(3, spec=2.0, plain=1.0)
    p.observe_cycle(1, 0, [0] * 64)
    p.observe_plain(1, 0)
    seen = []
    for _ in range(1200):
        spec, _ = p.choose(1)
        if spec:
            seen.append(p.since_full)
            p.observe_cycle(1, 0, [0])
        else:
            p.observe_plain(1, 0)
    assert seen[:4] == [MIN_PROBE, 2 * MIN_PROBE, 4 * MIN_PROBE, min(8 * MIN_PROBE, MAX_PROBE)]
    assert max(seen) == MAX_PROBE
    spec_run = 0
    for _ in range(600):  # the draft is right again: within a few probes one wins and speculation stays on
        spec, _ = p.choose(1)
        if spec:
            p.observe_cycle(1, 0, [3])
            spec_run += 1
        else:
            p.observe_plain(1, 0)
            spec_run = 0
    assert spec_run > 100 and p.probe == MIN_PROBE


@pytest.mark.parametrize("catch", [0.5, 9.0])
def test_dear_catch_ups_stretch_the_probes_of_a_draft_that_never_pays(catch):
    """A probe pays the draft's catch-up over the plain tokens since the last one. Where that is cheap (half a plain
    step: a CPU) the back-off stops at MAX_PROBE as before; where it is dear (nine plain steps: a launch-bound catch-up
    on a GPU) the interval goes on doubling until a probe costs PROBE_SHARE of the plain steps between probes, up to
    LONGEST_PROBE, and an untrained draft's probes cost about that share of plain decoding."""
    cost = {0: 1.0, 1: 1.6, 2: 1.9, 3: 2.3}
    p = SpecPolicy(3, (1, 2, 3))
    p.seed_costs(1, cost[0], {j: cost[j] for j in (1, 2, 3)})
    full, spent, last = [], 0.0, 0
    for step in range(12000):
        j, _ = p.choose(1)
        if j:
            if last == 0:
                p.observe_catch_up(1, catch)
                spent += catch
            spent += cost[j]
            p.observe_cycle(1, cost[j], [0], j)
            if j == 3:
                full.append(step)
        else:
            spent += cost[0]
            p.observe_plain(1, cost[0])
        last = j
    gaps = [b - a for a, b in zip(full, full[1:])]
    ceiling = p.probe_ceiling(1)
    if catch < 1:
        assert ceiling == MAX_PROBE and max(gaps) <= MAX_PROBE + 1
    else:
        assert ceiling == min(LONGEST_PROBE, int((catch + cost[3] - cost[0]) / (PROBE_SHARE * cost[0])))
        assert max(gaps) > 2 * MAX_PROBE and max(gaps) <= ceiling + 1
        late = [g for g, s in zip(gaps, full[1:]) if s > 6000]  # once backed off: a probe a ceiling's steps
        assert late and min(late) >= ceiling
    assert spent / 12000 < 1 + (0.02 if catch > 1 else 0.03)  # probes' whole cost against plain decoding


def _run(eng, prompts, max_new):
    for i, pr in enumerate(prompts):
        eng.add(Request(f"r{i}", pr, max_new, eos_ids=()))
    out, accepted = {}, []
    while eng.has_work:
        for ev in eng.step():
            out.setdefault(ev.rid, []).extend(ev.token_ids)
            if ev.accepted is not None:
                accepted.append(ev.accepted)
    return out, accepted


@pytest.fixture(scope="module")
def llama(model_dirs):
    return load_target(model_dirs["llama"], backend="ours", dtype="float32")


def test_an_untrained_draft_falls_back_to_plain_decoding_within_a_few_cycles(llama):
    """A random-weight draft on a target whose cycle costs 1.5 steps: after the first cycle at a size and one
    timed plain step, the engine decodes plainly, probing now and then; output is the target's greedy output."""
    draft = new_draft(llama, seed=3, dtype=torch.float32)
    eng = BatchEngine(llama, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=1))
    eng.policy = FixedCosts(3, lengths=tuple(eng.shapes))
    prompt = [1, 5, 9, 14, 3, 7]
    out, _ = _run(eng, [prompt], 120)
    assert out["r0"] == Decoder(llama).generate(prompt, 120, eos_ids=()).token_ids
    st = eng.spec_stats
    # 120 tokens: one timing cycle of the whole chain, one timing step, at most one timing cycle of each shorter
    # length (while the prior still weighs in the rates), then probes at 16, 32, 64 plain steps at most
    by = st["cycles_by_length"]
    assert st["spec_cycles"] <= 9 and st["plain_steps"] >= 100 and by[1] <= 1 and by[2] <= 1 and by[3] <= 7
    assert st["switches_to_plain"] >= 1 and st["switches_to_spec"] == st["switches_to_plain"] - 1 + (
        1 if eng.policy.speculating else 0)
    # each probe after plain steps began with the draft's catch-up, timed for the probes' ceiling
    assert st["switches_to_spec"] >= 1 and eng.policy.catch_up[1] > 0


def test_rows_admitted_while_the_draft_is_off_skip_its_prefill(llama):
    """While the policy has the draft off, a new row is admitted without the draft's prefill (an unpaying draft
    costs it nothing); the running row that keeps its draft is what the probes measure. Outputs stay the target's."""
    draft = new_draft(llama, seed=3, dtype=torch.float32)
    eng = BatchEngine(llama, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=2))
    eng.policy = FixedCosts(3)
    calls = []
    extend_rows = draft.extend_rows
    draft.extend_rows = lambda *a, **k: calls.append(a[1].shape[1]) or extend_rows(*a, **k)
    first, second = [1, 5, 9, 14, 3, 7], [1, 33, 2, 8, 70, 4, 11]
    eng.add(Request("a", first, 80, eos_ids=()))
    out = {}
    for _ in range(20):
        for ev in eng.step():
            out.setdefault(ev.rid, []).extend(ev.token_ids)
    assert not eng.policy.speculating and eng.rows[0].use_draft  # off, and the sentinel row keeps its draft
    n = len(calls)
    eng.add(Request("b", second, 40, eos_ids=()))
    for ev in eng.step():
        out.setdefault(ev.rid, []).extend(ev.token_ids)
    # admitted without the draft's prefill (an extend over its 7 prompt tokens); the step's cycle (the first at two
    # rows: timing it) extends the sentinel row only
    assert not eng.rows[1].use_draft and len(second) not in calls[n:]
    while eng.has_work:
        for ev in eng.step():
            out.setdefault(ev.rid, []).extend(ev.token_ids)
    assert out["a"] == Decoder(llama).generate(first, 80, eos_ids=()).token_ids
    assert out["b"] == Decoder(llama).generate(second, 40, eos_ids=()).token_ids


def test_a_row_admitted_while_few_rows_draft_takes_its_draft_when_the_draft_pays(llama):
    """Plain steps can win only because few running rows have a draft (rows admitted while the draft was off): the
    draft still pays for a row that has one, so a new row is admitted with its draft; where the draft itself loses,
    it is not. Outputs stay the target's."""
    draft = new_draft(llama, seed=3, dtype=torch.float32)
    first, second = [1, 5, 9, 14, 3, 7], [1, 33, 2, 8, 70, 4, 11]
    for rate, admitted_with_draft in ((0.9, True), (0.05, False)):
        eng = BatchEngine(llama, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=2))
        eng.policy = FixedCosts(3, spec=1.5, plain=1.0)
        eng.add(Request("a", first, 60, eos_ids=()))
        eng.step()
        p = eng.policy
        p.seed_costs(2, 1.0, {3: 1.5})
        p.reached, p.accepted = [1e6] * 3, [rate * 1e6] * 3  # rates held by their weight
        p.length = 0  # the last step was plain (as it is where half the rows draft and the gain sits below 1)
        eng.add(Request("b", second, 30, eos_ids=()))
        out = {}
        for ev in eng.step():
            out.setdefault(ev.rid, []).extend(ev.token_ids)
        assert eng.rows[1].use_draft is admitted_with_draft, rate
        assert p.draft_pays(2) is admitted_with_draft
        while eng.has_work:
            for ev in eng.step():
                out.setdefault(ev.rid, []).extend(ev.token_ids)
        assert out["b"] == Decoder(llama).generate(second, 30, eos_ids=()).token_ids


def test_rows_admitted_together_while_the_draft_loses_keep_one_sentinel(llama):
    """Three requests admitted into an empty batch while the draft loses by the policy's figures: one takes the
    draft's prefill (the sentinel the probes measure), the other two decode without it. Outputs stay the target's."""
    draft = new_draft(llama, seed=3, dtype=torch.float32)
    eng = BatchEngine(llama, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=4))
    eng.policy = p = FixedCosts(3, spec=1.5, plain=1.0)
    p.seed_costs(4, 1.0, {3: 1.5})
    p.reached, p.accepted = [1e6] * 3, [0.05e6] * 3
    prompts = [[1, 5, 9, 14, 3, 7], [1, 33, 2, 8, 70, 4, 11], [2, 6, 6, 1]]
    for i, pr in enumerate(prompts):
        eng.add(Request(f"r{i}", pr, 20, eos_ids=()))
    out = {}
    for ev in eng.step():
        out.setdefault(ev.rid, []).extend(ev.token_ids)
    assert [s.use_draft for s in eng.rows] == [True, False, False]
    while eng.has_work:
        for ev in eng.step():
            out.setdefault(ev.rid, []).extend(ev.token_ids)
    for i, pr in enumerate(prompts):
        assert out[f"r{i}"] == Decoder(llama).generate(pr, 20, eos_ids=()).token_ids


def test_a_row_that_no_probe_can_reach_skips_the_draft_and_the_probes_still_run(llama):
    """One short request at a time while the draft loses: a row that ends before the next probe can fall due is admitted
    without the draft (no prefill of it, no features kept on its plain steps); the first row that a probe can reach
    takes it, so every probe still runs within one request's length of falling due. Outputs stay the target's."""
    draft = new_draft(llama, seed=3, dtype=torch.float32)
    eng = BatchEngine(llama, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=1))
    eng.policy = p = FixedCosts(3, spec=1.5, plain=1.0)
    p.seed_costs(1, 1.0, {3: 1.5})
    p.reached, p.accepted = [1e6] * 3, [0.05e6] * 3  # rates held by their weight: the draft loses
    p.probe = 40
    probes, choose = [], p.choose

    def watched(rows, drafting=1.0):
        j, why = choose(rows, drafting)
        if why.startswith("probe at"):
            probes.append((p.since_full, p.probe))
        return j, why

    p.choose = watched
    prompts = [[1, 5, 9, 14, 3, 7], [1, 33, 2, 8, 70, 4, 11], [2, 6, 6, 1]]
    took, out = [], {}
    for i in range(24):
        pr = prompts[i % 3]
        eng.add(Request(f"r{i}", pr, 12, eos_ids=()))
        eng.admit()
        took.append(eng.rows[0].use_draft)
        while eng.has_work:
            for ev in eng.step():
                out.setdefault(ev.rid, []).extend(ev.token_ids)
    assert took.count(False) >= len(took) // 2 and took.count(True) >= 2
    assert len(probes) >= 2 and all(due <= interval + 12 for due, interval in probes)
    for i in range(3):
        assert out[f"r{i}"] == Decoder(llama).generate(prompts[i], 12, eos_ids=()).token_ids


@pytest.mark.parametrize("recorded", [False, True], ids=["eager", "recorded-layout"])
def test_a_row_no_probe_can_reach_any_more_gives_up_its_draft_and_steps_quietly(llama, recorded, monkeypatch):
    """One long request while the draft loses: it is the probes' sentinel until a probe loses with the next one due
    after its end; then it gives its draft up, and its plain steps neither capture the target's features nor write
    the catch-up window (recorded: the quiet graph replays, eager: the plain step stops capturing). Output stays the
    target's."""
    from test_engine import _eager_graphs

    from eaglekit.decoding import runner
    from eaglekit.decoding.phases import Cycle

    steps = []  # (quiet, capturing) of each plain step

    def note(rows):
        steps.append((getattr(rows, "quiet", False), rows.capturing))

    if recorded:
        def tagged(warmup, record, state):
            graphs = _eager_graphs(warmup, record, state)
            g = graphs.get("plain")
            if g is not None:
                g.replay = lambda fn=g.replay, rows=record["plain"].__self__: note(rows) or fn()
            return graphs

        monkeypatch.setattr(runner, "record_graphs", tagged)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    else:
        plain = Cycle.plain
        monkeypatch.setattr(Cycle, "plain", lambda rows: note(rows) or plain(rows))
    draft = new_draft(llama, seed=3, dtype=torch.float32)
    eng = BatchEngine(llama, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=1, graphs=recorded))
    eng.policy = p = FixedCosts(3, spec=1.5, plain=1.0)
    p.seed_costs(1, 1.0, {3: 1.5})
    p.reached, p.accepted = [1e6] * 3, [0.05e6] * 3  # rates held by their weight: the draft loses
    prompt = [1, 5, 9, 14, 3, 7]
    want = Decoder(llama).generate(prompt, 150, eos_ids=()).token_ids
    steps.clear()  # (the Decoder is a one-row engine: its plain steps ran the patched ones too)
    eng.add(Request("r0", prompt, 150, eos_ids=()))
    out, kept = [], []
    while eng.has_work:
        for ev in eng.step():
            out.extend(ev.token_ids)
        if eng.rows:
            kept.append(eng.rows[0].use_draft)
    assert out == want
    # probes at MIN_PROBE, 2 MIN_PROBE, ... plain steps: once the next is due past the row's end, it lets its draft go
    assert kept[0] and not kept[-1] and kept.index(False) > MIN_PROBE
    assert eng.spec_stats["spec_cycles"] >= 2
    quiet = [q for q, _ in steps]
    assert quiet == sorted(quiet) and quiet.count(recorded) >= 10  # (eager: one Cycle, told per step)
    assert [c for _, c in steps] == sorted((c for _, c in steps), reverse=True) and not steps[-1][1]


class Alternate(SpecPolicy):
    """A policy forced to alternate: `plain` plain steps, then one cycle (the catch-up is exercised each time)."""

    def __init__(self, positions, plain=5):
        super().__init__(positions)
        self.k, self.i = plain, 0

    def choose(self, rows, drafting=1.0):
        self.i += 1
        return (self.positions if self.i % (self.k + 1) == 0 else 0), "forced"


@pytest.mark.parametrize("shape", [(3, 1, 4), (3, 2, 6)])
def test_rows_keep_their_draft_through_plain_steps(llama, shape):
    """The draft's state follows plain steps (the catch-up): an exact draft accepts its whole path in every cycle
    that follows plain steps, exactly as in a run without them; without the catch-up it would not."""
    from test_engine import RowOracle

    eng = BatchEngine(llama, None, EngineOptions(shape=TreeShape(*shape), max_batch=3))
    eng.draft = RowOracle(llama)
    eng.capture = CaptureSpec.default(llama.info.num_layers)
    eng.policy = Alternate(TreeShape(*shape).path_len - 1)
    prompts = [[1, 5, 9, 14], [1, 33, 2, 8, 70, 4], [1, 50]]
    out, accepted = _run(eng, prompts, 60)
    for i, pr in enumerate(prompts):
        assert out[f"r{i}"] == Decoder(llama).generate(pr, 60, eos_ids=()).token_ids
    assert eng.spec_stats["plain_steps"] > 3 * eng.spec_stats["spec_cycles"] > 0
    full = max(accepted)  # what the exact draft reaches in this tree (its top-1 branch may be shorter)
    assert full >= 2
    assert sum(a == full for a in accepted) >= len(accepted) - 3  # every cycle but each row's last

    eng._catch_up = lambda c: None  # the check can fail: without the catch-up the draft falls behind
    eng.policy = Alternate(TreeShape(*shape).path_len - 1)
    out, accepted = _run(eng, prompts, 60)
    assert sum(a == full for a in accepted) < len(accepted) - 3


def test_synthetic_acceptance_reaches_the_asked_accept_length(llama):
    """Benchmark mode: each position of the top-1 branch accepted at the rate that gives the accept length."""
    r = synthetic_rate(3.52, 5)
    assert 1 + sum(r ** i for i in range(1, 6)) == pytest.approx(3.52, abs=1e-9)
    with pytest.raises(EaglekitError):
        synthetic_rate(7.0, 5)
    torch.manual_seed(0)
    B, D = 4000, 6  # a chain of 5 below the root: node i's parent is i - 1
    parents = torch.tensor([0, 0, 1, 2, 3, 4]).expand(B, D)
    depths = torch.arange(D).expand(B, D)
    mask = torch.ones(D, D, dtype=torch.bool).tril().expand(B, D, D)
    tree = Tree(torch.randint(0, 50, (B, D)), parents, depths, mask)
    _, n, _ = accept_synthetic_rows(tree, torch.randn(B, D, 50), 6, r)
    assert float(n.float().mean()) == pytest.approx(3.52, abs=0.08)
    # a tree: only first children are ever on the accepted path
    parents = torch.tensor([0, 0, 0, 1, 1, 2]).expand(B, D)
    depths = torch.tensor([0, 1, 1, 2, 2, 2]).expand(B, D)
    anc = torch.zeros(D, D, dtype=torch.bool)
    for i, p in enumerate([0, 0, 0, 1, 1, 2]):
        anc[i, i] = True
        anc[i] |= anc[p] if i else anc[i]
    tree = Tree(torch.randint(0, 50, (B, D)), parents, depths, anc.expand(B, D, D))
    path, n, _ = accept_synthetic_rows(tree, torch.randn(B, D, 50), 3, 0.9)
    assert set(path[n == 3][:, :3].unique().tolist()) <= {0, 1, 3}


def test_synthetic_acceptance_is_named_and_needs_a_draft(llama):
    with pytest.raises(EaglekitError, match="E317|draft"):
        BatchEngine(llama, None, EngineOptions(shape=TreeShape(3, 1, 4), synthetic_accept_length=2.0))
    draft = new_draft(llama, seed=3, dtype=torch.float32)
    eng = BatchEngine(llama, draft, EngineOptions(shape=TreeShape(5, 1, 6), max_batch=2, synthetic_accept_length=3.52))
    assert eng.synthetic == pytest.approx(synthetic_rate(3.52, 5))
    _, accepted = _run(eng, [[1, 5, 9], [1, 7]], 80)
    assert 1.8 < 1 + sum(accepted) / len(accepted) < 5.0  # far above what a random draft reaches


class RandomLengths(SpecPolicy):
    """A policy that draws each step's draft length (0: plain) at random: every mix of lengths must decode the same."""

    def __init__(self, positions, lengths, seed):
        super().__init__(positions, lengths)
        import random

        self.rng = random.Random(seed)

    def choose(self, rows, drafting=1.0):
        return self.rng.choice((0,) + self.lengths), "drawn"


@pytest.mark.parametrize("shape", [(5, 1, 6), (3, 2, 6)])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_mix_of_draft_lengths_decodes_the_targets_output(llama, shape, seed):
    """Greedy output of rows whose steps draw their draft length at random (the tree, its shallower versions and
    plain steps) equals the target's own greedy output, for a random draft and for an exact one; the exact draft
    accepts each cycle's whole path, whatever its length."""
    from test_engine import RowOracle

    ts = TreeShape(*shape)
    prompts = [[1, 5, 9, 14], [1, 33, 2, 8, 70, 4], [1, 50]]
    want = {f"r{i}": Decoder(llama).generate(pr, 40, eos_ids=()).token_ids for i, pr in enumerate(prompts)}
    for exact in (False, True):
        eng = BatchEngine(llama, None if exact else new_draft(llama, seed=seed, dtype=torch.float32),
                          EngineOptions(shape=ts, max_batch=3))
        if exact:
            eng.draft = RowOracle(llama)
            eng.capture = CaptureSpec.default(llama.info.num_layers)
        eng.policy = RandomLengths(ts.path_len - 1, tuple(eng.shapes), seed)
        for i, pr in enumerate(prompts):
            eng.add(Request(f"r{i}", pr, 40, eos_ids=()))
        out, pairs = {}, []
        while eng.has_work:
            for ev in eng.step():
                out.setdefault(ev.rid, []).extend(ev.token_ids)
                if ev.accepted is not None:
                    pairs.append((ev.accepted, ev.drafted))
        assert out == want
        by = eng.spec_stats["cycles_by_length"]
        assert sum(v > 0 for v in by.values()) >= 2 and eng.spec_stats["plain_steps"] > 0
        assert sum(by.values()) == eng.spec_stats["spec_cycles"]
        assert len({d for _, d in pairs}) >= 2  # rows were offered drafts of several sizes
        if exact and ts.topk == 1:  # a chain of any length: the exact draft's whole chain is accepted
            assert all(a == d for a, d in pairs)
