"""The engine a server drives (eaglekit.decoding.protocols.Engine): BatchEngine is one, with or without a draft;
build_app refuses an object that is not, naming what it lacks."""

import pytest

from eaglekit.decoding.config import EngineOptions
from eaglekit.decoding.engine import BatchEngine
from eaglekit.decoding.protocols import MEMBERS, Engine, missing
from eaglekit.models import load_target


def test_the_batch_engine_is_an_engine(model_dirs):
    target = load_target(model_dirs["llama"], backend="ours", dtype="float32")
    eng = BatchEngine(target, None, EngineOptions(max_batch=2))
    assert missing(eng) == [] and isinstance(eng, Engine)
    assert eng.spec_stats is not None and eng.synthetic is None and eng.profile() is None  # (profile off)
    # the protocol's members are the ones `missing` checks
    declared = set(Engine.__annotations__) | {n for n in vars(Engine) if not n.startswith("_")}
    assert declared == set(MEMBERS)


def test_build_app_refuses_what_is_not_an_engine(model_dirs):
    from eaglekit.options import ServeOptions
    from eaglekit.serve.app import build_app
    from eaglekit.tokenizer import load_tokenizer

    class Half:
        has_work, num_running, num_waiting = False, 0, 0

        def step(self):
            return []

    with pytest.raises(TypeError, match="lacks spec_stats, synthetic, policy, shape, spec_max_batch, validate, add"):
        build_app(Half(), load_tokenizer(model_dirs["llama"]), ServeOptions(served_model_name=["m"]), 512)
