"""The training commands as plain functions (the CLI only parses arguments and calls these)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ..capture import CaptureSpec
from ..errors import ContractError, InputError
from ..io import atomic_write_json
from .data import load_examples
from .loop import Indexed, heldout_split
from .trainer import TrainConfig, dist_info, evaluate_ttt, init_distributed, train_draft
from .vocab import VocabMap, count_tokens, vocab_map_from_counts


def _target(target_dir, backend, device, dtype, capture):
    """The target and the CaptureSpec to train or extract with (given, or the default for its depth)."""
    from ..models import load_target

    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    return target, (capture or CaptureSpec.default(target.info.num_layers)).validate(target.info.num_layers)


def prepare_draft(target, counts: torch.Tensor, capture: CaptureSpec, draft_vocab_size: int | None,
                  init_draft=None, seed: int = 0):
    """A new draft with the data's vocab map, or an existing one (its d2t kept: regenerating the mapping of a
    trained lm_head would point its rows at the wrong tokens)."""
    from ..draft import check_pair, load_draft, new_draft

    if init_draft is not None:
        draft = load_draft(init_draft, device=target.device, dtype=torch.float32,
                           embed_weight=target.embed_weight().float())
        if draft_vocab_size and draft_vocab_size != draft.config.draft_vocab_size:
            raise ContractError(
                f"--draft-vocab-size {draft_vocab_size} differs from the initial draft's {draft.config.draft_vocab_size}"
                f"; a trained draft keeps its vocabulary mapping", fix="leave out --draft-vocab-size", code="E211")
        check_pair(draft, target, capture if capture != CaptureSpec.default(target.info.num_layers) else None)
        if draft.config.capture is None:
            draft.config.capture = capture
        hot = (torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device) + draft.d2t)
        return draft, hot.to(target.device), None
    V = target.info.vocab_size
    vm: VocabMap = vocab_map_from_counts(counts, min(draft_vocab_size or V, V))
    draft = new_draft(target, capture=capture, draft_vocab_size=vm.hot.numel(), seed=seed, dtype=torch.float32)
    with torch.no_grad():
        draft.d2t.copy_(vm.d2t)
        draft.t2d.copy_(vm.t2d(V))
    return draft, vm.hot.to(target.device), vm.coverage


_Indexed = Indexed  # the old private name


def run_train(target_dir, out, cfg: TrainConfig, data=None, features=None, init_draft=None,
              capture: CaptureSpec | None = None, draft_vocab_size: int | None = None, max_len: int = 2048,
              heldout: float = 0.02, backend="auto", device="cpu", dtype=None, log=print) -> dict:
    from ..draft import save_draft
    from ..tokenizer import load_tokenizer
    from .extract import FeatureStore
    from .sources import OnlineSource

    if (data is None) == (features is None):
        raise InputError("give exactly one of --data (online: features computed while training) or --features "
                         "(offline: a folder written by eaglekit extract)", code="E130")
    device = init_distributed(device)
    world, rank = dist_info()
    if features is not None:
        store = FeatureStore(features)
        capture = capture or store.capture
    target, capture = _target(target_dir, backend, device, dtype, capture)
    if features is not None:
        src = FeatureStore(features, target.info, capture)
        train_idx, held_idx = heldout_split(src.n, heldout, cfg.seed)
        counts = src.token_counts()
    else:
        examples = load_examples(data, load_tokenizer(target_dir, required=False), max_len)
        train_idx, held_idx = heldout_split(len(examples), heldout, cfg.seed)
        counts = count_tokens([examples[i] for i in train_idx], target.info.vocab_size)
        src = OnlineSource(target, examples, capture)
    draft, hot, coverage = prepare_draft(target, counts, capture, draft_vocab_size, init_draft, cfg.seed)
    if rank == 0 and coverage is not None:
        log(f"draft vocabulary: {hot.numel()} of {target.info.vocab_size} target tokens, covering {coverage:.1%} "
            f"of the loss-masked training tokens")
    res = train_draft(draft, Indexed(src, train_idx), target.lm_head_weight(), hot, cfg, device,
                      eval_indices=held_idx or None)
    if rank == 0:
        save_draft(draft, Path(out) / "draft", dtype=torch.bfloat16)
        res.update(capture=capture.to_dict(), coverage=coverage, draft=str(Path(out) / "draft"))
        atomic_write_json(Path(out) / "train_summary.json", res)
    return res


def run_extract(target_dir, data, out, capture=None, max_len=2048, shard_size=256, batch_size=8,
                feat_dtype="bfloat16", backend="auto", device="cpu", dtype=None, log=print) -> dict:
    from ..tokenizer import load_tokenizer
    from .extract import extract

    target, capture = _target(target_dir, backend, device, dtype, capture)
    examples = load_examples(data, load_tokenizer(target_dir, required=False), max_len)
    return extract(target, examples, out, capture, shard_size=shard_size, batch_size=batch_size, dtype=feat_dtype, log=log)


def run_eval(target_dir, draft_dir, data=None, prompts=None, shape=None, max_new_tokens=128, max_len=2048,
             ttt_length=7, batch_size=8, capture=None, backend="auto", device="cpu", dtype=None) -> dict:
    from ..decoding.engine import Decoder
    from ..draft import check_pair
    from ..observe.metrics import aggregate
    from ..pair import load_pair
    from ..tokenizer import encode, load_tokenizer, read_prompts
    from .sources import OnlineSource

    if data is None and prompts is None:
        raise InputError("eval needs --data (held-out training-format data) and/or --prompt-file (prompts to "
                         "decode)", code="E130")
    target, draft = load_pair(target_dir, draft_dir, backend, device, dtype)
    spec = check_pair(draft, target, capture)
    out: dict = {"capture": spec.to_dict()}
    tok = load_tokenizer(target_dir, required=False)
    if data is not None:
        examples = load_examples(data, tok, max_len)
        hot = torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device) + draft.d2t
        cfg = TrainConfig(out="", batch_size=batch_size, ttt_length=ttt_length)
        out["ttt"] = evaluate_ttt(draft, OnlineSource(target, examples, spec), list(range(len(examples))),
                                  target.lm_head_weight(), hot, cfg, target.device)
    if prompts is not None:
        if tok is None:
            raise InputError(f"no tokenizer in {target_dir} to encode the prompts", code="E109")
        dec = Decoder(target, draft, shape, capture=spec)
        runs, identical = [], True
        for text in read_prompts(prompts):
            ids = encode(tok, text)
            r = dec.generate(ids, max_new_tokens)
            identical &= r.token_ids == dec.generate(ids, max_new_tokens, baseline=True).token_ids
            runs.append(r.metrics)
        m = aggregate(runs)
        out["decode"] = {"steps": dec.shape.steps, "topk": dec.shape.topk, "draft_tokens": dec.shape.draft_tokens,
                         "prompts": len(runs), "identical_to_target": identical, **m.to_dict()}
    return out


def run_regenerate(target_dir, data, out, max_new_tokens=256, temperature=0.0, greedy_share=1.0, batch_size=32,
                   seed=0, prompt_len=64, max_prompts=None, backend="auto", device="cpu", dtype=None) -> int:
    """Text data: windows of `prompt_len` tokens, continued by the target (loss on all tokens).
    Chat data: the conversation up to its first assistant turn, answered by the target (loss on the answer)."""
    from ..models import load_target
    from ..tokenizer import load_tokenizer
    from .data import _roles, read_records, write_examples
    from .regen import regenerate

    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    tok = load_tokenizer(target_dir)
    text_prompts, chat_prompts = [], []
    for kind, rec in read_records(data):
        if kind == "chat":
            msgs = _roles(rec)
            first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
            ids = tok.apply_chat_template(msgs[:first], add_generation_prompt=True, tokenize=True)
            chat_prompts.append(list(ids["input_ids"] if isinstance(ids, dict) else ids))
        else:
            ids = rec.input_ids if kind == "tokens" else tok(rec, add_special_tokens=False)["input_ids"]
            text_prompts += [list(ids[i:i + prompt_len]) for i in range(0, max(len(ids) - prompt_len, 1),
                                                                          prompt_len * 4)]
    rng = random.Random(seed)
    rng.shuffle(text_prompts)
    if max_prompts:
        text_prompts, chat_prompts = text_prompts[:max_prompts], chat_prompts[:max_prompts]
    eos = target.info.eos_token_ids
    ex = []
    if text_prompts:
        ex += regenerate(target, text_prompts, max_new_tokens, batch_size, temperature, greedy_share, seed, eos,
                         mask_prompt=False)
    if chat_prompts:
        ex += regenerate(target, chat_prompts, max_new_tokens, batch_size, temperature, greedy_share, seed + 1, eos,
                         mask_prompt=True)
    if not ex:
        raise InputError(f"no prompt could be made from {data}", code="E102")
    write_examples(out, ex)
    return len(ex)
