"""The training record (eaglekit.train.record): written by train and eval --data into the draft folder, read back,
measured again to the same runs, carried by export, absent without harm."""

import json

import pytest

from eaglekit.capture import CaptureSpec
from eaglekit.models import load_target
from eaglekit.train.record import (
    MAX_SEQUENCES,
    RECORD_FILE,
    function_fields,
    loaded_as_doctor,
    measure,
    measure_each,
    read_record,
)


def _data(model_dirs, path, n=24):
    from test_train import _regen_file  # (the same regenerated file the training tests train on)

    return _regen_file(model_dirs, path, n)


@pytest.fixture(scope="module")
def trained(model_dirs, tmp_path_factory):
    from eaglekit.options import ModelOptions, TrainOptions
    from eaglekit.train.run import run_train

    root = tmp_path_factory.mktemp("record")
    data = _data(model_dirs, root / "data.jsonl")
    run_train(model_dirs["llama"], root / "run", TrainOptions(data=str(data), max_steps=3, batch_size=8,
              draft_vocab_size=64, heldout=0.25), ModelOptions(device="cpu"), log=lambda s: None)
    return root / "run" / "draft", data


def test_train_writes_a_record_that_reads_back_and_measures_again_the_same(model_dirs, trained):
    draft_dir, _ = trained
    rec = read_record(draft_dir)
    assert rec is not None and rec["written_by"] == "eaglekit train"
    assert (draft_dir / RECORD_FILE).stat().st_size < 1_000_000
    seqs = rec["sample"]["sequences"]
    assert 1 <= len(seqs) <= MAX_SEQUENCES and len(rec["runs"]) == len(seqs)
    assert [len(r) for r in rec["runs"]] == [len(s) for s in seqs]
    a = rec["acceptance"]
    assert a["positions"] > 0 and len(a["per_position"]) == rec["steps"] and a["accept_length"] >= 1
    cfg = json.loads((draft_dir / "config.json").read_text())
    assert rec["config"]["capture"] == cfg["eaglekit"]["capture"]["after_layers"]
    assert rec["config"]["fields"] == function_fields(draft_dir)
    assert rec["target"]["weights"]["sha256"] and rec["run"]["dtype"] == "float32"
    assert rec["training_eval"]["per_position_acc"]
    t = load_target(model_dirs["llama"])
    again = measure(t, loaded_as_doctor(t, draft_dir), seqs, CaptureSpec(tuple(rec["config"]["capture"])),
                    rec["steps"])
    assert again == rec["runs"]


def test_measuring_several_wirings_in_one_target_pass_equals_measuring_each(model_dirs, trained):
    """measure_each captures the union of the wirings' layers once and slices each wiring's features from it: the
    same runs as a target pass per wiring, for a reversed and an overlapping wiring too."""
    draft_dir, _ = trained
    rec = read_record(draft_dir)
    t = load_target(model_dirs["llama"])
    d = loaded_as_doctor(t, draft_dir)
    seqs = rec["sample"]["sequences"][:4]
    cap = tuple(rec["config"]["capture"])
    wirings = [CaptureSpec(cap), CaptureSpec(cap[::-1]), CaptureSpec(tuple(max(i - 1, -1) for i in cap))]
    assert measure_each(t, d, seqs, wirings, rec["steps"]) == [measure(t, d, seqs, w, rec["steps"]) for w in wirings]


def test_eval_data_writes_the_record_and_export_carries_it(model_dirs, trained, tmp_path):
    import shutil

    from eaglekit.draft import load_draft
    from eaglekit.interop.export import export
    from eaglekit.options import EvalOptions, ModelOptions
    from eaglekit.train.run import run_eval

    src, data = trained
    d = shutil.copytree(src, tmp_path / "d")
    (d / RECORD_FILE).unlink()
    assert read_record(d) is None  # a folder without one reads as before
    cpu = ModelOptions(device="cpu")
    out = run_eval(model_dirs["llama"], d, EvalOptions(data=str(data), no_record=True), model=cpu)
    assert out["ttt"]["per_position_acc"] and read_record(d) is None  # --no-record: evaluated, the folder untouched
    run_eval(model_dirs["llama"], d, EvalOptions(data=str(data)), model=ModelOptions(device="cpu"))
    rec = read_record(d)
    assert rec["written_by"] == "eaglekit eval --data" and rec["sample"]["source"] == str(data)
    t = load_target(model_dirs["llama"])
    for fmt in ("vllm", "sglang"):
        export(load_draft(d, embed_weight=t.embed_weight()), tmp_path / fmt, fmt, t)
        assert json.loads((tmp_path / fmt / RECORD_FILE).read_text()) == rec
        assert function_fields(tmp_path / fmt) == rec["config"]["fields"]  # read through either layout alike


def test_an_unreadable_record_is_no_record(tmp_path):
    (tmp_path / RECORD_FILE).write_text("{not json")
    assert read_record(tmp_path) is None
    (tmp_path / RECORD_FILE).write_text(json.dumps({"version": 99, "runs": ["1"]}))
    assert read_record(tmp_path) is None


def test_the_held_out_ids_come_from_either_source(model_dirs, trained, tmp_path):
    """Offline training (a FeatureStore) records the same held-out token ids as online training (its examples)."""
    from eaglekit.train.data import load_examples
    from eaglekit.train.extract import FeatureStore, extract
    from eaglekit.train.record import ids_of
    from eaglekit.train.sources import OnlineSource

    _, data = trained
    t = load_target(model_dirs["llama"])
    ex = load_examples(data, None, 64)[:5]
    spec = CaptureSpec.default(t.info.num_layers)
    extract(t, ex, tmp_path / "f", spec, log=lambda s: None, progress=False)
    assert ids_of(FeatureStore(tmp_path / "f"), [0, 3]) == ids_of(OnlineSource(t, ex, spec), [0, 3])
    assert ids_of(OnlineSource(t, ex, spec), [3]) == [list(ex[3].input_ids)]
