"""bf16 on a CPU, lossless against the verify-shaped baseline: the shipped demo pair's greedy speculative output equals
the target stepping through k-row chains (Decoder.baseline_rows 'auto': the chain's draft_tokens), on every prompt.
Two things make it so: the baseline step computes the verify's rows (a bf16 product rounds a row alone and among six
apart), and the eager target attends over the whole span in both (a CPU's attention rounds a row by the call's number
of key slots: decoding.runner)."""

import pytest
import torch

from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.demo import demo_paths
from eaglekit.options import PairRuntime
from eaglekit.pair import load_pair
from eaglekit.tokenizer import encode, load_tokenizer, read_prompts


@pytest.mark.parametrize("products", ["aten", "onednn"])
def test_bf16_chains_on_a_cpu_equal_the_verify_shaped_baseline(products):
    tdir, ddir, prompts = demo_paths()
    t, d = load_pair(tdir, ddir, device="cpu", dtype="bfloat16", run=PairRuntime(compile="off", products=products))
    tok = load_tokenizer(tdir)
    dec = Decoder(t, d, TreeShape(5, 1, 6))
    assert dec.baseline_rows == 6 and t.dtype == torch.bfloat16
    for p in read_prompts(prompts)[:12]:
        ids = encode(tok, p)
        assert dec.generate(ids, 64).token_ids == dec.generate(ids, 64, baseline=True).token_ids
