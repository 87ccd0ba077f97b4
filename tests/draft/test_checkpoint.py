"""Draft folders: our writer, and a folder in the SpecForge / SGLang layout written by hand."""

import json

import pytest
import torch
from folders import write_specforge_folder
from safetensors.torch import save_file

from eaglekit.capture import CaptureSpec
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import load_draft, new_draft, save_draft
from eaglekit.draft.checkpoint import t2d_from_d2t
from eaglekit.models import load_target


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
