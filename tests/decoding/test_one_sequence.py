"""The one engine at one row (Decoder on BatchEngine): one-sequence backends (the row interface's defaults over their
own sequence, models.layers.OwnRow) run as a batch of one and are refused more rows; a one-row cache is the backend's
own sequence; a prompt's non-finite features are an error for generate and a draft-less request for serve."""

import pytest
from helpers import NoisyOracleDraft

from eaglekit.decoding import prefill as prefill_mod
from eaglekit.decoding.config import EngineOptions
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.engine import BatchEngine, Request
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import new_draft
from eaglekit.errors import FeatureError, GenerationError
from eaglekit.models import load_target


def test_one_sequence_target_serves_one_row_and_refuses_more(model_dirs):
    """The transformers adapter runs in a one-row engine (its output the target's own greedy continuation, requests
    one after another) and is refused at two rows with E308, naming the fix."""
    hf = load_target(model_dirs["llama"], backend="hf", dtype="float32")
    ours = load_target(model_dirs["llama"], backend="ours", dtype="float32")
    d = new_draft(ours, seed=2)
    eng = BatchEngine(hf, d, EngineOptions(shape=TreeShape(3, 2, 6), max_batch=1, allow_other_target=True))
    assert eng.one_sequence and not eng.graphs
    for i, p in enumerate(([1, 5, 9, 4], [1, 7, 3], [1, 2, 8, 8, 6, 30])):
        eng.add(Request(f"r{i}", p, 14, eos_ids=()))
        got = []
        while eng.has_work:
            for ev in eng.step():
                got += ev.token_ids
        assert got == Decoder(ours).generate(p, 14, eos_ids=()).token_ids, i
    assert eng.spec_stats["num_drafts"] > 0
    with pytest.raises(GenerationError, match="does not decode batches") as e:
        BatchEngine(hf, None, EngineOptions(max_batch=2))
    assert e.value.code == "E308"


def test_one_sequence_draft_runs_one_row_and_is_refused_more(model_dirs):
    target = load_target(model_dirs["llama"], backend="ours", dtype="float32")
    prompt = [1, 5, 9, 4, 22]
    dec = Decoder(target)
    dec.capture = new_draft(target).config.capture
    dec.draft = NoisyOracleDraft(target, prompt[0], noise=0.5, seed=0)
    r = dec.generate(prompt, 20, eos_ids=())
    assert r.token_ids == Decoder(target).generate(prompt, 20, eos_ids=()).token_ids
    assert r.metrics.verify_count > 0 and 0 < sum(r.metrics.accepted) < 3 * r.metrics.verify_count
    assert dec.engine().one_sequence
    with pytest.raises(GenerationError, match="one sequence at a time"):
        BatchEngine(target, dec.draft, EngineOptions(max_batch=2, capture=dec.capture, pair_checked=True))


def test_a_one_row_cache_is_the_backends_own_sequence(model_dirs):
    """A one-row engine holds no second target cache: its row is the target's own cache. The draft keeps no cache of its
    own (its rows only): the engine's one-row draft cache is the only one."""
    target = load_target(model_dirs["llama"], backend="ours", dtype="float32")
    draft = new_draft(target, seed=1)
    dec = Decoder(target, draft, TreeShape(3, 1, 4))
    r = dec.generate([1, 5, 9, 4, 22, 7], 11, eos_ids=())
    e = dec.engine()
    assert r.metrics.verify_count > 0
    assert e.state.tk.k.data_ptr() == target.cache.k.data_ptr()
    assert e.state.tk.length.data_ptr() == target.cache.length.data_ptr()
    assert e.state.dk.k.shape[1] == 1 and not hasattr(draft, "cache")


def test_non_finite_features_fail_generate_and_drop_the_draft_in_serve(model_dirs, monkeypatch):
    target = load_target(model_dirs["llama"], backend="ours", dtype="float32")
    draft = new_draft(target, seed=3)
    prompt = [1, 5, 9, 4]
    want = Decoder(target).generate(prompt, 12, eos_ids=()).token_ids

    def overflow(feats, capture, hidden):
        raise FeatureError("NaN or inf in the captured target features", fix="-", code="E401")

    monkeypatch.setattr(prefill_mod, "check_finite", overflow)
    with pytest.raises(FeatureError) as e:
        Decoder(target, draft, TreeShape(3, 1, 4)).generate(prompt, 12, eos_ids=())
    assert e.value.code == "E401"
    eng = BatchEngine(target, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=2))
    eng.add(Request("r", prompt, 12, eos_ids=()))
    got, drafted = [], []
    while eng.has_work:
        for ev in eng.step():
            got += ev.token_ids
            drafted.append(ev.drafted)
    assert got == want and drafted == [None] * len(drafted)  # the target's output, no draft used


def test_plain_rows_give_the_baseline_a_verifys_shapes(model_dirs):
    """A k-row plain step (the bf16 GPU baseline's form) decodes the same tokens in float32 (its extra rows written
    past the committed entries, never committed)."""
    target = load_target(model_dirs["llama"], backend="ours", dtype="float32")
    prompt = [1, 5, 9, 4]
    one = Decoder(target, baseline_rows=1).generate(prompt, 10, eos_ids=()).token_ids
    six = Decoder(target, baseline_rows=6).generate(prompt, 10, eos_ids=()).token_ids
    assert six == one
    with pytest.raises(GenerationError, match="plain rows must be an integer >= 1") as bad:
        BatchEngine(target, None, EngineOptions(max_batch=1, plain_rows=0))
    assert "plain_rows=1" in bad.value.fix  # the fix names the argument the caller passed
