"""Bad input gets an error that names the problem, the numbers and the fix; never a torch traceback."""

import json
import shutil

import pytest
import torch
from folders import write_specforge_folder

from eaglekit.capture import CaptureSpec
from eaglekit.cli import main
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.sampling import SamplingParams
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import load_draft
from eaglekit.errors import ContractError, GenerationError, InputError
from eaglekit.models import load_target


def test_missing_folder():
    with pytest.raises(InputError, match="does not exist") as e:
        load_target("/no/such/model")
    assert e.value.code == "E101"


def test_missing_weights(model_dirs, tmp_path):
    d = tmp_path / "noweights"
    d.mkdir()
    shutil.copy(model_dirs["llama"] / "config.json", d)
    with pytest.raises(InputError, match="no model.safetensors") as e:
        load_target(d, backend="ours")
    assert e.value.code == "E106"


def test_truncated_checkpoint(model_dirs, tmp_path):
    d = tmp_path / "trunc"
    shutil.copytree(model_dirs["llama"], d)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated or corrupt") as e:
        load_target(d, backend="ours")
    assert e.value.code == "E105"


def test_unsupported_architecture(tmp_path):
    d = tmp_path / "alien"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "alien_lm", "vocab_size": 10}))
    with pytest.raises(InputError) as e:
        load_target(d)
    msg = str(e.value)
    assert "llama, mistral, qwen2, qwen3" in msg and "--backend hf" in msg and e.value.code == "E104"
    with pytest.raises(InputError, match="not one of the compact decoder's families"):
        load_target(d, backend="ours")


def test_prompt_longer_than_context(model_dirs):
    t = load_target(model_dirs["llama"])
    with pytest.raises(GenerationError, match=r"prompt \(500 tokens\) plus max_new_tokens \(20\) exceeds") as e:
        Decoder(t).generate(list(range(3, 96)) * 5 + [3] * 35, 20)
    assert e.value.code == "E301" and "--max-new-tokens" in str(e.value)


@pytest.mark.parametrize("kw", [dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_p=0.0),
                                dict(top_p=1.5), dict(top_k=-3), dict(top_k=2.5)])
def test_invalid_sampling_parameters(kw):
    with pytest.raises(GenerationError) as e:
        SamplingParams(**kw)
    assert e.value.code == "E302"


@pytest.mark.parametrize("shape", [(0, 1, 1), (3, 1, 6), (2, 2, 9), (2, 2, 1)])
def test_invalid_tree_shapes(shape):
    with pytest.raises(GenerationError) as e:
        TreeShape(*shape)
    assert e.value.code == "E303"


def test_draft_vocab_larger_than_target(model_dirs, tmp_path):
    write_specforge_folder(tmp_path / "big", dvocab=200, with_d2t=False, extra_cfg={"draft_vocab_size": 200})
    t = load_target(model_dirs["llama"])
    # without d2t a reduced-vocab draft is refused at load; give one that claims identity offsets
    from safetensors.torch import load_file, save_file

    w = load_file(tmp_path / "big" / "model.safetensors")
    w["d2t"] = torch.zeros(200, dtype=torch.long)
    save_file(w, tmp_path / "big" / "model.safetensors")
    d = load_draft(tmp_path / "big", embed_weight=t.embed_weight())
    with pytest.raises(ContractError, match=r"draft vocabulary \(200\) is larger than the target's \(96\)"):
        Decoder(t, d)


def test_draft_hidden_size_does_not_fit(model_dirs, tmp_path):
    t = load_target(model_dirs["llama"])
    write_specforge_folder(tmp_path / "h32", H=32, Ht=32, heads=4, kv=2)
    with pytest.raises(ContractError, match=r"hidden size 32 .* do not fit the target embedding \(96, 64\)"):
        load_draft(tmp_path / "h32", embed_weight=t.embed_weight())
    # a draft that declares a target_hidden_size other than the target's
    write_specforge_folder(tmp_path / "ht", H=64, Ht=128)
    d = load_draft(tmp_path / "ht", embed_weight=t.embed_weight())
    with pytest.raises(ContractError, match="target hidden size of 128") as e:
        Decoder(t, d)
    assert e.value.code == "E204"


def test_width_mismatch_from_an_extra_capture(model_dirs, tmp_path):
    write_specforge_folder(tmp_path / "d")
    t = load_target(model_dirs["llama"])
    d = load_draft(tmp_path / "d", embed_weight=t.embed_weight())
    with pytest.raises(ContractError) as e:
        Decoder(t, d, capture=CaptureSpec((-1, 1, 3, 4)))
    assert "draft fc expects 192 = 3 x 64 features but the target capture yields 256 = 4 x 64 " \
           "(after_layers -1, 1, 3, 4" in str(e.value)


def test_d2t_as_absolute_ids_is_refused(model_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    write_specforge_folder(tmp_path / "abs")
    w = load_file(tmp_path / "abs" / "model.safetensors")
    w["d2t"] = w["d2t"] + torch.arange(48)  # absolute ids where offsets belong
    save_file(w, tmp_path / "abs" / "model.safetensors")
    t = load_target(model_dirs["llama"])
    d = load_draft(tmp_path / "abs", embed_weight=t.embed_weight())
    with pytest.raises(ContractError, match="offsets") as e:
        Decoder(t, d)
    assert e.value.code == "E207"


def test_a_d2t_of_another_length_than_the_draft_vocabulary_is_refused(model_dirs, tmp_path):
    """A draft built in memory (no loader between) whose d2t is not one offset per draft id: E214, not an indexing
    error from inside torch."""
    from eaglekit.draft import pair_problems

    write_specforge_folder(tmp_path / "d")
    t = load_target(model_dirs["llama"])
    d = load_draft(tmp_path / "d", embed_weight=t.embed_weight())
    assert [e.code for e in pair_problems(d, t)[1]] == []
    d.d2t = d.d2t[:-1]
    problems = pair_problems(d, t)[1]
    assert [e.code for e in problems] == ["E214"] and "d2t holds 47 entries" in str(problems[0])
    with pytest.raises(ContractError) as e:
        Decoder(t, d)
    assert e.value.code == "E214"


def test_missing_d2t_with_reduced_vocab_is_refused(model_dirs, tmp_path):
    write_specforge_folder(tmp_path / "nod2t", with_d2t=False)
    t = load_target(model_dirs["llama"])
    with pytest.raises(ContractError, match="no d2t tensor") as e:
        load_draft(tmp_path / "nod2t", embed_weight=t.embed_weight())
    assert e.value.code == "E210"


def test_draft_for_another_target_is_refused(model_dirs, tmp_path):
    from eaglekit.draft import new_draft, save_draft

    qwen = load_target(model_dirs["qwen2"])
    save_draft(new_draft(qwen), tmp_path / "q")
    llama = load_target(model_dirs["llama"])
    d = load_draft(tmp_path / "q", embed_weight=llama.embed_weight())
    with pytest.raises(ContractError, match="fingerprint") as e:
        Decoder(llama, d)
    assert e.value.code == "E208"
    Decoder(llama, d, allow_other_target=True)


def test_a_full_model_passed_as_draft(model_dirs):
    t = load_target(model_dirs["llama"])
    with pytest.raises(InputError, match="not an EAGLE-3 draft"):
        load_draft(model_dirs["llama"], embed_weight=t.embed_weight())


def test_cli_prints_the_error_without_a_traceback(model_dirs, tmp_path, capsys):
    rc = main(["generate", "--target", str(tmp_path / "nothing"), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "[E101]" in err and "Traceback" not in err
    rc = main(["generate", "--target", str(model_dirs["llama"]), "--prompt", "def", "--temperature", "-2"])
    err = capsys.readouterr().err
    assert rc == 2 and "[E302] temperature must be" in err and "fix:" in err


# --- issue 14 (1, 2, 6): a bad option value is an E108 that names the flag, before any model loads -------------
def _bad_cases(t, pf):
    g = ["generate", "--target", t, "--prompt", "def"]
    return [
        (g + ["--max-new-tokens", "-5"], "--max-new-tokens"),  # was: a RuntimeError traceback
        (g + ["--device", "tpu"], "--device"),  # was: a RuntimeError traceback from weight loading
        (g + ["--temperature", "inf"], "--temperature"),  # was: accepted
        (g + ["--stop", ""], "--stop"),  # was: accepted
        (["sweep", "--target", t, "--draft", t, "--prompt-file", pf, "--prompts", "-1"], "--prompts"),
        (["sweep", "--target", t, "--draft", t, "--prompt-file", pf, "--steps", "0,3"], "--steps"),
        (["sweep", "--target", t, "--draft", t, "--prompt-file", pf, "--max-new-tokens", "-1"], "--max-new-tokens"),
        (["demo", "--threads", "-1"], "--threads"),
        (["demo", "--prompts", "0"], "--prompts"),
        (["demo", "--max-new-tokens", "-3"], "--max-new-tokens"),
        (["regenerate", "--target", t, "--data", pf, "--out", pf + ".o", "--batch-size", "0"], "--batch-size"),
        (["regenerate", "--target", t, "--data", pf, "--out", pf + ".o", "--greedy-share", "1.5"], "--greedy-share"),
        (["regenerate", "--target", t, "--data", pf, "--out", pf + ".o", "--max-new-tokens", "-1"],
         "--max-new-tokens"),
        (["extract", "--target", t, "--data", pf, "--out", pf + ".o", "--shard-size", "0"], "--shard-size"),
        (["train", "--target", t, "--data", pf, "--out", pf + ".o", "--batch-size", "-2"], "--batch-size"),
        (["train", "--target", t, "--data", pf, "--out", pf + ".o", "--heldout", "2"], "--heldout"),
        (["eval", "--target", t, "--draft", t, "--prompt-file", pf, "--max-new-tokens", "-5"], "--max-new-tokens"),
        (["eval", "--target", t, "--draft", t, "--data", pf, "--batch-size", "0"], "--batch-size"),
    ]


def test_bad_option_values_are_clear_errors(model_dirs, tmp_path, capsys):
    pf = tmp_path / "p.txt"
    pf.write_text("def f():\n")
    for argv, flag in _bad_cases(str(model_dirs["llama"]), str(pf)):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "[E108]" in err and flag in err and "fix:" in err, (argv, err)
    assert not (tmp_path / "p.txt.o").exists()  # refused before any work


def test_doctor_bad_counts_and_device(model_dirs, capsys):
    t = str(model_dirs["llama"])
    for extra in (["--prompts", "-2"], ["--device", "tpu"], ["--max-new-tokens", "-1"]):
        assert main(["doctor", "--target", t, "--draft", t, *extra]) == 2
        assert "[E108]" in capsys.readouterr().err


def test_negative_max_new_tokens_in_the_python_api(model_dirs):
    """The API checks too (with and without a draft: the draft path used to return an empty output)."""
    from eaglekit.draft import new_draft

    t = load_target(model_dirs["llama"])
    for dec in (Decoder(t), Decoder(t, new_draft(t))):
        with pytest.raises(GenerationError) as e:
            dec.generate([3, 4, 5], -5)
        assert e.value.code == "E306"


def test_infinite_temperature_is_refused():
    with pytest.raises(GenerationError) as e:
        SamplingParams(float("inf"))
    assert e.value.code == "E302"


def test_device_auto_means_the_same_in_every_command(model_dirs, monkeypatch):
    """--device auto = cuda if visible, else cpu; the doctor used to map it to cpu."""
    import eaglekit.doctor

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(eaglekit.doctor, "run_doctor", lambda *a, **k: seen.setdefault("device", a[0].device_name) and
                        {"fault": False, "verdict": "", "findings": [], "probe": []})
    t = str(model_dirs["llama"])
    main(["doctor", "--target", t, "--draft", t, "--device", "auto", "--json"])
    assert seen["device"] == "cuda"
    from eaglekit.pair import pick_device

    assert pick_device("auto") == "cuda"


# --- issue 44: the last CLI tracebacks and misleading messages, each a coded error before anything loads -----
def _copy_with(src, dst, edit):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_inputs_that_gave_tracebacks_or_wrong_messages(model_dirs, tmp_path, capsys, monkeypatch):
    import eaglekit.pair
    from eaglekit.demo import ASSETS

    def never(*a, **k):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(eaglekit.pair, "load_pair", never)
    t = model_dirs["llama"]
    ts = str(t)
    (tmp_path / "bad.txt").write_bytes(b"def f(\xff):")
    (tmp_path / "data.jsonl").write_text('{"text": 5}\n')
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "long.txt").write_text("a b c d " * 400)
    draft = tmp_path / "draft"
    draft.mkdir()
    cfg = json.loads((ASSETS / "draft" / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = "1,5,8"
    (draft / "config.json").write_text(json.dumps(cfg))
    neg = _copy_with(t, tmp_path / "neg", lambda c: c.update(num_hidden_layers=-3))
    nohidden = _copy_with(t, tmp_path / "nohidden", lambda c: c.pop("hidden_size"))
    strhidden = _copy_with(t, tmp_path / "strhidden", lambda c: c.update(hidden_size="64"))
    g = ["generate", "--device", "cpu", "--max-new-tokens", "4"]
    cases = [
        (g + ["--target", ts, "--prompt", "abc\udcff"], "E116", "--prompt is not valid UTF-8: byte(s) ff"),
        (g + ["--target", ts, "--prompt-file", str(tmp_path / "bad.txt")], "E116", "byte 0xff at offset 6"),
        (g + ["--target", ts, "--prompt", "x", "--seed", str(2**70)], "E108", "--seed"),
        (g + ["--target", ts, "--draft", str(draft), "--prompt", "x"], "E117", "eagle_aux_hidden_state_layer_ids"),
        (g + ["--target", neg, "--prompt", "x"], "E117", "'num_hidden_layers' is -3"),
        (g + ["--target", nohidden, "--prompt", "x"], "E102", "lacks the field 'hidden_size'"),
        (g + ["--target", strhidden, "--prompt", "x"], "E117", "'hidden_size' is \"64\""),  # was E109 (tokenizer)
        (g + ["--target", ts, "--prompt-file", str(tmp_path)], "E118", "is a directory, expected a file"),
        (g + ["--target", str(tmp_path / "a_file"), "--prompt", "x"], "E118", "is a file, expected a folder"),
        (g + ["--target", ts, "--prompt-file", str(tmp_path / "long.txt")], "E309", "too long"),
        (["train", "--target", ts, "--data", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "run")],
         "E119", "'text' is 5, not a string"),
        (["train", "--target", ts, "--data", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "a_file")],
         "E118", "is a file, expected a folder"),
    ]
    for argv, code, words in cases:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and f"[{code}]" in err and words in err and "Traceback" not in err, (argv, err)
    assert "max-new-tokens to 0" not in err


# --- the error-code registry ---------------------------------------------------------------------------------
def test_every_code_raised_is_registered_and_documented():
    import re
    from pathlib import Path

    import eaglekit
    from eaglekit.errors import CODES

    root = Path(eaglekit.__file__).parent
    used = set()
    for f in root.rglob("*.py"):
        text = f.read_text()
        used |= set(re.findall(r'code="([EWI]\d{3})"', text))
        used |= set(re.findall(r'Finding\(\s*"([EWI]\d{3})"', text))
        used |= set(re.findall(r'"refused": "([EWI]\d{3})"', text))
    assert len(used) > 40  # the pattern finds the codes (a test that cannot pass vacuously)
    assert sorted(used - set(CODES)) == []
    docs = (root.parent / "docs" / "errors.md").read_text()
    assert [c for c in CODES if f'<a id="{c.lower()}"></a>{c} |' not in docs] == []
    assert "see: docs/errors.md#e101" in str(InputError("x", code="E101"))


def test_errors_md_is_the_generated_page_with_each_section_once():
    """docs/errors.md is what docs/make_errors_md.py renders now (run it after adding a code), and each class has one
    section, none empty: the registry's insertion order used to open E1xx, E2xx and I3xx twice."""
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_errors_md", root / "docs" / "make_errors_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.render()
    assert (root / "docs" / "errors.md").read_text() == text
    heads = re.findall(r"^## (\S+):", text, flags=re.M)
    assert len(heads) == len(set(heads)) and heads, heads
    for sec in re.split(r"^## ", text, flags=re.M)[1:]:
        assert "| <a id=" in sec and sec.split(":", 1)[1].split("\n", 1)[0].strip(), sec[:80]
# --- every folder file its own named error; a full disk; a cut log (issue 14 items 3-5) ------------------------
@pytest.mark.parametrize("name,code", [("config.json", "E150"), ("tokenizer.json", "E151"),
                                       ("tokenizer_config.json", "E152"), ("generation_config.json", "E153")])
@pytest.mark.parametrize("junk", ["{not json", "[1, 2]"], ids=["not-json", "not-an-object"])
def test_a_broken_target_folder_file_is_named(model_dirs, tmp_path, capsys, name, code, junk):
    d = tmp_path / "t"
    shutil.copytree(model_dirs["llama"], d)
    (d / name).write_text(junk)
    for rc_args in (["generate", "--target", str(d), "--prompt", "def"],):
        rc = main(rc_args)
        err = capsys.readouterr().err
        assert rc == 2 and f"[{code}]" in err and name in err and "Traceback" not in err, err
    with pytest.raises(InputError) as e:
        from eaglekit.tokenizer import load_tokenizer

        load_tokenizer(d)
    assert e.value.code == code and name in e.value.message


def test_a_broken_weights_index_is_named(model_dirs, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(model_dirs["llama"], d)
    (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
    (d / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(InputError) as e:
        load_target(d, backend="ours")
    assert e.value.code == "E154" and "model.safetensors.index.json" in e.value.message


def test_a_broken_draft_config_is_named(tmp_path):
    write_specforge_folder(tmp_path / "d")
    (tmp_path / "d" / "config.json").write_text("{")
    with pytest.raises(InputError) as e:
        load_draft(tmp_path / "d")
    assert e.value.code == "E150" and "config.json" in e.value.message


def test_a_full_disk_in_an_atomic_write_is_named_and_leaves_the_old_file(tmp_path, monkeypatch):
    import errno
    import os

    from eaglekit.errors import EaglekitError
    from eaglekit.io import atomic_write_bytes

    f = tmp_path / "state.pt"
    f.write_bytes(b"old checkpoint")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(EaglekitError) as e:
        atomic_write_bytes(f, b"x" * 1000)
    assert e.value.code == "E160" and "no space left" in e.value.message and str(tmp_path) in e.value.message
    assert "run the same command again" in e.value.fix
    assert f.read_bytes() == b"old checkpoint" and sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


# --- causes named right (issue 63, case 7) ------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,shown", [("initializer_range", float("nan"), "NaN"),
                                               ("rope_theta", float("inf"), "Infinity"),
                                               ("rope_scaling", {"rope_type": "linear", "factor": float("-inf")},
                                                "-Infinity")])
def test_a_non_finite_config_value_is_a_config_error_naming_the_field(model_dirs, tmp_path, capsys, field, value,
                                                                       shown):
    """NaN initializer_range was reported as E109 "re-save the tokenizer" (transformers' tokenizer reads config.json);
    rope_theta Infinity ran. Both are E117 naming the field, on the CLI and through load_target."""
    d = tmp_path / "t"
    shutil.copytree(model_dirs["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg[field] = value
    (d / "config.json").write_text(json.dumps(cfg))
    name = field + (".factor" if isinstance(value, dict) else "")
    assert main(["generate", "--target", str(d), "--prompt", "def", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "[E117]" in err and f"'{name}' is {shown}" in err and "tokenizer" not in err, err
    with pytest.raises(InputError) as e:
        load_target(d)
    assert e.value.code == "E117"


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_a_broken_tokenizer_link_is_named_as_one(model_dirs, tmp_path, capsys, kind):
    """A tokenizer.json symlink loop was E109 "install sentencepiece or tiktoken"."""
    import os

    d = tmp_path / "t"
    shutil.copytree(model_dirs["llama"], d)
    (d / "tokenizer.json").unlink()
    os.symlink(d / "tokenizer.json" if kind == "loop" else d / "gone.json", d / "tokenizer.json")
    assert main(["generate", "--target", str(d), "--prompt", "def", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "[E128]" in err and "tokenizer.json" in err and ("loops" if kind == "loop" else "does not exist") in err
    assert "sentencepiece" not in err


def test_a_looping_data_path_is_named_as_one(tmp_path, capsys):
    import os

    os.symlink(tmp_path / "d.jsonl", tmp_path / "d.jsonl")
    from eaglekit.io import need_file

    with pytest.raises(InputError) as e:
        need_file(tmp_path / "d.jsonl", "--data")
    assert e.value.code == "E128" and "loops" in e.value.message
