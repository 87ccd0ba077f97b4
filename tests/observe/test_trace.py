"""EAGLE3_DEBUG tracing: records at the three capture points when on, nothing (not even stats) when off."""

import json
import subprocess
import sys

import torch

from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import new_draft
from eaglekit.models import load_target
from eaglekit.observe import trace


def _decode(model_dirs, n=12):
    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=1)
    return Decoder(t, d, TreeShape(3, 2, 6)).generate([5, 6, 7, 8], n, eos_ids=())


def test_on_records_every_point_with_stats(model_dirs, tmp_path):
    sink = []
    path = tmp_path / "trace.jsonl"
    trace.configure(enabled=True, file=str(path), sink=sink, stream=open(tmp_path / "stderr.txt", "w"))
    _decode(model_dirs)
    points = {r["point"] for r in sink}
    assert {"target.capture", "draft.input.features", "draft.input.embedding", "draft.input.fc",
            "draft.concat", "draft.input.hidden"} <= points
    cap = next(r for r in sink if r["point"] == "target.capture")
    assert cap["layers"] == [1, 3, 4] and cap["shape"] == [4, 192] and cap["dtype"] == "float32"
    assert cap["nan"] == 0 and cap["inf"] == 0 and len(cap["head"]) == 4
    assert {"mean", "std", "absmax", "device", "cycle"} <= cap.keys()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == len(sink) and lines[0]["point"] == sink[0]["point"]
    text = (tmp_path / "stderr.txt").read_text()
    assert "[EAGLE3_DEBUG] cycle 0 target.capture" in text and "layers=[1, 3, 4]" in text


def test_steps_limit_the_cycles(model_dirs):
    sink = []
    trace.configure(enabled=True, steps=2, sink=sink, stream=open("/dev/null", "w"))
    _decode(model_dirs)
    assert {r["cycle"] for r in sink} == {0, 1}


def test_nan_is_counted(model_dirs):
    sink = []
    trace.configure(enabled=True, sink=sink, stream=open("/dev/null", "w"))
    x = torch.ones(3, 4)
    x[0, 0] = float("nan")
    x[1, 1] = float("inf")
    rec = trace.record("target.capture", x, layers=[1])
    assert rec["nan"] == 1 and rec["inf"] == 1 and rec["absmax"] == 1.0


def test_off_computes_nothing(model_dirs, monkeypatch):
    trace.configure(enabled=False)

    def boom(*a, **k):
        raise AssertionError("tracing work done while tracing is off")

    monkeypatch.setattr(trace, "stats", boom)
    monkeypatch.setattr(trace, "record", boom)
    _decode(model_dirs)


def test_environment_switches_it_on(model_dirs, tmp_path):
    out = tmp_path / "t.jsonl"
    code = ("import sys; sys.path[:0] = ['tests', 'tests/observe']; from test_trace import _decode; "
            f"_decode({{'llama': __import__('pathlib').Path({str(model_dirs['llama'])!r})}}, 6)")
    env = {"EAGLE3_DEBUG": "1", "EAGLE3_DEBUG_FILE": str(out), "EAGLE3_DEBUG_STEPS": "1", "PATH": "/usr/bin"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=".")
    assert r.returncode == 0, r.stderr
    assert "[EAGLE3_DEBUG] cycle 0 target.capture" in r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert recs and all(x["cycle"] == 0 for x in recs)
