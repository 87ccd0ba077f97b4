"""Our compact decoder against transformers' own implementation of each family."""

import json

import pytest
import sequence
import torch
from helpers import make_hf_model

from eaglekit.capture import CaptureSpec
from eaglekit.models import load_target

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


def _step(target, ids, capture=None):
    """Append tokens as a plain causal run and commit them."""
    T = ids.numel()
    logits, feats = sequence.verify(target, ids, torch.arange(T), torch.ones(T, T, dtype=torch.bool).tril_(), capture)
    sequence.keep(target, torch.arange(T), torch.tensor(T))
    return logits, feats


def _hf(folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(model_dirs, family):
    ref = _hf(model_dirs[family])
    ours = load_target(model_dirs[family], backend="ours", dtype="float32")
    ids = torch.randint(3, 96, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    ours.reset(64)
    got, _ = sequence.prefill(ours, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decode_and_captures_match(model_dirs, family):
    ref = _hf(model_dirs[family])
    ours = load_target(model_dirs[family], backend="ours", dtype="float32")
    spec = CaptureSpec((-1, 1, 3, 7))
    ids = torch.randint(3, 96, (20,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = ref(ids[None], output_hidden_states=True)
    ours.reset(32)
    _, f0 = sequence.prefill(ours, ids[:12], spec)
    rows, feats = [], [f0]
    for i in range(12, 20):
        lg, f = _step(ours, ids[i:i + 1], spec)
        rows.append(lg[0])
        feats.append(f)
    torch.testing.assert_close(torch.stack(rows), out.logits[0, 12:20], rtol=1e-5, atol=1e-5)
    feats = torch.cat(feats)
    hs = out.hidden_states  # hs[i] = input of layer i (= after_layers i-1) for i < n
    want = torch.cat([hs[0][0], hs[2][0], hs[4][0]], dim=-1)
    torch.testing.assert_close(feats[:, :64 * 3], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_tree_verify_equals_running_each_path(model_dirs, family):
    """One tree-masked forward gives, at every node, the logits of prefix + that node's path."""
    ref = _hf(model_dirs[family], torch.float64)
    ours = load_target(model_dirs[family], backend="ours", dtype="float64")
    from helpers import assert_tree_verify_matches

    assert_tree_verify_matches(ours, ref, 1e-9, step=lambda t, tok: _step(t, tok)[0][0])


def test_tied_embeddings_and_sharded_index(tmp_path):
    from safetensors.torch import load_file, save_file

    model = make_hf_model(tmp_path / "tied", "qwen2", seed=5, tie_word_embeddings=True)
    # re-shard the single file into two files with an index, as large checkpoints come
    src = tmp_path / "tied" / "model.safetensors"
    tensors = load_file(src)
    src.unlink()
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for j, part in enumerate([names[:half], names[half:]]):
        fname = f"model-0000{j + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, tmp_path / "tied" / fname)
        weight_map.update({k: fname for k in part})
    (tmp_path / "tied" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ours = load_target(tmp_path / "tied", backend="ours")
    assert ours.net.lm_head.weight.data_ptr() == ours.net.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(3, 96, (16,))
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    ours.reset(16)
    got, _ = sequence.prefill(ours, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_mistral_sliding_window_matches(tmp_path):
    model = make_hf_model(tmp_path / "mis", "mistral", seed=6, sliding_window=8)
    ours = load_target(tmp_path / "mis", backend="ours")
    assert ours.cfg.sliding_window == 8
    ids = torch.randint(3, 96, (24,))
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    ours.reset(32)
    got, _ = sequence.prefill(ours, ids[:16])
    rows = [got]
    for i in range(16, 24):
        lg, _ = _step(ours, ids[i:i + 1])
        rows.append(lg)
    torch.testing.assert_close(torch.cat(rows), want, rtol=1e-5, atol=1e-5)


def test_hf_adapter_matches_our_decoder(model_dirs):
    hf = load_target(model_dirs["llama"], backend="hf", dtype="float64")
    ours = load_target(model_dirs["llama"], backend="ours", dtype="float64")
    assert hf.info.fingerprint == ours.info.fingerprint
    spec = CaptureSpec((1, 3, 4))
    for t in (hf, ours):
        t.reset(32)
    ids = torch.randint(3, 96, (12,))
    a = sequence.prefill(hf, ids, spec)
    b = sequence.prefill(ours, ids, spec)
    torch.testing.assert_close(a[0], b[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(a[1], b[1], rtol=1e-9, atol=1e-9)
