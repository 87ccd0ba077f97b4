"""Without EAGLE3_DEBUG the vLLM plugin does nothing, and doctor --engine without a vLLM exits 2 at once (fast)."""

import importlib.util
import json
import sys

import pytest
from engine_helpers import DEMO

from eaglekit.cli import main


def test_plugin_returns_at_once_when_tracing_is_off(monkeypatch):
    from eaglekit.integrations.vllm import plugin as vllm_plugin

    monkeypatch.delenv("EAGLE3_DEBUG", raising=False)
    before = set(sys.modules)
    vllm_plugin.register()
    assert not vllm_plugin._done
    assert not {m for m in set(sys.modules) - before if m.startswith(("vllm", "torch"))}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this interpreter has vLLM")
def test_doctor_engine_without_vllm_exits_2(monkeypatch, capsys):
    monkeypatch.delenv("EAGLEKIT_VLLM_PYTHON", raising=False)
    code = main(["doctor", "--engine", "vllm", "--target", str(DEMO / "target"), "--draft", str(DEMO / "draft"),
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["findings"][0]["code"] == "E170"
