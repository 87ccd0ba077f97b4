"""The import contract (pyproject.toml, [tool.importlinter]): eaglekit's layers import only downward, and no room's
modules import each other in a circle. `lint-imports` holds on this checkout, and it fails, naming the import, on a
copy of the package with one upward import planted: at module level and inside a function (both are imports)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e '.[dev]')")


def lint(cwd: Path) -> subprocess.CompletedProcess:
    # lint-imports reads cwd's pyproject.toml and puts cwd first on sys.path, so the package it checks is cwd's
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_layers_hold_on_this_checkout():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 2 kept, 0 broken." in r.stdout


PLANTS = {
    "module level": "\nfrom ..serve import app  # planted: kernels reaching up to the server\n",
    "in a function": "\n\ndef _planted():\n    from ..serve import app  # planted: kernels reaching up to the "
                     "server\n\n    return app\n",
}


@pytest.mark.parametrize("where", list(PLANTS))
def test_an_upward_import_is_refused_by_name(tmp_path, where):
    shutil.copytree(ROOT / "eaglekit", tmp_path / "eaglekit", ignore=shutil.ignore_patterns(
        "__pycache__", "assets", "*.cu", "*.cuh"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    products = tmp_path / "eaglekit" / "kernels" / "products.py"
    products.write_text(products.read_text() + PLANTS[where])
    r = lint(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "eaglekit's layers: imports only go downward BROKEN" in out
    assert "eaglekit.kernels is not allowed to import eaglekit.serve" in out
    assert "eaglekit.kernels.products -> eaglekit.serve.app" in out


def test_the_architecture_table_is_the_contract_and_the_code():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_architecture_md", ROOT / "docs" / "make_architecture_md.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    text = make.DOC.read_text()
    assert make.START in text and make.END in text
    assert make.updated(text) == text, "docs/architecture.md is stale: run python docs/make_architecture_md.py"
