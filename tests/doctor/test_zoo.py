"""The fault zoo (eaglekit.doctor.zoo): faults seeded into copies of the demo pair and of a Qwen2 pair built from it,
each with the verdict the doctor must give. The default tier runs the cases refused before the probe (seconds
each); the slow tier the whole zoo, which must give no false clean and the right cause in at least 90% of cases.
The engine doctor's zoo is in tests/engine/test_zoo_engine.py."""

import pytest

from eaglekit.doctor import run_doctor
from eaglekit.doctor.zoo import CASES, OUTCOMES, Pairs, confusion, outcome, run_case
from eaglekit.options import DoctorOptions

QUICK = DoctorOptions(prompts=2, max_new_tokens=8, time_budget=0)


def _quick_runner(model):
    return run_doctor(model, QUICK)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return Pairs(tmp_path_factory.mktemp("zoo_pairs"))


def test_the_zoo_is_large_and_covers_two_families_and_the_issue_rows():
    assert len(CASES) >= 20 and len({c.name for c in CASES}) == len(CASES)
    assert {c.family for c in CASES} == {"llama", "qwen2"}
    assert {c.issue_row for c in CASES if c.issue_row} == {str(i) for i in range(1, 9)}
    assert all(c.codes for c in CASES if c.expect == "fault")


def test_the_training_record_cases_expect_their_causes():
    """Issue 64: faults outside the wiring, found through the record, and right pairs that must stay clean with it."""
    by = {c.name: c for c in CASES}
    expect = {"rope-theta": "E224", "norm-before-residual": "E224", "d2t-shuffled-10pct": "E217",
              "tie-word-embeddings": "E224", "other-chat-template": "E215"}
    assert all(by[n].expect == "fault" and code in by[n].codes for n, code in expect.items())
    assert all(by[n].expect == "clean" for n in ("clean-recorded", "clean-bfloat16", "clean-builtin-prompts"))
    assert by["clean-bfloat16"].warn == ("I312",)


QUICK_CASES = [c for c in CASES if c.quick and c.family == "llama"]


@pytest.mark.parametrize("case", QUICK_CASES, ids=[c.name for c in QUICK_CASES])
def test_a_fault_refused_before_the_probe_gets_its_cause(case, pairs, tmp_path):
    row = run_case(case, pairs, tmp_path, _quick_runner)
    assert row["outcome"] == "right", row
    assert row["status"] == "fault" and row["exit_code"] == 1


def test_outcomes_are_scored_three_ways():
    fault = next(c for c in CASES if c.name == "d2t-rolled")
    def mk(status, codes):
        return {"status": status, "findings": [{"code": c, "severity": "error"} for c in codes]}

    assert outcome(fault, mk("fault", ["E222"])) == "right"
    assert outcome(fault, mk("fault", ["E282"])) == "wrong cause"
    assert outcome(fault, mk("cannot_tell", [])) == "cannot tell"
    assert outcome(fault, mk("clean", [])) == "false clean"
    third = next(c for c in CASES if c.name == "clean-third-party")
    assert outcome(third, mk("clean", [])) == "false clean" and outcome(third, mk("cannot_tell", [])) == "right"
    rows = [{"outcome": o, "expect": "fault"} for o in OUTCOMES]
    assert confusion(rows)["right"] == 1 and confusion(rows)["cases"] == len(OUTCOMES)


@pytest.mark.slow
def test_the_whole_zoo_never_calls_a_fault_clean(pairs, tmp_path):
    from eaglekit.doctor.zoo import doctor_runner, print_table

    rows = [run_case(c, pairs, tmp_path, doctor_runner()) for c in CASES]
    print_table(rows, "eaglekit doctor")
    c = confusion(rows)
    assert c["false clean"] == 0 and c["false alarm"] == 0
    assert c["right"] >= 0.9 * c["cases"]
