"""Regeneration: our decoders continue a batch of prompts through the engine with no draft, the transformers adapter
through its generate over left-padded prompts; a batch of prompts of different lengths gives each prompt its own
continuation, greedy or sampled from its own seed."""

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


def test_sampled_batch_gives_each_prompt_what_its_own_seed_gives_it_alone(model_dirs):
    """Prompt i of a sampled batch draws from its own generator seeded seed + i: the tokens `generate` gives that
    prompt alone with that seed, whatever else is in the batch."""
    prompts = [[3 + (i * 7 + j * 3) % 90 for j in range(2 + 3 * i)] for i in range(3)]
    ours = load_target(model_dirs["llama"], backend="ours")
    sp = SamplingParams(temperature=1.0, top_k=20)
    got = generate_batch(ours, prompts, 10, sp, 40, ())
    alone = [Decoder(ours).generate(p, 10, SamplingParams(1.0, top_k=20, seed=40 + i), eos_ids=()).token_ids
             for i, p in enumerate(prompts)]
    assert got == alone and len(set(map(tuple, got))) == 3
    assert generate_batch(ours, prompts[1:], 10, sp, 41, ()) == alone[1:]  # prompt 1 first, seed 41 + 0
