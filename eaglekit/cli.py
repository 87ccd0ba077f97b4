"""The `eaglekit` command: one registry of subcommands over plain functions. Thin by design."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import EaglekitError, InputError

COMMANDS: dict[str, tuple] = {}


def command(name: str, help: str):
    """Register `fn(args) -> int` as a subcommand; `fn.add_args(parser)` declares its options."""

    def wrap(fn):
        COMMANDS[name] = (fn, help)
        return fn

    return wrap


# --- shared option groups ---------------------------------------------------------------------------
def add_runtime(p):
    g = p.add_argument_group("runtime")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (default)")
    g.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 (auto: bf16 on GPU, fp32 on CPU)")
    g.add_argument("--backend", default="auto", choices=["auto", "ours", "hf"],
                   help="ours: eaglekit's Llama-family decoder; hf: any transformers model; auto picks")


def add_tree(p):
    g = p.add_argument_group("draft tree")
    g.add_argument("--steps", type=int, default=None, help="draft depth (default 3, or auto with --auto)")
    g.add_argument("--topk", type=int, default=None, help="children per node; 1 = chain (default 1)")
    g.add_argument("--draft-tokens", type=int, default=None, help="tree size incl. the root (chain: steps+1)")


def add_sampling(p):
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)


def add_capture(p):
    p.add_argument("--capture-layers", default=None,
                   help="override the draft's capture: comma-separated after_layers ids (output of layer i; "
                        "-1 = embedding). For experiments and diagnosis.")
    p.add_argument("--allow-other-target", action="store_true",
                   help="run a draft whose recorded target fingerprint differs from this target")


def tree_shape(args):
    from .decoding.tree import TreeShape

    steps = args.steps if args.steps is not None else 3
    topk = args.topk if args.topk is not None else 1
    return TreeShape.make(steps, topk, args.draft_tokens)


def capture_override(args):
    from .capture import CaptureSpec

    if not getattr(args, "capture_layers", None):
        return None
    try:
        return CaptureSpec(tuple(int(x) for x in args.capture_layers.split(",")))
    except ValueError:
        raise InputError(f"--capture-layers {args.capture_layers!r} is not a comma-separated list of integers",
                         fix="e.g. --capture-layers 1,3,4", code="E108") from None


def sampling_params(args):
    from .decoding.sampling import SamplingParams

    return SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)


# --- generate --------------------------------------------------------------------------------------
@command("generate", "decode a prompt with the target alone or with an EAGLE-3 draft")
def cmd_generate(args) -> int:
    from pathlib import Path

    from .decoding.engine import Decoder
    from .observe.report import metrics_table, print_table
    from .pair import load_pair
    from .tokenizer import encode, load_tokenizer

    sp = sampling_params(args)
    shape = tree_shape(args)
    if args.prompt_file:
        p = Path(args.prompt_file)
        if not p.is_file():
            raise InputError(f"prompt file {p} does not exist", fix="pass an existing file", code="E101")
        text = p.read_text()
    else:
        text = args.prompt
    tok = load_tokenizer(args.target)
    ids = encode(tok, text, chat=args.chat)
    target, draft = load_pair(args.target, None if args.baseline else args.draft, args.backend, args.device,
                              args.dtype)
    if args.auto and draft is not None:
        from .observe.sweep import auto_shape

        shape = auto_shape(target, draft, [ids], sp, capture=capture_override(args),
                           allow_other_target=args.allow_other_target)
    dec = Decoder(target, draft, shape, capture=capture_override(args), allow_other_target=args.allow_other_target,
                  profile=args.profile)
    res = dec.generate(ids, args.max_new_tokens, sp, stop_strings=args.stop or (), tokenizer=tok)
    m = res.metrics
    if args.json:
        metrics = m.to_dict()
        keep = ["new_tokens", "tokens_per_s"] + (["accept_length", "accept_rate", "verify_count", "per_position"]
                                                 if m.speculative else [])
        out = {"text": res.text, "token_ids": res.token_ids,
               "metrics": {k: metrics[k] for k in keep} | {k: v for k, v in metrics.items() if k not in keep},
               "stop_reason": res.stop_reason}
        if m.speculative:
            out["tree"] = {"steps": dec.shape.steps, "topk": dec.shape.topk, "draft_tokens": dec.shape.draft_tokens}
        print(json.dumps(out))
    else:
        print(res.text)
        print_table(metrics_table(m, title="generation" + (f" (steps {dec.shape.steps}, topk {dec.shape.topk}, "
                                                          f"draft tokens {dec.shape.draft_tokens})"
                                                          if m.speculative else " (target alone)")))
        if args.profile and m.phases:
            from .observe.report import phase_table

            print_table(phase_table(m.phases))
    return 0


def _generate_args(p):
    p.add_argument("--target", required=True, help="target model folder (config.json, safetensors, tokenizer)")
    p.add_argument("--draft", help="EAGLE-3 draft folder; without it the target decodes alone")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file whose whole content is the prompt")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--baseline", action="store_true", help="decode with the target alone")
    p.add_argument("--auto", action="store_true", help="pick (steps, topk, draft tokens) by a short sweep first")
    p.add_argument("--profile", action="store_true", help="time each phase of the cycle")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    add_tree(p)
    add_sampling(p)
    add_capture(p)
    add_runtime(p)


cmd_generate.add_args = _generate_args


# --- entry point -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="eaglekit", description="EAGLE-3 speculative decoding toolkit")
    parser.add_argument("--version", action="version", version=f"eaglekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (fn, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=(fn.__doc__ or help_).strip())
        fn.add_args(p)
        p.set_defaults(func=fn)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EaglekitError as e:
        print(f"eaglekit {args.command}: error {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"eaglekit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
