"""The Target interface's row call (forward_rows) on every backend that serves rows: our Llama-family and
DeepSeek-family decoders, and the transformers adapter as a one-row engine's target."""

import sys
from pathlib import Path

import pytest
import torch

from eaglekit.capture import CaptureSpec
from eaglekit.models import load_target

sys.path.insert(0, str(Path(__file__).parent))
from ds_helpers import make_ds_model  # noqa: E402


@pytest.mark.parametrize("backend", ["ours", "deepseek", "hf"])
def test_a_prefill_reads_the_last_tokens_logits_alone(model_dirs, tmp_path, backend):
    """forward_rows(last=True), the prefill's call: each row's last token's logits [B, 1, V], those of the whole call's
    last token, and the same captured features; Llama and DeepSeek decoders and the transformers adapter's one row."""
    if backend == "deepseek":
        make_ds_model(tmp_path / "ds", "deepseek_v3", seed=1)
        target = load_target(tmp_path / "ds", dtype="float32")
    else:
        target = load_target(model_dirs["llama"], backend=backend, dtype="float32")
    ids = torch.tensor([[1, 5, 9, 4, 22, 7, 3]])
    T = ids.shape[1]
    causal = torch.ones(1, T, T, dtype=torch.bool).tril()
    capture = CaptureSpec.default(target.info.num_layers)
    out = {}
    for last in (False, True):
        kv = target.row_cache(1, 16)
        kv.length.zero_()
        out[last] = target.forward_rows(kv, ids, torch.arange(T)[None], causal, T, capture, last=last)
    (full, f_full), (tail, f_tail) = out[False], out[True]
    assert full.shape == (1, T, target.info.vocab_size) and tail.shape == (1, 1, target.info.vocab_size)
    torch.testing.assert_close(tail[0, 0], full[0, -1], rtol=1e-5, atol=1e-5)
    assert torch.equal(f_tail, f_full)
