"""Regeneration goes through Target.generate_batch: left padding and the EOS cut are the regen module's,
and a greedy batch of prompts of different lengths gives each prompt's own greedy continuation."""

from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.sampling import SamplingParams
from eaglekit.models import load_target
from eaglekit.train.regen import cut_at_eos, generate_batch, left_pad


def test_left_pad_and_cut_at_eos():
    ids, pad = left_pad([[5, 6, 7], [8]], "cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and pad.tolist() == [0, 2]
    assert cut_at_eos([[4, 2, 9, 2], [4, 5]], (2,)) == [[4, 2], [4, 5]]


def test_batched_greedy_equals_each_prompt_alone_on_both_backends(model_dirs):
    prompts = [[3 + (i * 11 + j * 5) % 90 for j in range(3 + 2 * i)] for i in range(4)]
    ours = load_target(model_dirs["llama"], backend="ours")
    eos = ours.info.eos_token_ids
    alone = [Decoder(ours).generate(p, 12).token_ids for p in prompts]  # stops at EOS too
    assert generate_batch(ours, prompts, 12, SamplingParams(), 0, eos) == alone
    hf = load_target(model_dirs["llama"], backend="hf")
    assert generate_batch(hf, prompts, 12, SamplingParams(), 0, eos) == alone
