"""The package's shape, ratcheted toward issue 62's goals: no function over 80 lines, no class over 400, no signature
over 10 parameters (Triton kernels' launch signatures excepted), few getattr-with-default / hasattr probes. Each
ceiling is what the package has now; lower it when a change brings the count down, never raise it. Run with -s for
the counts and the offenders."""

import ast
import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "eaglekit"
# where the ratchet stands (issue 62's goals: 0, 0, 0, 15)
CEILING = {"functions over 80 lines": 0, "classes over 400 lines": 0, "signatures over 10 parameters": 0,
           "getattr/hasattr probes": 10}
PROBE = re.compile(r"getattr\([^()]*,[^()]*,[^()]*\)|hasattr\(")


def _is_kernel(path: Path) -> bool:
    return path.parent.name == "kernels" and path.stem.endswith("_triton")


def shape() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {k: [] for k in CEILING}
    for p in sorted(PKG.rglob("*.py")):
        src = p.read_text()
        where = p.relative_to(PKG.parent)
        out["getattr/hasattr probes"] += [f"{where}"] * len(PROBE.findall(src))
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if n.end_lineno - n.lineno + 1 > 80:
                    out["functions over 80 lines"].append(f"{where}:{n.lineno} {n.name}")
                a = n.args
                k = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                k -= bool(a.args and a.args[0].arg in ("self", "cls"))
                if k > 10 and not _is_kernel(p):
                    out["signatures over 10 parameters"].append(f"{where}:{n.lineno} {n.name} ({k})")
            elif isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > 400:
                out["classes over 400 lines"].append(f"{where}:{n.lineno} {n.name}")
    return out


def test_the_shape_never_grows_past_its_ceiling():
    found = shape()
    assert sum(map(len, found.values())) > 0  # the counters read the package (a ratchet that cannot fail is none)
    for k, v in found.items():
        print(f"{k}: {len(v)} (ceiling {CEILING[k]})", *(f"  {x}" for x in v if "probes" not in k), sep="\n")
    assert {k: len(v) for k, v in found.items() if len(v) > CEILING[k]} == {}


def test_the_counters_see_what_they_count(tmp_path):
    src = "def f(a, b, c, d, e, f, g, h, i, j, k):\n" + "    x = 1\n" * 85 + "    return getattr(x, 'y', None)\n"
    t = ast.parse(src).body[0]
    assert t.end_lineno - t.lineno + 1 > 80 and len(t.args.args) == 11 and len(PROBE.findall(src)) == 1


def test_the_package_is_formatted():
    """`ruff format --check` over the package with pyproject's [tool.ruff.format] (what .ci/run runs): the shape
    counted above is the formatted one."""
    p = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--diff", str(PKG)], cwd=PKG.parent,
                       capture_output=True, text=True)
    assert p.returncode == 0, f"ruff format would change the package (run `ruff format eaglekit`):\n{p.stdout[-3000:]}"
