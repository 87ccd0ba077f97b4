"""The training commands as plain functions (the CLI only parses arguments and calls these)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ..capture import CaptureSpec
from ..decoding.compare import compare
from ..decoding.decoder import Decoder
from ..draft import check_pair, load_draft, new_draft, save_draft
from ..errors import ContractError, InputError
from ..io import atomic_write_bytes, strict_json
from ..models import load_target
from ..options import DecodeOptions, EvalOptions, ExtractOptions, ModelOptions, RegenOptions, TrainOptions
from ..pair import load_pair
from ..tokenizer import encode, load_tokenizer, read_prompts
from .data import load_examples, read_records, roles, write_examples
from .extract import FeatureStore, extract
from .loop import Indexed, heldout_split
from .regen import regenerate
from .sources import OnlineSource
from .trainer import TrainConfig, dist_info, distributed_run, evaluate_ttt, train_draft
from .vocab import VocabMap, count_tokens, vocab_map_from_counts

# what `eaglekit train` writes under its --out (an input there would be replaced: io.no_overlap refuses it)
TRAIN_WRITES = ("checkpoint", "draft", "train_log.jsonl", "train_summary.json")


def _target(target_dir, backend, device, dtype, capture):
    """The target and the CaptureSpec to train or extract with (given, or the default for its depth)."""
    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    return target, (capture or CaptureSpec.default(target.info.num_layers)).validate(target.info.num_layers)


def prepare_draft(
    target, counts: torch.Tensor, capture: CaptureSpec, draft_vocab_size: int | None, init_draft=None, seed: int = 0
):
    """A new draft with the data's vocab map, or an existing one (its d2t kept: regenerating the mapping of a
    trained lm_head would point its rows at the wrong tokens)."""
    if init_draft is not None:
        draft = load_draft(
            init_draft, device=target.device, dtype=torch.float32, embed_weight=target.embed_weight().float()
        )
        if draft_vocab_size and draft_vocab_size != draft.config.draft_vocab_size:
            raise ContractError(
                f"--draft-vocab-size {draft_vocab_size} differs from the initial draft's "
                f"{draft.config.draft_vocab_size}; a trained draft keeps its vocabulary mapping",
                fix="leave out --draft-vocab-size",
                code="E211",
            )
        check_pair(draft, target, capture if capture != CaptureSpec.default(target.info.num_layers) else None)
        if draft.config.capture is None:
            draft.config.capture = capture
        hot = torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device) + draft.d2t
        return draft, hot.to(target.device), None
    V = target.info.vocab_size
    vm: VocabMap = vocab_map_from_counts(counts, min(draft_vocab_size or V, V))
    draft = new_draft(target, capture=capture, draft_vocab_size=vm.hot.numel(), seed=seed, dtype=torch.float32)
    if target.folder:  # which weights it is trained on (the doctor compares them)
        from .fingerprint import weights_fingerprint

        draft.config.target_weights = weights_fingerprint(target.folder)
    with torch.no_grad():
        draft.d2t.copy_(vm.d2t)
        draft.t2d.copy_(vm.t2d(V))
    return draft, vm.hot.to(target.device), vm.coverage


def train_config(opts: TrainOptions, out) -> TrainConfig:
    """The loop's settings out of `eaglekit train`'s options (TrainOptions declares them with TrainConfig's
    defaults)."""
    return TrainConfig(
        out=str(out),
        batch_size=opts.batch_size,
        epochs=opts.epochs,
        max_steps=opts.max_steps,
        lr=opts.lr,
        warmup=opts.warmup,
        ttt_length=opts.ttt_length,
        save_every=opts.save_every,
        eval_every=opts.eval_every,
        seed=opts.seed,
        grad_clip=opts.grad_clip,
    )


def run_train(target_dir, out, opts: TrainOptions, model: ModelOptions | None = None, log=print) -> dict:
    """Train a draft for `target_dir` into the run folder `out` (checkpoint/, train_log.jsonl, draft/).
    `model`: backend, device, dtype and the capture (default: the target's default capture)."""
    model = model or ModelOptions()
    cfg = train_config(opts, out)
    if (opts.data is None) == (opts.features is None):
        raise InputError(
            "give exactly one of --data (online: features computed while training) or --features "
            "(offline: a folder written by eaglekit extract)",
            code="E130",
        )
    with distributed_run(model.device_name) as device:
        return _train(target_dir, out, opts, model, cfg, device, log)


def _train(target_dir, out, opts: TrainOptions, model: ModelOptions, cfg, device: str, log) -> dict:
    data, features, capture, heldout = opts.data, opts.features, model.capture, opts.heldout
    world, rank = dist_info()
    if features is not None:
        store = FeatureStore(features)
        capture = capture or store.capture
    target, capture = _target(target_dir, model.backend, device, model.dtype_name, capture)
    src: FeatureStore | OnlineSource
    if features is not None:
        src = FeatureStore(features, target.info, capture)
        train_idx, held_idx = heldout_split(src.n, heldout, cfg.seed)
        counts = src.token_counts()
    else:
        examples = load_examples(data, load_tokenizer(target_dir, required=False), opts.max_len)
        train_idx, held_idx = heldout_split(len(examples), heldout, cfg.seed)
        counts = count_tokens([examples[i] for i in train_idx], target.info.vocab_size)
        src = OnlineSource(target, examples, capture)
    draft, hot, coverage = prepare_draft(target, counts, capture, opts.draft_vocab_size, opts.init_draft, cfg.seed)
    if rank == 0 and coverage is not None:
        log(
            f"draft vocabulary: {hot.numel()} of {target.info.vocab_size} target tokens, covering {coverage:.1%} "
            f"of the loss-masked training tokens"
        )
    res = train_draft(
        draft, Indexed(src, train_idx), target.lm_head_weight(), hot, cfg, device, eval_indices=held_idx or None
    )
    if rank == 0:
        save_draft(draft, Path(out) / "draft", dtype=torch.bfloat16)
        res.update(capture=capture.to_dict(), coverage=coverage, draft=str(Path(out) / "draft"))
        if held_idx:  # what the saved draft accepts on held-out text, for the doctor to hold it against
            from .record import MAX_SEQUENCES, ids_of, record_draft

            record_draft(
                target,
                target_dir,
                Path(out) / "draft",
                ids_of(src, held_idx[:MAX_SEQUENCES]),
                capture,
                "eaglekit train",
                "the held-out split of the training data",
                res.get("heldout"),
                log,
            )
        atomic_write_bytes(Path(out) / "train_summary.json", (strict_json(res, indent=2) + "\n").encode())
    return res


def run_extract(
    target_dir, data, out, opts: ExtractOptions | None = None, model: ModelOptions | None = None, log=print
) -> dict:
    opts, model = opts or ExtractOptions(), model or ModelOptions()
    target, capture = _target(target_dir, model.backend, model.device_name, model.dtype_name, model.capture)
    examples = load_examples(data, load_tokenizer(target_dir, required=False), opts.max_len)
    return extract(
        target,
        examples,
        out,
        capture,
        shard_size=opts.shard_size,
        batch_size=opts.batch_size,
        dtype=opts.feature_dtype,
        log=log,
    )


def run_eval(
    target_dir, draft_dir, opts: EvalOptions, decode: DecodeOptions | None = None, model: ModelOptions | None = None
) -> dict:
    """Held-out TTT accuracy (opts.data) and/or the real engine on prompts (opts.prompt_file), decoded with
    `decode` (its tree and max_new_tokens) and compared with the target alone."""
    decode, model = decode or DecodeOptions(), model or ModelOptions()
    if opts.data is None and opts.prompt_file is None:
        raise InputError(
            "eval needs --data (held-out training-format data) and/or --prompt-file (prompts to decode)", code="E130"
        )
    target, draft = load_pair(
        target_dir, draft_dir, model.backend, model.device_name, model.dtype_name, run=model.runtime
    )
    assert draft is not None  # eval runs a draft: draft_dir is required
    spec = check_pair(draft, target, model.capture, model.allow_other_target)
    out: dict = {"capture": spec.to_dict()}
    tok = load_tokenizer(target_dir, required=False)
    if opts.data is not None:
        examples = load_examples(opts.data, tok, opts.max_len)
        hot = torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device) + draft.d2t
        cfg = TrainConfig(out="", batch_size=opts.batch_size, ttt_length=opts.ttt_length)
        out["ttt"] = evaluate_ttt(
            draft,
            OnlineSource(target, examples, spec),
            list(range(len(examples))),
            target.lm_head_weight(),
            hot,
            cfg,
            target.device,
        )
        # the draft's own target: its record (eaglekit.train.record), unless asked to leave the folder as it is
        if not model.allow_other_target and not opts.no_record:
            import sys

            from .record import MAX_SEQUENCES, record_draft

            record_draft(
                target,
                target_dir,
                draft_dir,
                [e.input_ids for e in examples[:MAX_SEQUENCES]],
                spec,
                "eaglekit eval --data",
                str(opts.data),
                out["ttt"],
                lambda m: print(m, file=sys.stderr),
            )
    if opts.prompt_file is not None:
        if tok is None:
            raise InputError(f"no tokenizer in {target_dir} to encode the prompts", code="E109")
        dec = Decoder(target, draft, decode.shape(), capture=spec, allow_other_target=model.allow_other_target)
        ids = [encode(tok, text) for text in read_prompts(opts.prompt_file)]
        c = compare(dec, ids, decode.max_new_tokens, alternate=False)
        out["decode"] = {
            "steps": dec.shape.steps,
            "topk": dec.shape.topk,
            "draft_tokens": dec.shape.draft_tokens,
            "prompts": len(ids),
            "identical_to_target": c.identical,
            **c.eagle.metrics.to_dict(),
        }
    return out


def run_regenerate(target_dir, data, out, opts: RegenOptions | None = None, model: ModelOptions | None = None) -> int:
    """Text data: windows of `prompt_len` tokens, continued by the target (loss on all tokens).
    Chat data: the conversation up to its first assistant turn, answered by the target (loss on the answer).
    The defaults are RegenOptions', the same as the CLI's."""
    opts, model = opts or RegenOptions(), model or ModelOptions()
    prompt_len, max_prompts, seed = opts.prompt_len, opts.max_prompts, opts.seed
    target = load_target(target_dir, backend=model.backend, device=model.device_name, dtype=model.dtype_name)
    tok = load_tokenizer(target_dir)
    text_prompts, chat_prompts = [], []
    for kind, rec in read_records(data):
        if kind == "chat":
            msgs = roles(rec)
            first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
            ids = tok.apply_chat_template(msgs[:first], add_generation_prompt=True, tokenize=True)
            chat_prompts.append(list(ids["input_ids"] if isinstance(ids, dict) else ids))
        else:
            ids = rec.input_ids if kind == "tokens" else tok(rec, add_special_tokens=False)["input_ids"]
            text_prompts += [
                list(ids[i : i + prompt_len]) for i in range(0, max(len(ids) - prompt_len, 1), prompt_len * 4)
            ]
    rng = random.Random(seed)
    rng.shuffle(text_prompts)
    if max_prompts:
        text_prompts, chat_prompts = text_prompts[:max_prompts], chat_prompts[:max_prompts]
    eos = target.info.eos_token_ids
    ex = []
    if text_prompts:
        ex += regenerate(
            target,
            text_prompts,
            opts.max_new_tokens,
            opts.batch_size,
            opts.temperature,
            opts.greedy_share,
            seed,
            eos,
            mask_prompt=False,
        )
    if chat_prompts:
        ex += regenerate(
            target,
            chat_prompts,
            opts.max_new_tokens,
            opts.batch_size,
            opts.temperature,
            opts.greedy_share,
            seed + 1,
            eos,
            mask_prompt=True,
        )
    if not ex:
        raise InputError(f"no prompt could be made from {data}", code="E102")
    write_examples(out, ex)
    return len(ex)
