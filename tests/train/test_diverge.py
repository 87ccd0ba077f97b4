"""A diverged run stops: a non-finite loss (or gradient, or weight at a save) ends training with E127, the last good
checkpoint and draft stay as they were, and nothing NaN is written; the log is strict JSON. A resumed run continues
with the schedule settings given now and says which changed; it refuses (E120) a change of those that choose its
samples or its model."""

import hashlib
import json

import pytest
import torch

from eaglekit.cli import main


def _strict(text: str) -> list[dict]:
    def refuse(name):
        raise AssertionError(f"{name} in a log line: not strict JSON")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines() if line.strip()]


def _digest(folder):
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()


@pytest.fixture
def data(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"text": f"def add{i}(a, b):\n    return a + b * {i}\nprint(add{i}(1, 2))\n"})
                         + "\n" for i in range(24)))
    return f


@pytest.mark.slow  # four training runs (~40 s); the default tier has the one below
def test_a_diverged_run_stops_and_keeps_the_last_good_checkpoint(model_dirs, data, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["train", "--target", str(model_dirs["llama"]), "--data", str(data), "--out", str(out),
              "--batch-size", "2", "--save-every", "2", "--draft-vocab-size", "64", "--heldout", "0", "--device", "cpu"]
    assert main(common + ["--max-steps", "4", "--lr", "1e-3"]) == 0
    capsys.readouterr()
    draft_before = _digest(out / "draft")
    ckpt_before = (out / "checkpoint" / "state.pt").read_bytes()
    summary_before = (out / "train_summary.json").read_text()

    assert main(common + ["--max-steps", "8", "--lr", "1e30"]) == 2
    cap = capsys.readouterr()
    assert "--max-steps 4 -> 8" in cap.out + cap.err and "--lr 0.001 -> 1e+30" in cap.out + cap.err
    assert "[E127]" in cap.err and "training diverged at step" in cap.err and "checkpoint of step 4" in cap.err
    assert "Traceback" not in cap.err
    assert (out / "checkpoint" / "state.pt").read_bytes() == ckpt_before and _digest(out / "draft") == draft_before
    log = _strict((out / "train_log.jsonl").read_text())
    assert log[-1]["diverged"] and log[-1]["step"] >= 4
    assert (out / "train_summary.json").read_text() == summary_before  # it describes the draft that was kept

    # a setting that chooses the samples cannot change on resume: the fix names the checkpoint's value
    assert main(common + ["--max-steps", "6", "--lr", "1e-3", "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "[E120]" in err and "--batch-size 2 (now 4)" in err and "resume with --batch-size 2" in err

    # the fix E127 names: a lower --lr, the same command; it resumes from step 4 with the new settings
    assert main(common + ["--max-steps", "6", "--lr", "1e-4"]) == 0
    cap = capsys.readouterr()
    assert "resuming at step 4" in cap.out + cap.err and "--lr 0.001 -> 0.0001" in cap.out + cap.err
    log = _strict((out / "train_log.jsonl").read_text())
    assert [r["step"] for r in log] == list(range(6)) and not any(r.get("diverged") for r in log)
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=False)
    assert state["step"] == 6 and all(torch.isfinite(v).all() for v in state["draft"].values())
    _strict((out / "train_summary.json").read_text().replace("\n", " "))


def test_a_run_that_diverges_before_its_first_checkpoint_writes_no_draft(model_dirs, data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--target", str(model_dirs["llama"]), "--data", str(data), "--out", str(out),
                 "--batch-size", "2", "--max-steps", "6", "--save-every", "3", "--lr", "1e30", "--warmup", "0",
                 "--draft-vocab-size", "64", "--heldout", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "[E127]" in err and "no checkpoint was written yet" in err
    assert not (out / "draft").exists() and not (out / "checkpoint" / "state.pt").exists()
    _strict((out / "train_log.jsonl").read_text())
