"""The declared interfaces the engine talks through: draft.base.Draft, models.base.Target's rows and the one sequence
of a SequenceTarget; the option objects' defaults agree with the training loop's."""

import pytest
import sequence
import torch

from eaglekit.draft import new_draft
from eaglekit.draft.base import Draft, SequenceDraft
from eaglekit.models import load_target


def test_eagle3_draft_implements_the_draft_interface(model_dirs):
    t = load_target(model_dirs["llama"])
    d = new_draft(t, draft_vocab_size=64)
    assert isinstance(d, Draft) and not isinstance(d, SequenceDraft)  # (rows of its own, no one-sequence half)
    assert (d.hidden_size, d.draft_vocab_size, d.dtype) == (64, 64, torch.float32)
    kv = d.row_cache(2, 32)
    assert kv.length.tolist() == [0, 0] and kv.max_len == 32
    feats = torch.zeros(2, 6, d.fc.in_features)
    with torch.inference_mode():
        h, logits = d.extend_rows(kv, feats, torch.arange(4, 16).view(2, 6), torch.tensor([6, 4]), 32)
    assert kv.length.tolist() == [6, 4] and h.shape == (2, 64) and logits.shape == (2, 64)


def test_an_incomplete_draft_is_refused_at_construction():
    """A draft declares its rows (Draft) or holds one sequence that gives them (SequenceDraft): one without its rows,
    or a sequence draft without `step`, cannot be built."""

    class NoRows(Draft):
        hidden_size, draft_vocab_size, dtype = 1, 1, torch.float32

        def to_target_ids(self, ids): ...

    with pytest.raises(TypeError, match="extend_rows"):
        NoRows()

    class NoStep(SequenceDraft):
        hidden_size, draft_vocab_size, dtype, committed = 1, 1, torch.float32, torch.zeros(())

        def reset(self, span): ...

        def extend(self, feats, next_ids, n=None): ...

        def to_target_ids(self, ids): ...

    with pytest.raises(TypeError, match="step"):
        NoStep()


def test_a_reset_keeps_the_cache_it_fits_in(model_dirs):
    """A one-row batch is the decoder's own cache (layers.own_row): a reset that fits the allocation keeps its buffers
    (a Decoder's requests reuse them), a longer span allocates anew, and a shorter one after it keeps the larger."""
    t = load_target(model_dirs["llama"])
    t.reset(64)
    k64 = t.cache.k
    t.reset(64)
    assert t.cache.k is k64
    t.reset(128)
    k128 = t.cache.k
    assert k128 is not k64 and k128.shape[3] > k64.shape[3]
    t.reset(64)
    assert t.cache.k is k128 and t.span == 64 and sequence.length(t) == 0
    sequence.prefill(t, torch.tensor([3, 4, 5]))
    assert sequence.length(t) == 3


def test_only_a_sequence_target_decodes_one_row_of_its_own(model_dirs):
    """Target declares rows only: a backend that implements neither its rows nor a sequence cannot be built, and a
    SequenceTarget's default rows refuse a batch of two with E308."""
    from eaglekit.errors import GenerationError
    from eaglekit.models.base import SequenceTarget, Target
    from eaglekit.models.hf import HFTarget

    class NoRows(Target):
        def features(self, ids, pad_mask=None, capture=None): ...

        def lm_head_weight(self): ...

        def embed_weight(self): ...

    with pytest.raises(TypeError, match="row_cache"):
        NoRows()
    hf = HFTarget.from_folder(model_dirs["llama"])
    assert isinstance(hf, SequenceTarget) and not hf.batched
    with pytest.raises(GenerationError) as e:
        hf.row_cache(2, 32)
    assert e.value.code == "E308"
    assert hf.row_cache(1, 32).span == 32


def test_train_options_defaults_are_the_training_loops():
    from dataclasses import fields

    from eaglekit.options import TrainOptions
    from eaglekit.train.trainer import TrainConfig

    tc = {f.name: f.default for f in fields(TrainConfig)}
    shared = [f.name for f in fields(TrainOptions) if f.name in tc]
    assert len(shared) >= 10
    assert {n: getattr(TrainOptions(), n) for n in shared} == {n: tc[n] for n in shared}
