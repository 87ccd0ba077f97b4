"""The README opens with the two commands; .ci/run runs the second one verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands():
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("    python3 -m venv")]
    return lines


def test_readme_opens_with_demo_and_test_commands():
    cmds = _commands()
    assert len(cmds) >= 2
    assert cmds[0].endswith("eaglekit demo") and "pip install torch==2.13.0" in cmds[0]
    assert cmds[1].endswith("python -m pytest") and "'.[dev]'" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in [ln.strip() for ln in ci]


def test_docs_cite_only_files_that_ship():
    """Every `name.md` the docs, the README and the package's docstrings cite is a file of the repository
    (docs/doctor.md cited a reference.md that lives outside it)."""
    import re

    shipped = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.md") if ".git" not in p.parts}
    names = {p.rsplit("/", 1)[-1] for p in shipped}
    sources = [*ROOT.glob("docs/*.md"), ROOT / "README.md", *(ROOT / "eaglekit").rglob("*.py")]
    missing = []
    for f in sources:
        for cited in re.findall(r"[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md\b", f.read_text()):
            if cited.lstrip("./") not in shipped and cited.rsplit("/", 1)[-1] not in names:
                missing.append(f"{f.relative_to(ROOT)}: {cited}")
    assert missing == []
