"""The batched engine on a GPU: bf16 serving is batch-invariant by default (a request's greedy output is the same
bits whatever shares the batch), and products "hopper" runs a one-row batch through its kernels with the bits of
the one-request Decoder."""

import pytest
import torch

from eaglekit.decoding.config import EngineOptions
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.engine import BatchEngine, Request
from eaglekit.decoding.tree import TreeShape
from eaglekit.demo import ASSETS
from eaglekit.options import PairRuntime
from eaglekit.pair import load_pair
from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _run(eng, prompts, n):
    for i, p in enumerate(prompts):
        eng.add(Request(f"r{i}", p, n, eos_ids=()))
    out = {}
    while eng.has_work:
        for ev in eng.step():
            out.setdefault(ev.rid, []).extend(ev.token_ids)
    return [out[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("adaptive", [False, True])
def test_bf16_serving_is_batch_invariant_by_default(adaptive):
    """16 requests decoded together (graphs, padded to 16) give each request's tokens decoded alone, bit for bit,
    with the products serve chooses by default in bf16 (invariant at every batch size)."""
    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, p) for p in read_prompts(ASSETS / "prompts.jsonl")[:16]]
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cuda", dtype="bfloat16",
                     run=PairRuntime(compile="off", batched=True))
    assert t.products_choice.kind == "invariant", t.products_choice
    opts = lambda b: EngineOptions(shape=TreeShape(3, 1, 4), max_batch=b, adaptive=adaptive)  # noqa: E731
    together = _run(BatchEngine(t, d, opts(16)), prompts, 48)
    alone = [_run(BatchEngine(t, d, opts(1)), [p], 48)[0]
             for p in prompts]
    assert together == alone
    # and the one-request Decoder, same products: the same tokens
    dec = Decoder(t, d, TreeShape(3, 1, 4))
    assert [dec.generate(p, 48, eos_ids=()).token_ids for p in prompts[:4]] == alone[:4]


def test_hopper_products_run_a_one_row_batch_with_the_decoders_bits():
    from helpers import hopper_target

    from eaglekit.kernels.products import hopper_reason

    t = hopper_target("invariant")
    if hopper_reason(t) is not None:
        pytest.skip(hopper_reason(t))
    t.set_products("hopper")
    prompts = [torch.randint(0, 8192, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 17, 40)]
    eng = BatchEngine(t, None, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=1))
    got = [_run(eng, [p], 32)[0] for p in prompts]
    want = [Decoder(t).generate(p, 32, eos_ids=()).token_ids for p in prompts]
    assert got == want
