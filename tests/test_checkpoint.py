"""Draft folders: our writer, and a folder in the SpecForge / SGLang layout written by hand."""

import json

import pytest
import torch
from safetensors.torch import save_file

from eaglekit.capture import CaptureSpec
from eaglekit.decoding.engine import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import load_draft, new_draft, save_draft
from eaglekit.draft.checkpoint import t2d_from_d2t
from eaglekit.models import load_target


def write_specforge_folder(folder, H=64, Ht=64, heads=4, kv=2, inter=96, vocab=96, dvocab=48, layer_ids=(1, 3, 4),
                           seed=0, ids_key="eagle_config", with_d2t=True, extra_cfg=None, n_caps=3):
    """A draft folder as SpecForge writes it: no eaglekit block, ids in the 'output of layer' meaning."""
    g = torch.Generator().manual_seed(seed)
    hd = H // heads

    def r(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16)

    hot = torch.randperm(vocab, generator=g)[:dvocab].sort().values  # the target ids the draft may propose
    w = {
        "fc.weight": r(H, n_caps * Ht),
        "midlayer.self_attn.q_proj.weight": r(heads * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": r(kv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": r(kv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": r(H, heads * hd),
        "midlayer.mlp.gate_proj.weight": r(inter, H),
        "midlayer.mlp.up_proj.weight": r(inter, H),
        "midlayer.mlp.down_proj.weight": r(H, inter),
        "midlayer.input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "midlayer.post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        "norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "lm_head.weight": r(dvocab, H),
    }
    if with_d2t:
        w["d2t"] = hot - torch.arange(dvocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[hot] = True
        w["t2d"] = t2d
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
           "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": dvocab, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "rope_theta": 10000.0}
    if layer_ids is not None:
        if ids_key == "eagle_config":
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True}
        else:
            cfg[ids_key] = list(layer_ids)
    if Ht != H:
        cfg["target_hidden_size"] = Ht
    cfg.update(extra_cfg or {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(w, folder / "model.safetensors")
    return hot


def test_specforge_folder_loads_and_runs(model_dirs, tmp_path):
    hot = write_specforge_folder(tmp_path / "sf")
    target = load_target(model_dirs["llama"], backend="ours", dtype="float64")
    draft = load_draft(tmp_path / "sf", dtype=torch.float64, embed_weight=target.embed_weight())
    assert draft.config.capture == CaptureSpec((1, 3, 4))  # ids read as SGLang's "output of layer"
    assert torch.equal(draft.to_target_ids(torch.arange(48)), hot)
    dec = Decoder(target, draft, TreeShape(3, 2, 6))
    prompt = [5, 9, 11, 40]
    res = dec.generate(prompt, 24, eos_ids=())
    assert res.token_ids == Decoder(target).generate(prompt, 24, eos_ids=()).token_ids
    assert dec.capture == CaptureSpec((1, 3, 4))


def test_round_trip_keeps_tensors_and_contract(model_dirs, tmp_path):
    target = load_target(model_dirs["qwen3"], backend="ours")
    draft = new_draft(target, capture=CaptureSpec((0, 3, 6)), seed=4, draft_vocab_size=40)
    with torch.no_grad():
        draft.d2t.copy_(torch.arange(40) * 2 - torch.arange(40))  # target ids 0, 2, 4, ...
        draft.t2d.copy_(t2d_from_d2t(draft.d2t, 96))
    save_draft(draft, tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]
    assert cfg["eaglekit"]["capture"] == {"convention": "after_layers", "after_layers": [0, 3, 6]}
    assert cfg["eaglekit"]["target"]["fingerprint"] == target.info.fingerprint
    back = load_draft(tmp_path / "d", embed_weight=target.embed_weight())
    assert back.config.capture == draft.config.capture
    a, b = draft.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert int(back.t2d.sum()) == 40 and bool(back.t2d[78]) and not bool(back.t2d[1])


def test_missing_ids_fall_back_to_the_default(model_dirs, tmp_path):
    write_specforge_folder(tmp_path / "noids", layer_ids=None)
    target = load_target(model_dirs["llama"])
    draft = load_draft(tmp_path / "noids", embed_weight=target.embed_weight())
    assert draft.config.capture is None
    dec = Decoder(target, draft, TreeShape(2, 1, 3))
    assert dec.capture == CaptureSpec.default(8)


def test_prefixed_weight_names_load(model_dirs, tmp_path):
    from safetensors.torch import load_file

    write_specforge_folder(tmp_path / "pre")
    w = load_file(tmp_path / "pre" / "model.safetensors")
    save_file({("model." + k if k not in ("d2t", "t2d") else k): v for k, v in w.items()},
              tmp_path / "pre" / "model.safetensors")
    target = load_target(model_dirs["llama"])
    load_draft(tmp_path / "pre", embed_weight=target.embed_weight())


@pytest.mark.parametrize("flag", ["norm_before_residual", "norm_before_fc"])
def test_norm_options_change_the_output(model_dirs, tmp_path, flag):
    """A loader that ignored these flags would compute something else (reference fault 10)."""
    target = load_target(model_dirs["llama"])
    outs = []
    for on in (False, True):
        d = tmp_path / f"{flag}{on}"
        extra = {flag: True} if on else {}
        write_specforge_folder(d, extra_cfg=extra, seed=3)
        if on and flag == "norm_before_fc":
            from safetensors.torch import load_file

            w = load_file(d / "model.safetensors")
            w["fc_norm.weight"] = torch.ones(3 * 64, dtype=torch.bfloat16)
            save_file(w, d / "model.safetensors")
        draft = load_draft(d, embed_weight=target.embed_weight())
        assert getattr(draft.config, flag) is on
        feats = torch.randn(1, 5, 192) * 3
        ids = torch.randint(3, 96, (1, 5))
        with torch.no_grad():
            _, logits, _ = draft(feats, ids, torch.arange(5))
        outs.append(logits)
    assert not torch.allclose(outs[0], outs[1])
