"""No command loses the user's data: an output that is one of the command's inputs, lies inside one, or would
replace one is refused (E131) before anything loads or is written, and the input is left as it was."""

import hashlib
import json
from pathlib import Path

import pytest

from eaglekit.cli import main
from eaglekit.demo import ASSETS
from eaglekit.errors import InputError
from eaglekit.io import no_overlap


def _digest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "d.jsonl").write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n"}) + "\n"
                                       for i in range(4)))
    return d


def _refused(capsys, argv, *kept):
    before = [_digest(Path(k)) for k in kept]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "[E131]" in err and "Traceback" not in err, err
    assert [_digest(Path(k)) for k in kept] == before
    return err


def test_regenerate_onto_its_own_data(model_dirs, data, capsys):
    t, d = str(model_dirs["llama"]), str(data / "d.jsonl")
    err = _refused(capsys, ["regenerate", "--target", t, "--data", d, "--out", d], d)
    assert "is --data" in err
    _refused(capsys, ["regenerate", "--target", t, "--data", str(data), "--out", str(data / "regen.jsonl")], data)
    _refused(capsys, ["regenerate", "--target", t, "--data", d, "--out", str(Path(t) / "regen.jsonl")], t)


def test_export_onto_its_own_draft(model_dirs, tmp_path, capsys):
    from eaglekit.draft import new_draft, save_draft
    from eaglekit.models import load_target

    t = str(model_dirs["llama"])
    draft = tmp_path / "draft"
    save_draft(new_draft(load_target(t), seed=1), draft)
    for out in (draft, draft / "sglang"):
        _refused(capsys, ["export", str(out), "--draft", str(draft), "--to", "sglang", "--target", t], draft)


def test_extract_and_train_onto_their_inputs(model_dirs, data, tmp_path, capsys):
    t = str(model_dirs["llama"])
    _refused(capsys, ["extract", "--target", t, "--data", str(data), "--out", str(data)], data)
    _refused(capsys, ["train", "--target", t, "--data", str(data), "--out", str(data / "run")], data)
    run = tmp_path / "run"
    (run / "draft").mkdir(parents=True)
    (run / "draft" / "config.json").write_text("{}")
    err = _refused(capsys, ["train", "--target", t, "--data", str(data), "--init-draft", str(run / "draft"),
                            "--out", str(run)], run)
    assert "which this command replaces" in err


def test_sweep_bench_and_recipe_outputs(model_dirs, data, tmp_path, capsys):
    t = str(model_dirs["llama"])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def"}\n')
    _refused(capsys, ["sweep", "--target", t, "--draft", t, "--prompt-file", str(prompts), "--out", t], t)
    _refused(capsys, ["bench", "--endpoint", "http://127.0.0.1:9", "--prompts", str(prompts), "--json",
                      str(prompts)], prompts)
    _refused(capsys, ["recipe", "demo", "--out", str(ASSETS), "--install"], ASSETS)
    _refused(capsys, ["recipe", "demo", "--out", str(ASSETS.parent), "--install"], ASSETS)


def test_no_overlap_lets_separate_paths_and_untouched_neighbours_pass(tmp_path):
    no_overlap(tmp_path / "out", "--out", {"--data": tmp_path / "data", "--x": None})
    # extracted features beside the run's own files are not replaced by training
    no_overlap(tmp_path / "run", "--out", {"--features": tmp_path / "run" / "features"}, writes=("draft",))
    with pytest.raises(InputError) as e:
        no_overlap(tmp_path / "a" / ".." / "a", "--out", {"--data": tmp_path / "a"})
    assert e.value.code == "E131"


def test_replace_tree_swaps_a_whole_folder(tmp_path):
    from eaglekit.io import replace_tree

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_text("new")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "b").write_text("old")
    replace_tree(tmp_path / "src", tmp_path / "dst")
    assert [p.name for p in (tmp_path / "dst").iterdir()] == ["a"] and (tmp_path / "dst" / "a").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]  # nothing left beside it
