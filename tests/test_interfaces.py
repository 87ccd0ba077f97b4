"""The declared interfaces the engine talks through: draft.base.Draft and models.base.Target's committed
length and storage key; the option objects' defaults agree with the training loop's."""

import pytest
import sequence
import torch

from eaglekit.draft import new_draft
from eaglekit.draft.base import Draft
from eaglekit.models import load_target


def test_eagle3_draft_implements_the_draft_interface(model_dirs):
    t = load_target(model_dirs["llama"])
    d = new_draft(t, draft_vocab_size=64)
    assert isinstance(d, Draft)
    assert (d.hidden_size, d.draft_vocab_size, d.dtype) == (64, 64, torch.float32)
    d.reset(32)
    assert d.committed.shape == () and int(d.committed) == 0
    feats = torch.zeros(6, d.fc.in_features)
    h, logits = d.extend(feats, torch.arange(4, 10))
    assert int(d.committed) == 6 and h.shape == (64,) and logits.shape == (64,)


def test_an_incomplete_draft_is_refused_at_construction():
    class NoStep(Draft):
        hidden_size, draft_vocab_size, dtype, committed = 1, 1, torch.float32, torch.zeros(())

        def reset(self, span): ...

        def extend(self, feats, next_ids, n=None): ...

        def to_target_ids(self, ids): ...

    with pytest.raises(TypeError, match="step"):
        NoStep()


def test_storage_key_changes_exactly_when_the_cache_is_reallocated(model_dirs):
    """CUDA graphs are keyed on it: the same key must mean the same buffers (id() of a freed tensor can be reused)."""
    t = load_target(model_dirs["llama"])
    t.reset(64)
    k64 = t.storage_key()
    t.reset(64)
    assert t.storage_key() == k64  # same buffers: recorded graphs stay valid
    t.reset(128)
    k128 = t.storage_key()
    assert k128 != k64
    t.reset(64)  # fits the 128-slot cache: same buffers, another span (graphs bake in the span)
    assert t.storage_key() != k64 and t.storage_key()[1:] == k128[1:]
    sequence.prefill(t, torch.tensor([3, 4, 5]))
    assert t.committed is t.committed and int(t.committed) == t.length == 3  # the live device counter


def test_train_options_defaults_are_the_training_loops():
    from dataclasses import fields

    from eaglekit.options import TrainOptions
    from eaglekit.train.trainer import TrainConfig

    tc = {f.name: f.default for f in fields(TrainConfig)}
    shared = [f.name for f in fields(TrainOptions) if f.name in tc]
    assert len(shared) >= 10
    assert {n: getattr(TrainOptions(), n) for n in shared} == {n: tc[n] for n in shared}
