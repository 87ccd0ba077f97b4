"""The one chooser (eaglekit.pair.plan_run): every 'auto' of PairRuntime answered with what runs and why, kept on
the target as `target.plan` by load_pair, refused with E108 where a part cannot take the value asked."""

import json
from types import SimpleNamespace

import pytest
import torch

from eaglekit.cli import main
from eaglekit.demo import ASSETS
from eaglekit.errors import InputError
from eaglekit.options import PairRuntime
from eaglekit.pair import load_pair, plan_run

DEMO_T, DEMO_D = ASSETS / "target", ASSETS / "draft"


def _target(**kw):
    """What plan_run reads of a target: whether its decoder compiles, its tensor-parallel group, experts, dtype."""
    return SimpleNamespace(**({"compiles": True, "tp": None, "experts": None, "dtype": torch.bfloat16,
                               "backend": "ours"} | kw))


def test_load_pair_keeps_the_plan_and_each_part_says_why():
    t, d = load_pair(DEMO_T, DEMO_D, device="cpu", dtype="float32", run=PairRuntime(products="aten"))
    plan = t.plan
    assert plan.compile.value is False and "CPU" in plan.compile.why and "#d34" in plan.compile.why
    assert plan.prompt_graphs.value is False and plan.experts.value is None and plan.experts.why == "a dense target"
    assert plan.draft_precision.value == "none" and d.precision == "float32"
    # the products come from kernels.products.choose through set_pair_products: the plan holds the same Choice
    assert plan.products is t.products_choice and plan.products.kind == "aten"
    out = plan.as_dict()
    assert set(out) == {"compile", "prompt_graphs", "experts", "draft_precision", "products"}
    assert out["products"] == {"value": "aten", "why": "asked for (--products)"} and json.dumps(out)


def test_auto_on_a_gpu_compiles_and_quantizes_the_draft_and_a_server_does_not_compile():
    draft = SimpleNamespace(quantizes=True)
    plan = plan_run(_target(), draft, "cuda", PairRuntime())
    assert plan.compile.value is True and "CUDA graphs" in plan.compile.why
    assert plan.draft_precision.value == "int8" and "#d24" in plan.draft_precision.why
    served = plan_run(_target(), draft, "cuda", PairRuntime(server=True))
    assert served.compile.value is False and "server" in served.compile.why
    # asked for, a server compiles too; a float32 pair keeps its draft as stored
    assert plan_run(_target(), draft, "cuda", PairRuntime(server=True, compile="on")).compile.value is True
    assert plan_run(_target(dtype=torch.float32), draft, "cuda", PairRuntime()).draft_precision.value == "none"
    # a tensor-parallel rank or a transformers-backed target never compiles by default
    assert plan_run(_target(tp=object()), None, "cuda", PairRuntime()).compile.value is False
    assert plan_run(_target(compiles=False), None, "cuda", PairRuntime()).draft_precision.value is None


def test_experts_follow_the_target_and_a_value_no_part_takes_is_e108():
    moe = _target(experts="auto")
    assert plan_run(moe, None, "cuda", PairRuntime(experts="grouped")).experts.value == "grouped"
    assert plan_run(moe, None, "cuda", PairRuntime()).experts.value is None
    cases = [(_target(), PairRuntime(experts="grouped"), "mixture-of-experts"),
             (moe, PairRuntime(experts="fast"), "is not one of"),
             (_target(), PairRuntime(compile="maybe"), "is not one of auto, on, off"),
             (_target(compiles=False), PairRuntime(prompt_graphs=True), "eaglekit's own decoder")]
    for target, run, says in cases:
        with pytest.raises(InputError) as e:
            plan_run(target, None, "cpu", run)
        assert e.value.code == "E108" and says in str(e.value), (run, str(e.value))


def test_generate_json_reports_the_plan(capsys):
    rc = main(["generate", "--target", str(DEMO_T), "--draft", str(DEMO_D), "--prompt", "def f(", "--max-new-tokens",
               "4", "--device", "cpu", "--products", "aten", "--json"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)["metrics"]["plan"]
    assert plan["compile"]["value"] is False and plan["products"]["value"] == "aten"
    assert plan["draft_precision"] == {"value": "none", "why": "as stored: int8 pays on a GPU in bf16/fp16 only"}
