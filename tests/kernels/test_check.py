"""`eaglekit kernels check` (eaglekit.kernels.check): a row for every kind with its reason, the checks that run on a
CPU pass, and a failing check makes the exit status 1."""

import json

import pytest
import torch

from eaglekit.kernels import check


def _json(capsys, argv) -> tuple[int, dict]:
    rc = check.main(["--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a CPU machine reports")
def test_on_a_cpu_the_cpu_kinds_pass_and_the_gpu_kinds_say_why_not(capsys):
    rc, out = _json(capsys, [])
    rows = {r["kind"]: r for r in out["kinds"]}
    assert rc == 0 and out["ok"] is True
    assert list(rows) == list(check.KINDS) == ["aten", "onednn", "invariant", "hopper", "int8", "topk", "moe"]
    assert rows["aten"]["runs"] and rows["aten"]["check"] == "pass" and rows["aten"]["seconds"] >= 0
    from eaglekit.kernels.products import onednn_available

    assert rows["onednn"]["check"] == ("pass" if onednn_available() else "-")
    for kind in ("invariant", "hopper", "int8", "topk", "moe"):
        assert not rows[kind]["runs"] and rows[kind]["check"] == "-" and rows[kind]["seconds"] is None
        assert "CUDA" in rows[kind]["reason"], rows[kind]


def test_the_table_lists_every_kind_with_its_reason(capsys, monkeypatch):
    monkeypatch.setitem(check.KINDS, "hopper", (lambda: "it needs an sm_90 GPU (planted)", check.check_hopper, "cuda"))
    assert check.main(["--only", "aten", "hopper"]) == 0
    out = capsys.readouterr().out
    assert "aten" in out and "pass" in out and "hopper" in out and "sm_90" in out and "onednn" not in out


def test_a_failing_check_exits_1(capsys, monkeypatch):
    def planted(device):
        raise check.CheckFailed("product: row 2 alone differs from row 2 inside 5 rows (planted)")

    monkeypatch.setitem(check.KINDS, "aten", (lambda: None, planted, "cpu"))
    rc, out = _json(capsys, ["--only", "aten"])
    assert rc == 1 and out["ok"] is False
    assert out["kinds"][0]["check"] == "FAIL" and "planted" in out["kinds"][0]["reason"]
    assert check.main(["--only", "aten"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_a_crashing_build_is_a_failed_check_not_a_traceback(capsys, monkeypatch):
    from eaglekit.kernels import hopper

    def build_fails(device):
        raise hopper.Unavailable("nvcc could not build hopper.cu: (planted)")

    monkeypatch.setitem(check.KINDS, "hopper", (lambda: None, build_fails, "cpu"))
    rc, out = _json(capsys, ["--only", "hopper"])
    assert rc == 1 and "nvcc could not build" in out["kinds"][0]["reason"]


def test_the_invariance_check_catches_a_product_that_depends_on_its_batch():
    def batch_dependent(x, w):  # (a row's bits move with the number of rows beside it)
        return x @ w.T + 1e-3 * x.shape[0]

    with pytest.raises(check.CheckFailed, match="not batch-invariant"):
        check._product_check(batch_dependent, torch.float32, "cpu", 64, 128, 1e-1, True)


def test_an_unknown_kind_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        check.main(["--only", "bulk"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_the_cli_runs_the_check(capsys):
    from eaglekit.cli import main

    assert main(["kernels", "check", "--json", "--only", "aten"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and [r["kind"] for r in out["kinds"]] == ["aten"]
