"""`eaglekit generate`: the JSON contract and the text mode."""

import json

import pytest

from eaglekit.cli import main
from eaglekit.draft import new_draft, save_draft
from eaglekit.models import load_target


@pytest.fixture(scope="module")
def draft_dir(model_dirs, tmp_path_factory):
    d = tmp_path_factory.mktemp("draft")
    save_draft(new_draft(load_target(model_dirs["llama"]), seed=2), d, dtype=__import__("torch").float32)
    return d


def _json(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # exactly one object: json.loads fails on anything extra


def test_json_with_draft(model_dirs, draft_dir, capsys):
    t = str(model_dirs["llama"])
    spec = _json(capsys, ["generate", "--target", t, "--draft", str(draft_dir), "--prompt", "def add(a, b):",
                          "--max-new-tokens", "16", "--steps", "3", "--topk", "2", "--draft-tokens", "6", "--json"])
    base = _json(capsys, ["generate", "--target", t, "--draft", str(draft_dir), "--prompt", "def add(a, b):",
                          "--max-new-tokens", "16", "--baseline", "--json"])
    assert spec["token_ids"] == base["token_ids"] and spec["text"] == base["text"]
    m = spec["metrics"]
    assert {"new_tokens", "tokens_per_s", "accept_length", "accept_rate", "verify_count", "per_position"} <= m.keys()
    assert m["new_tokens"] == len(spec["token_ids"]) == 16 and m["accept_length"] >= 1.0
    assert "accept_length" not in base["metrics"] and "per_position" not in base["metrics"]
    # which decoder served, and the products the chooser took, with its reason (on a CPU: aten or onednn, timed)
    for r in (spec, base):
        assert r["metrics"]["backend"] == "ours"
        assert r["metrics"]["products"]["kind"] in ("aten", "onednn")
        assert "timed here" in r["metrics"]["products"]["reason"]
    alone = _json(capsys, ["generate", "--target", t, "--prompt", "def add(a, b):", "--max-new-tokens", "16",
                           "--json"])
    assert alone["token_ids"] == base["token_ids"] and "verify_count" not in alone["metrics"]


def test_text_mode_prompt_file_chat_and_stop(model_dirs, draft_dir, tmp_path, capsys):
    t = str(model_dirs["llama"])
    pf = tmp_path / "p.txt"
    pf.write_text("def add(a, b):\n")
    assert main(["generate", "--target", t, "--draft", str(draft_dir), "--prompt-file", str(pf), "--chat",
                 "--max-new-tokens", "12", "--profile"]) == 0
    cap = capsys.readouterr()
    assert "accept length" in cap.err and "cycle profile" in cap.err and "verify" in cap.err
    full = _json(capsys, ["generate", "--target", t, "--prompt", "def", "--max-new-tokens", "30", "--json"])
    stop = full["text"][3:6]
    if stop.strip():
        a = _json(capsys, ["generate", "--target", t, "--draft", str(draft_dir), "--prompt", "def",
                           "--max-new-tokens", "30", "--stop", stop, "--json"])
        b = _json(capsys, ["generate", "--target", t, "--prompt", "def", "--max-new-tokens", "30", "--stop", stop,
                           "--json"])
        assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]
        # as the server and OpenAI's API: the text ends before the stop string (token_ids keep its tokens)
        assert stop not in a["text"] and full["text"].startswith(a["text"] + stop)
        assert a["stop_reason"] == "stop_string"


def test_sampling_json_is_seeded(model_dirs, draft_dir, capsys):
    t = str(model_dirs["llama"])
    argv = ["generate", "--target", t, "--draft", str(draft_dir), "--prompt", "print(", "--max-new-tokens", "10",
            "--temperature", "0.8", "--top-p", "0.9", "--seed", "3", "--json"]
    assert _json(capsys, argv)["token_ids"] == _json(capsys, argv)["token_ids"]


def test_sweep_writes_table_files_and_names_the_best(tmp_path, capsys):
    from eaglekit.demo import ASSETS

    out = tmp_path / "sw"
    assert main(["sweep", "--target", str(ASSETS / "target"), "--draft", str(ASSETS / "draft"), "--prompt-file",
                 str(ASSETS / "prompts.jsonl"), "--prompts", "2", "--max-new-tokens", "16", "--steps", "2,3",
                 "--topk", "1,2", "--draft-tokens", "4,40", "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    shapes = {(r["steps"], r["topk"], r["draft_tokens"]) for r in res["rows"]}
    assert shapes == {(2, 1, 3), (3, 1, 4), (2, 2, 4), (3, 2, 4)}  # chains forced to steps+1, 40 too big
    assert res["best"] in res["rows"] and res["baseline_tokens_per_s"] > 0
    assert all(r["accept_length"] >= 1 for r in res["rows"])
    assert (out / "sweep.csv").read_text().count("\n") == 5
    assert (out / "sweep.png").stat().st_size > 1000


def test_auto_and_profile_trace(tmp_path, capsys, monkeypatch):
    from eaglekit.demo import ASSETS
    from eaglekit.tune import sweep

    # --auto sweeps a small grid here (the default's ~50 shapes took 28 s of the default tier)
    grid = dict(steps=(2, 3), topk=(1, 2), draft_tokens=(4, 6))
    monkeypatch.setattr(sweep, "AUTO_GRID", grid)
    trace = tmp_path / "trace.json"
    assert main(["generate", "--target", str(ASSETS / "target"), "--draft", str(ASSETS / "draft"), "--prompt",
                 "def parse(self, text):\n", "--max-new-tokens", "16", "--auto", "--profile-trace", str(trace),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["metrics"]["new_tokens"] == 16
    tr = res["tree"]  # one of the grid's shapes (a chain's draft tokens are its steps + 1)
    swept = {(s.steps, s.topk, s.draft_tokens) for s in sweep.shapes(**grid)}
    assert (tr["steps"], tr["topk"], tr["draft_tokens"]) in swept
    text = trace.read_text()
    assert "eaglekit.verify" in text and "eaglekit.draft_tree" in text


def test_one_token_with_a_draft_reports_accept_length_not_applicable(model_dirs, draft_dir, capsys):
    """max_new_tokens 1: the token comes from the prefill, no verify runs: accept length n/a, not 0.0."""
    t = str(model_dirs["llama"])
    argv = ["generate", "--target", t, "--draft", str(draft_dir), "--prompt", "def", "--max-new-tokens", "1"]
    m = _json(capsys, argv + ["--json"])["metrics"]
    assert m["new_tokens"] == 1 and m["verify_count"] == 0
    assert m["accept_length"] is None and m["accept_rate"] is None
    assert main(argv) == 0
    row = [x for x in capsys.readouterr().err.splitlines() if "accept length" in x]
    assert row and "n/a" in row[0]


def test_options_are_declared_once_and_the_api_agrees_with_the_cli():
    """One source of defaults: the parser's defaults are the option objects' defaults, and the API functions
    take those objects (run_regenerate used to default to temperature 0.0 / greedy share 1.0 / batch 32)."""
    import inspect

    from eaglekit.cli import build_parser
    from eaglekit.options import ModelOptions, RegenOptions
    from eaglekit.train.run import run_regenerate

    ns = build_parser().parse_args(["regenerate", "--target", "t", "--data", "d", "--out", "o"])
    assert RegenOptions.from_args(ns) == RegenOptions()
    assert (ns.temperature, ns.greedy_share, ns.batch_size) == (0.8, 0.5, 64)
    assert inspect.signature(run_regenerate).parameters["opts"].default is None  # -> RegenOptions()
    sub = build_parser()._subparsers._group_actions[0].choices
    helps = {}
    for p in sub.values():
        for a in p._actions:
            for flag in ("--capture-layers", "--backend", "--dtype", "--device"):
                if flag in a.option_strings:
                    helps.setdefault(flag, set()).add(a.help.split(" (default ")[0])  # per-command default aside
    assert all(len(h) == 1 for h in helps.values()), helps  # one declaration, one help text
    assert len(helps["--device"]) == 1 and "auto (= cuda if" in next(iter(helps["--device"]))
    assert ModelOptions().device == "auto"


def test_doctor_report_goes_to_stdout(model_dirs, monkeypatch, capsys):
    """`eaglekit doctor ... > report.txt` keeps the report (it went to stderr)."""
    import eaglekit.doctor

    res = {"fault": False, "verdict": "the pair is wired as trained", "findings": [
        {"code": "I306", "severity": "info", "message": "the fingerprint names after_layers [1, 5, 8]"}],
        "trace": [], "probe": [], "seconds": 1.0}
    monkeypatch.setattr(eaglekit.doctor, "run_doctor", lambda *a, **k: res)
    t = str(model_dirs["llama"])
    assert main(["doctor", "--target", t, "--draft", t, "--device", "cpu"]) == 0
    cap = capsys.readouterr()
    assert "I306" in cap.out and "wired as trained" in cap.out and "I306" not in cap.err
    # the doctor's "could not run" (a file of the pair it could not read) is exit 2, and says which file
    res.update(status="could_not_run", exit_code=2,
               findings=[{"code": "E105", "severity": "error", "message": "draft weights truncated"}])
    assert main(["doctor", "--target", t, "--draft", t, "--device", "cpu"]) == 2
    assert "could not run: [E105]" in capsys.readouterr().err
    res.update(fault=True, status="fault", exit_code=1)
    # a finding reached twice (the checks, then the trace's decoder) is listed once, in the table and the verdict
    e207 = {"code": "E207", "severity": "error", "message": "d2t maps outside; it must hold offsets", "fix": "x"}
    res.update(findings=[e207, dict(e207)], verdict="[E207] d2t maps outside; it must hold offsets (fix: x); "
                                                    "[E207] d2t maps outside; it must hold offsets (fix: x). Probe: -")
    assert main(["doctor", "--target", t, "--draft", t, "--device", "cpu", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert len(out["findings"]) == 1 and out["verdict"].count("[E207]") == 1 and out["verdict"].endswith("Probe: -")


def test_generate_json_names_the_transformers_backend_and_its_products(model_dirs, capsys):
    m = _json(capsys, ["generate", "--target", str(model_dirs["llama"]), "--prompt", "def", "--max-new-tokens", "2",
                       "--backend", "hf", "--json"])["metrics"]
    assert m["backend"] == "hf" and m["products"]["kind"] is None and "transformers-backed" in m["products"]["reason"]


def test_every_target_class_names_its_backend():
    from eaglekit.models.base import Target
    from eaglekit.models.deepseek import DeepSeekTarget
    from eaglekit.models.hf import HFTarget
    from eaglekit.models.llama import LlamaTarget
    from eaglekit.models.tp import TPLlamaTarget

    assert Target.backend is None  # (a Target of its own, e.g. a test oracle, says nothing)
    assert [c.backend for c in (LlamaTarget, DeepSeekTarget, TPLlamaTarget, HFTarget)] == ["ours", "deepseek", "tp",
                                                                                         "hf"]


# --- the doctor's exit status is its own verdict, with or without --json --------------------------------------
def test_doctor_exit_status_follows_the_doctors_verdict(model_dirs, monkeypatch, capsys):
    import eaglekit.doctor
    from eaglekit.doctor import DoctorReport, Finding

    t = str(model_dirs["llama"])
    argv = ["doctor", "--target", t, "--draft", t, "--device", "cpu"]
    cases = [  # (the findings of a report, its exit status)
        ([Finding("E107", "error", "draft weights do not fit its config")], 1),  # the pair's files disagree: a fault
        ([Finding("E293", "error", "the engine crashed on the pair; E107 explains it")], 1),
        ([Finding("E105", "error", "draft weights truncated")], 2),  # a file that cannot be read: could not run
        ([Finding("E151", "error", "tokenizer.json is not JSON")], 2),
        ([Finding("W281", "warning", "the draft records nothing of its target")], 3),
    ]
    for findings, rc in cases:
        fault = any(f.severity == "error" for f in findings)
        rep = DoctorReport("v", fault, fault, findings, pair={"target_backend": "ours", "device": "cpu",
                                                              "dtype": "float32", "products": None})
        monkeypatch.setattr(eaglekit.doctor, "run_doctor", lambda *a, _r=rep, **k: _r.to_json())
        assert main(argv + ["--json"]) == rc, findings
        out = json.loads(capsys.readouterr().out)
        assert out["exit_code"] == rc and out["fault"] is (rc == 1)
        assert main(argv) == rc, findings
        cap = capsys.readouterr()
        assert ("could not run" in cap.err) is (rc == 2) and ("COULD NOT RUN" in cap.out) is (rc == 2)
        assert ("FAULT" in cap.out) is (rc == 1)
    # the doctor that could not start (a missing target folder) says so the same way in both forms
    bad = ["doctor", "--target", str(model_dirs["llama"] / "none"), "--draft", t]
    assert main(bad + ["--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "could_not_run" and out["exit_code"] == 2 and out["findings"][0]["code"] == "E101"
    assert main(bad) == 2 and "could not run" in capsys.readouterr().err


# --- values checked where they enter: load_target, SamplingParams, the engine's context check ------------------
def test_load_target_names_a_bad_config_value_before_the_weights_load(model_dirs, tmp_path):
    import shutil

    from eaglekit.errors import InputError

    for field, value, code in (("hidden_size", "64", "E117"), ("num_hidden_layers", -3, "E117"),
                               ("hidden_size", None, "E102")):
        d = tmp_path / f"{field}_{value}"
        shutil.copytree(model_dirs["llama"], d)
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop(field) if value is None else cfg.update({field: value})
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors").write_bytes(b"not weights")  # never read: the config is refused first
        for backend in ("auto", "ours", "hf"):
            with pytest.raises(InputError) as e:
                load_target(d, backend=backend)
            assert e.value.code == code and repr(field) in e.value.message, (field, backend, e.value)


def test_a_seed_outside_a_signed_64_bit_integer_is_refused_at_construction():
    from eaglekit.decoding.sampling import SamplingParams
    from eaglekit.errors import InputError

    for seed in (None, 0, -1, -2**63, 2**63 - 1):
        SamplingParams(temperature=0.5, seed=seed)
    for seed in (2**63, -2**63 - 1, 2**70, True, 1.5, "3"):
        with pytest.raises(InputError) as e:
            SamplingParams(temperature=0.5, seed=seed)
        assert e.value.code == "E125" and "signed 64-bit" in e.value.message


def test_a_prompt_of_the_whole_context_is_told_to_shorten_not_to_ask_for_0_tokens(model_dirs):
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.errors import GenerationError

    t = load_target(model_dirs["llama"])
    ctx = t.info.max_position_embeddings
    for n in (ctx, ctx + 7):
        with pytest.raises(GenerationError) as e:
            Decoder(t).generate([3] * n, 5)
        assert e.value.code == "E309" and f"shorten the prompt by at least {n - ctx + 1} tokens" in e.value.fix
        assert "max-new-tokens" not in e.value.fix
    with pytest.raises(GenerationError) as e:  # a prompt that fits: the new tokens are what to lower (or it)
        Decoder(t).generate([3] * (ctx - 4), 10)
    assert e.value.code == "E301" and "lower --max-new-tokens to 4, or shorten the prompt by 6 tokens" in e.value.fix


@pytest.mark.parametrize("flags", [["--temperature", "1e-300"], ["--temperature", "1", "--top-p", "1e-300"]])
def test_sampling_values_too_small_for_float32_decode_greedily(model_dirs, draft_dir, capsys, flags):
    """A temperature below 1e-5 is greedy by definition; a top_p no token reaches keeps the most likely one: both are
    the greedy output, not a traceback from the sampler over NaN (docs/serving.md)."""
    t = str(model_dirs["llama"])
    argv = ["generate", "--target", t, "--draft", str(draft_dir), "--prompt", "print(", "--max-new-tokens", "8",
            "--json"]
    greedy = _json(capsys, argv)
    assert _json(capsys, argv + flags + ["--seed", "1"])["token_ids"] == greedy["token_ids"]


# --- threads chosen everywhere (issue 63, case 8) ---------------------------------------------------------------
MODEL_COMMANDS = ("generate", "sweep", "doctor", "export", "regenerate", "extract", "train", "eval", "recipe", "demo",
                  "serve")


def test_every_command_that_runs_a_model_takes_threads():
    from eaglekit.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    lacking = [c for c in MODEL_COMMANDS if not any("--threads" in a.option_strings for a in sub.choices[c]._actions)]
    assert lacking == []


@pytest.mark.parametrize("load,cores,torch_n,want", [(0.0, 2, 2, 2), (1.2, 2, 2, 1), (30.0, 2, 2, 1),
                                                      (20.0, 64, 64, 44), (0.0, 8, 4, 4)])
def test_default_threads_leave_the_cores_other_work_holds(monkeypatch, load, cores, torch_n, want):
    import os

    import torch

    from eaglekit.options import default_threads

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_n)
    assert default_threads() == want


def test_generate_sets_threads_given_or_chosen(model_dirs, capsys, monkeypatch):
    import os

    import torch

    t = str(model_dirs["llama"])
    set_to = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (set_to.append(n), real(n)))
    argv = ["generate", "--target", t, "--prompt", "def", "--max-new-tokens", "2", "--device", "cpu"]
    assert main(argv + ["--threads", "1"]) == 0 and set_to[-1] == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))  # a loaded machine: one thread
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert main(argv) == 0 and set_to[-1] == 1
    assert main(argv + ["--threads", "0"]) == 2 and "--threads 0" in capsys.readouterr().err
