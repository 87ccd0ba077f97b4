"""Product code cites measured decisions by id (docs/performance.md#d7), never a dated result file: the ids are stable,
the result files are the lab's record and live in benchmarks/results/ behind the Decisions table."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "benchmarks" / "results"
# the package's own text: Python, and the CUDA sources hopper.py builds
SOURCES = [p for ext in ("*.py", "*.cu", "*.cuh") for p in sorted((ROOT / "eaglekit").rglob(ext))]

# a dated result file (2026-12-05b_cpu_fault_zoo.json, ..._threads*.json, a .txt kernel table), a path into the
# results folder, or a name elided from one cited before it ("..._auto_cycle.json")
CITATION = re.compile(r"20\d{2}-\d{2}-\d{2}[a-z]?[_-][\w.*-]*\.(?:json|txt)"
                      r"|\bresults/[\w*-]"
                      r"|\.\.\._[\w*-]+\.json")
CITED_ID = re.compile(r"docs/performance\.md#(d\d+)")
ROW = re.compile(r'^\| <a id="(d\d+)"></a>D(\d+) \|(.*)$', re.M)
LINK = re.compile(r"\]\(\.\./benchmarks/results/([^)]+)\)")


def _decisions() -> str:
    text = DOC.read_text()
    start = text.index("\n## Decisions\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_the_patterns_find_what_they_are_for():
    """The checks below can fail: the patterns find a citation, an id and a row where there is one."""
    for cited in ("benchmarks/results/2026-12-03b_h200_bulk.json", "(12 slots: 2026-12-03b_h200_bulk.json)",
                  "2026-12-05h_cpu-serve-demo_threads*.json", "2026-12-04e_h200_deepseek_step_kernels.txt",
                  "results/2026-12-04_h200-8b.json", "..._auto_cycle.json"):
        assert CITATION.search(cited), cited
    for clean in ("docs/performance.md#d7", "the 2026 release", "see results below", "config.json"):
        assert not CITATION.search(clean), clean
    assert CITED_ID.findall("ring slots (docs/performance.md#d3), tiles docs/performance.md#d10") == ["d3", "d10"]
    row = '| <a id="d7"></a>D7 | x | y | [a.json](../benchmarks/results/a.json) |'
    assert [m.group(1) for m in ROW.finditer(row)] == ["d7"] and LINK.findall(row) == ["a.json"]


def test_product_code_cites_no_result_file():
    assert len(SOURCES) > 50
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in SOURCES
             for n, line in enumerate(p.read_text().splitlines(), 1) for m in CITATION.finditer(line)]
    assert found == [], "cite the decision's id (docs/performance.md#dN) instead:\n" + "\n".join(found)


def test_every_cited_decision_has_its_row():
    rows = {m.group(1) for m in ROW.finditer(_decisions())}
    cited = {(p.relative_to(ROOT).as_posix(), i) for p in SOURCES for i in CITED_ID.findall(p.read_text())}
    assert len(cited) >= 10
    assert sorted(f"{f}: {i}" for f, i in cited if i not in rows) == []


def test_the_table_numbers_its_rows_and_links_files_that_exist():
    rows = list(ROW.finditer(_decisions()))
    assert len(rows) >= 10
    # ids in order, each anchor matching its id, none twice
    assert [(m.group(1), int(m.group(2))) for m in rows] == [(f"d{k}", k) for k in range(1, len(rows) + 1)]
    missing = []
    for m in rows:
        cells = m.group(3).split(" | ")
        assert len(cells) == 3 and all(c.strip(" |") for c in cells), m.group(0)[:80]
        files = LINK.findall(cells[2])
        assert files, f"D{m.group(2)} links no result file"
        missing += [f"D{m.group(2)}: {f}" for f in files if not (RESULTS / f).is_file()]
    assert missing == []
