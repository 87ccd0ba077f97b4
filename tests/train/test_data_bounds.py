"""Data readers stream with a stated bound: a JSONL line or a text file past MAX_RECORD_BYTES is E126 naming the file,
the line and the bound, read no further than the bound (not a 1 GB string held whole); invalid UTF-8 names the line."""

import json

import pytest

import eaglekit.io as io_mod
from eaglekit.cli import main
from eaglekit.errors import InputError
from eaglekit.train.data import read_records


@pytest.fixture
def small_bound(monkeypatch):
    monkeypatch.setattr(io_mod, "MAX_RECORD_BYTES", 1000)


def _records(path):
    return list(read_records(path))


def test_a_long_jsonl_line_names_file_line_and_bound(tmp_path, small_bound):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": "x" * 5000}) + "\n")
    with pytest.raises(InputError) as e:
        _records(f)
    assert e.value.code == "E126" and f"{f}:2" in e.value.message and "MiB" in e.value.message


def test_the_reader_stops_at_the_bound(tmp_path, small_bound, monkeypatch):
    """The line past the bound is never read whole: readline is asked for at most bound + 1 bytes."""
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'{"text": "' + b"y" * 200_000 + b'"}\n')
    sizes = []
    real_open = open

    class Spy:
        def __init__(self, fh):
            self.fh = fh

        def readline(self, n=-1):
            line = self.fh.readline(n)
            sizes.append(len(line))
            return line

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()

    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: Spy(real_open(p, mode, *a, **k))
                        if mode == "rb" else real_open(p, mode, *a, **k))
    with pytest.raises(InputError, match="E126|longer than"):
        _records(f)
    assert max(sizes) <= 1001


def test_a_text_file_past_the_bound_is_refused_before_it_is_read(tmp_path, small_bound):
    f = tmp_path / "big.txt"
    f.write_text("z" * 2000)
    with pytest.raises(InputError) as e:
        _records(tmp_path)
    assert e.value.code == "E126" and str(f) in e.value.message and "2000 bytes" in e.value.message


def test_lines_within_the_bound_read_as_before(tmp_path, small_bound):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'{"text": "a\\u2028b"}\r\n\n{"input_ids": [1, 2, 3]}\n')
    kinds = [k for k, _ in _records(f)]
    assert kinds == ["text", "tokens"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
    with pytest.raises(InputError) as e:
        _records(bad)
    assert e.value.code == "E116" and f"{bad}:2" in e.value.message


def test_train_and_extract_say_so_without_a_traceback(model_dirs, tmp_path, small_bound, capsys):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "x" * 5000}) + "\n")
    t = str(model_dirs["llama"])
    for argv in (["train", "--target", t, "--data", str(f), "--out", str(tmp_path / "run")],
                 ["extract", "--target", t, "--data", str(f), "--out", str(tmp_path / "feats")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "[E126]" in err and f"{f}:1" in err and "Traceback" not in err
