"""Interop: SGLang/SpecForge, vLLM speculators and EAGLE-reference folders, each engine's layer-id convention."""

import json

import pytest
import torch
from folders import write_specforge_folder
from safetensors.torch import load_file, save_file

from eaglekit.capture import CaptureSpec
from eaglekit.cli import main
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import load_draft, new_draft
from eaglekit.interop.export import export
from eaglekit.interop.inspect import inspect_folder
from eaglekit.models import load_target


@pytest.fixture(scope="module")
def pair(model_dirs):
    t = load_target(model_dirs["llama"], dtype="float64")  # 8 layers: default after_layers [1, 3, 4]
    d = new_draft(t, seed=11, draft_vocab_size=40, dtype=torch.float64)
    hot = torch.arange(40) * 2 + 1
    with torch.no_grad():
        d.d2t.copy_(hot - torch.arange(40))
        d.t2d.zero_()
        d.t2d[hot] = True
    return t, d


@pytest.mark.parametrize("fmt", ["sglang", "specforge", "vllm"])
def test_round_trip_keeps_tensors_capture_and_output(pair, tmp_path, fmt):
    t, d = pair
    export(d, tmp_path / fmt, fmt, t, dtype=torch.float64)
    back = load_draft(tmp_path / fmt, dtype=torch.float64, embed_weight=t.embed_weight())
    assert back.config.capture == CaptureSpec((1, 3, 4))
    assert back.source_format.name == ("vllm" if fmt == "vllm" else "eaglekit")
    a, b = d.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    prompt = [7, 8, 9, 10]
    sh = TreeShape(3, 2, 6)
    assert Decoder(t, back, sh).generate(prompt, 20, eos_ids=()).token_ids == \
        Decoder(t, d, sh).generate(prompt, 20, eos_ids=()).token_ids


def test_each_engine_gets_its_own_ids_for_the_default_capture(pair, tmp_path):
    """n = 8 layers: SGLang [1, n//2-1, n-4] = [1, 3, 4], vLLM [2, n//2, n-3] = [2, 4, 5]; both come back
    as after_layers [1, 3, 4], and inspect says so in words."""
    t, d = pair
    export(d, tmp_path / "s", "sglang", t)
    export(d, tmp_path / "v", "vllm", t)
    s = json.loads((tmp_path / "s" / "config.json").read_text())
    v = json.loads((tmp_path / "v" / "config.json").read_text())
    assert s["architectures"] == ["LlamaForCausalLMEagle3"]
    assert s["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert v["architectures"] == ["Eagle3Speculator"] and v["speculators_config"]["algorithm"] == "eagle3"
    assert v["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert v["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert v["transformer_layer_config"]["num_hidden_layers"] == 1 and v["draft_vocab_size"] == 40
    assert "layers.0.self_attn.q_proj.weight" in load_file(tmp_path / "v" / "model.safetensors")
    for folder in ("s", "v"):
        assert load_draft(tmp_path / folder, embed_weight=t.embed_weight()).config.capture.after_layers == (1, 3, 4)
        r = inspect_folder(tmp_path / folder, t)
        assert r["after_layers"] == [1, 3, 4] and r["sglang_config_ids"] == [1, 3, 4] and r["vllm_ids"] == [2, 4, 5]
        text = "\n".join(r["summary"])
        assert "outputs of layers [1, 3, 4] = the inputs of layers [2, 4, 5] for this 8-layer target" in text
        assert "that is the default set" in text and not r["problems"]


def test_sglang_rule_warning_when_the_first_id_is_not_1(pair, tmp_path, capsys):
    t, d = pair
    d2 = new_draft(t, capture=CaptureSpec((2, 4, 6)), seed=2)
    assert export(d2, tmp_path / "x", "sglang", t)  # warns: the two SGLang rules read [2, 4, 6] differently
    assert not export(d, tmp_path / "y", "sglang", t)  # the default starts at 1: both rules agree


def write_vllm_folder(folder, H=64, heads=4, kv=2, inter=96, vocab=96, dvocab=48, ids=(2, 4, 5), fc_bias=True):
    """A speculators folder written from the field list: Eagle3Speculator, transformer_layer_config, layers.0."""
    hot = write_specforge_folder(folder, H=H, heads=heads, kv=kv, inter=inter, vocab=vocab, dvocab=dvocab,
                                 layer_ids=None)
    w = load_file(folder / "model.safetensors")
    w = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in w.items()}
    if fc_bias:
        w["fc.bias"] = torch.zeros(H, dtype=torch.bfloat16)
    save_file(w, folder / "model.safetensors")
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
           "transformer_layer_config": {"model_type": "llama", "hidden_size": H, "intermediate_size": inter,
                                        "num_attention_heads": heads, "num_key_value_heads": kv,
                                        "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "vocab_size": vocab,
                                        "max_position_embeddings": 512, "rope_theta": 10000.0},
           "draft_vocab_size": dvocab, "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": list(ids),
           "speculators_config": {"algorithm": "eagle3", "proposal_methods": [], "default_proposal_method": "greedy",
                                  "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return hot


def test_vllm_speculators_folder_from_the_field_list(model_dirs, tmp_path):
    write_vllm_folder(tmp_path / "v")
    t = load_target(model_dirs["llama"], dtype="float64")
    d = load_draft(tmp_path / "v", dtype=torch.float64, embed_weight=t.embed_weight())
    assert d.config.capture == CaptureSpec((1, 3, 4))  # vLLM ids [2, 4, 5] mean "input of layer"
    assert d.source_format.ids_convention == "input_of" and d.config.fc_bias
    prompt = [3, 9, 27]
    assert Decoder(t, d, TreeShape(3, 1, 4)).generate(prompt, 16, eos_ids=()).token_ids == \
        Decoder(t).generate(prompt, 16, eos_ids=()).token_ids
    assert "input of layer i" in inspect_folder(tmp_path / "v", t)["summary"][0]


def test_eagle_reference_checkpoint_from_the_field_list(model_dirs, tmp_path):
    """SafeAILab's EAGLE-3 layout: a one-layer LlamaForCausalLM config, pytorch_model.bin, no ids (its target
    code captures the inputs of layers [2, n//2, n-3])."""
    f = tmp_path / "eagle"
    write_specforge_folder(f, layer_ids=None)
    w = load_file(f / "model.safetensors")
    (f / "model.safetensors").unlink()
    torch.save({k: (v.float() if v.is_floating_point() else v) for k, v in w.items()}, f / "pytorch_model.bin")
    cfg = json.loads((f / "config.json").read_text())
    cfg.update(architectures=["LlamaForCausalLM"], bias=False)
    (f / "config.json").write_text(json.dumps(cfg))
    t = load_target(model_dirs["llama"])
    d = load_draft(f, embed_weight=t.embed_weight())
    assert d.source_format.name == "eagle" and d.config.capture is None
    assert Decoder(t, d).capture == CaptureSpec.default(8)
    r = inspect_folder(f, t)
    assert r["capture_defaulted"] and r["is_default_capture"] and "EAGLE reference" in r["summary"][0]


def test_inspect_names_broken_folders(model_dirs, tmp_path):
    write_specforge_folder(tmp_path / "a")
    w = load_file(tmp_path / "a" / "model.safetensors")
    w["d2t"] = torch.arange(48)  # absolute ids where offsets belong
    w.pop("midlayer.hidden_norm.weight")
    w["mystery.weight"] = torch.zeros(2)
    save_file(w, tmp_path / "a" / "model.safetensors")
    r = inspect_folder(tmp_path / "a")
    assert "absolute ids" in r["d2t"]
    assert r["missing_tensors"] == ["midlayer.hidden_norm.weight"] and r["extra_tensors"] == ["mystery.weight"]


def test_cli_export_and_inspect(model_dirs, tmp_path, capsys):
    from eaglekit.draft import save_draft

    t = load_target(model_dirs["llama"])
    save_draft(new_draft(t, seed=1), tmp_path / "d")
    assert main(["export", str(tmp_path / "v"), "--draft", str(tmp_path / "d"), "--to", "vllm", "--target",
                 str(model_dirs["llama"])]) == 0
    assert "capture ids [2, 4, 5] (input of layer) = after_layers [1, 3, 4]" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "v"), "--target", str(model_dirs["llama"]), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["format"] == "vllm" and r["after_layers"] == [1, 3, 4]
