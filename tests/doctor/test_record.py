"""The doctor against the draft's training record (eaglekit.doctor.recorded): the right pair matches it; a function
field changed since training is named with its fix (E224); a capture moved since training whose drop the recorded
capture undoes is a wiring fault (E290) and settles the wiring, as a capture unchanged whose acceptance holds does; any
other drop beyond the interval is E223 with what changed; a d2t
or chat template other than recorded is E217 / E215; another dtype whose acceptance holds is a note (I312);
`doctor --record` writes a record for a draft made elsewhere. The demo pair, its record cut to a few sequences."""

import json
import shutil

import pytest
from helpers import doctor_args
from safetensors.torch import load_file, save_file

from eaglekit.capture import CaptureSpec
from eaglekit.cli import main
from eaglekit.demo import ASSETS
from eaglekit.doctor import run_doctor
from eaglekit.doctor.recorded import acceptance_findings, static_findings
from eaglekit.doctor.zoo import other_chat_template, shuffle_d2t, third_party
from eaglekit.models import load_target
from eaglekit.train.record import RECORD_FILE, loaded_as_doctor, read_record

TARGET = ASSETS / "target"
QUICK = dict(prompts=2, max_new_tokens=16, time_budget=0)
CAPTURE = CaptureSpec((1, 5, 8))


def _codes(res):
    return {f["code"] for f in res["findings"]}


def _draft(tmp_path, keep=6, name="d"):
    """A copy of the demo draft whose record keeps its first `keep` sequences (the test's measurement is short)."""
    d = shutil.copytree(ASSETS / "draft", tmp_path / name)
    rec = json.loads((d / RECORD_FILE).read_text())
    rec["sample"]["sequences"], rec["runs"] = rec["sample"]["sequences"][:keep], rec["runs"][:keep]
    (d / RECORD_FILE).write_text(json.dumps(rec))
    return d


def _edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def target():
    return load_target(TARGET)


def test_the_shipped_demo_draft_carries_its_record():
    rec = read_record(ASSETS / "draft")
    assert rec["written_by"] == "eaglekit train" and rec["config"]["capture"] == [1, 5, 8]
    assert len(rec["sample"]["sequences"]) <= 64 and (ASSETS / "draft" / RECORD_FILE).stat().st_size < 1_000_000
    assert rec["target"]["weights"]["sha256"] == json.loads((ASSETS / "draft" / "config.json").read_text())[
        "eaglekit"]["target"]["weights"]["sha256"]


def test_the_right_pair_accepts_what_it_accepted_at_training(tmp_path):
    res = run_doctor(*doctor_args(TARGET, _draft(tmp_path), **dict(QUICK, time_budget=60)))
    assert "I311" in _codes(res) and not _codes(res) & {"E223", "E224", "E217", "E215"}, res["verdict"]
    i311 = next(f for f in res["findings"] if f["code"] == "I311")
    assert i311["evidence"]["drop"] == 0 and "where it accepted" in i311["message"]
    assert i311["evidence"]["capture_unchanged"]
    # the record settles the wiring: the verdict is conclusive after the probe's first round, whatever its budget
    assert res["status"] == "clean" and len(res["rounds"]) == 1, res["verdict"]


def test_a_capture_moved_since_training_is_the_wiring_fault_the_record_names(tmp_path, target):
    d = _draft(tmp_path, keep=24)
    rec = read_record(d)
    draft = loaded_as_doctor(target, d)
    low = CaptureSpec((0, 4, 7))  # ids one low (SpecForge's 'output of' ids read as eaglekit's)
    (found,) = acceptance_findings(rec, target, draft, low, TARGET, [], fix_ids=lambda ids: f"ids {ids}")
    assert found.code == "E290" and found.fix == "ids [1, 5, 8]", found.message
    ev = found.evidence
    assert ev["source"] == "training record" and ev["best"] == [1, 5, 8] and ev["configured"] == [0, 4, 7]
    # the training loss decides (the configured wiring the worse fit by 3 standard errors), accepting less
    assert ev["loss_z"] >= 3 and ev["loss_diff"] > 0 and ev["diff"] < 0, found.message
    assert "trained on after_layers [1, 5, 8]" in found.message and "training loss" in found.message
    # where the recorded capture does not give the recorded acceptance back either, the cause is elsewhere (E223)
    rec["runs"] = ["".join("." if c == "." else "3" for c in r) for r in rec["runs"]]
    (other,) = acceptance_findings(rec, target, draft, low, TARGET, [], fix_ids=lambda ids: f"ids {ids}")
    assert other.code == "E223" and "the capture: after_layers [0, 4, 7] now, [1, 5, 8] at training" in other.message


@pytest.mark.slow
def test_a_flipped_norm_is_named_with_its_fix_and_its_drop_measured(tmp_path):
    d = _edit_config(_draft(tmp_path), lambda c: c.update(norm_before_residual=True))
    res = run_doctor(*doctor_args(TARGET, d, **QUICK))
    assert res["status"] == "fault", res["verdict"]
    e224 = next(f for f in res["findings"] if f["code"] == "E224")
    assert e224["evidence"] == {"field": "norm_before_residual", "recorded": False, "now": True}
    assert e224["fix"] == "set norm_before_residual back to false in config.json"
    e223 = next(f for f in res["findings"] if f["code"] == "E223")
    assert " at training (" in e223["message"] and "norm_before_residual (E224)" in e223["message"]
    assert e223["evidence"]["drop"] > 3 * e223["evidence"]["se"] and e223["evidence"]["drop"] > 0.05


def test_tie_word_embeddings_d2t_and_chat_template_against_the_record(tmp_path, target):
    d = _edit_config(_draft(tmp_path), lambda c: c.update(tie_word_embeddings=True))
    w = load_file(d / "model.safetensors")
    shuffle_d2t(w)
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    rec = read_record(d)
    other = other_chat_template(TARGET, tmp_path / "t")
    found = static_findings(rec, d, loaded_as_doctor(target, d), other, [])
    by = {f.code: f for f in found}
    assert set(by) == {"E224", "E217", "E215"}
    assert "an engine that honours it" in by["E224"].message and by["E224"].evidence["field"] == "tie_word_embeddings"
    assert by["E217"].evidence["recorded"] == rec["d2t_sha256"]
    assert "chat template" in by["E215"].message and "tokenizer" not in by["E215"].evidence


def test_another_dtype_is_a_note_where_acceptance_holds_and_a_fault_where_it_drops(tmp_path, target):
    d = _draft(tmp_path, keep=4)
    rec = read_record(d)
    draft = loaded_as_doctor(target, d)
    rec["run"]["dtype"] = "bfloat16"  # as if recorded in bfloat16: this run (float32) differs only in dtype
    held = acceptance_findings(rec, target, draft, CAPTURE, TARGET, [])
    assert [f.code for f in held] == ["I311", "I312"] and "dtype: float32 now, bfloat16 at training" in held[1].message
    rec["runs"] = ["".join("." if c == "." else "3" for c in r) for r in rec["runs"]]  # every step, at training
    (dropped,) = acceptance_findings(rec, target, draft, CAPTURE, TARGET, [])
    assert dropped.code == "E223" and dropped.fix.startswith("run the target as at training (bfloat16")
    assert "where it accepted 4.00 at training" in dropped.message


def test_doctor_record_writes_a_record_for_a_draft_made_elsewhere(tmp_path, capsys):
    d = third_party(shutil.copytree(ASSETS / "draft", tmp_path / "d"))
    assert read_record(d) is None
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def add(a, b):", "The sky is", "for x in"]))
    assert main(["doctor", "--target", str(TARGET), "--draft", str(d), "--record", "--prompt-file", str(prompts),
                 "--max-new-tokens", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rec = read_record(d)
    assert out["written_by"] == rec["written_by"] == "eaglekit doctor --record" and rec["acceptance"]["positions"] > 0
    res = run_doctor(*doctor_args(TARGET, d, prompt_file=prompts, **QUICK))
    assert {"I311", "I308"} <= _codes(res)  # the record's weights fingerprint tells the target (no eaglekit block)
