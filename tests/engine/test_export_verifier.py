"""The vLLM export's speculators_config.verifier.name_or_path: an absolute path (or the hub id of a cache snapshot),
never the path as typed, so that the folder loads from any working directory. Fast: runs in the default tier."""

import json
import os
import shutil

from eaglekit.cli import main
from eaglekit.draft import new_draft, save_draft
from eaglekit.interop.export import verifier_name
from eaglekit.models import load_target


def test_relative_target_is_written_absolute(model_dirs, tmp_path, monkeypatch, capsys):
    t = load_target(model_dirs["llama"])
    save_draft(new_draft(t, seed=1), tmp_path / "d")
    shutil.copytree(model_dirs["llama"], tmp_path / "work" / "target")
    monkeypatch.chdir(tmp_path / "work")
    assert main(["export", "out", "--draft", str(tmp_path / "d"), "--to", "vllm", "--target", "target"]) == 0
    err = capsys.readouterr().err
    cfg = json.loads((tmp_path / "work" / "out" / "config.json").read_text())
    name = cfg["speculators_config"]["verifier"]["name_or_path"]
    assert os.path.isabs(name) and os.path.samefile(name, tmp_path / "work" / "target")
    assert f"name_or_path = {name} (absolute path)" in err
    # and from another folder the path still names the target
    monkeypatch.chdir(tmp_path)
    assert os.path.isfile(os.path.join(name, "config.json"))


def test_hub_cache_snapshot_is_written_as_its_hub_id(tmp_path):
    snap = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "0e9e39f2"
    snap.mkdir(parents=True)
    assert verifier_name(snap) == ("meta-llama/Llama-3.1-8B-Instruct",
                                   "hub id (the folder is a Hugging Face cache snapshot)")
    plain = tmp_path / "models--x"  # not a snapshot layout: a path
    plain.mkdir()
    assert verifier_name(plain) == (str(plain.resolve()), "absolute path")
