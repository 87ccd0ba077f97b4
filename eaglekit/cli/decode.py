"""The `eaglekit` commands that decode and look at what decodes: generate (a prompt, with the target alone or with a
draft), sweep (a grid of tree shapes), trace (two EAGLE3_DEBUG traces side by side), inspect (what a draft folder
says) and demo (the shipped pair, with and without its draft)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..options import DEMO_DEVICE, DecodeOptions, DemoOptions, ModelOptions, PromptSetOptions
from .common import (
    add_capture,
    add_compile,
    add_runtime,
    add_sampling,
    add_tp,
    add_tree,
    check_folders,
    check_prompt_fits,
    cut_at_stop,
    decode_options,
    model_options,
    target_context,
)
from .registry import command

if TYPE_CHECKING:
    from ..decoding.decoder import Decoder, GenerationResult
    from ..decoding.sampling import SamplingParams


# --- generate --------------------------------------------------------------------------------------
@command("generate", "decode a prompt with the target alone or with an EAGLE-3 draft")
def cmd_generate(args) -> int:
    from ..decoding.decoder import Decoder
    from ..pair import load_pair

    model, decode = model_options(args), decode_options(args)  # validated here, before any model loads
    sp, shape, capture = decode.sampling(), decode.shape(), model.capture
    tok, ids = _prompt_ids(args, decode)
    target, draft = load_pair(
        model.target,
        None if args.baseline else model.draft,
        model.backend,
        model.device_name,
        model.dtype_name,
        run=model.runtime,
    )
    if args.auto and draft is not None:
        from ..tune.sweep import auto_shape

        shape, _ = auto_shape(target, draft, [ids], sp, capture=capture, allow_other_target=model.allow_other_target)
    dec = Decoder(
        target,
        draft,
        shape,
        capture=capture,
        allow_other_target=model.allow_other_target,
        profile=args.profile,
        profile_ranges=bool(args.profile_trace),
        graphs=False if args.no_graphs else "auto",
    )
    res = _run_generation(dec, ids, decode, sp, tok, args.profile_trace)
    _print_generation(args, dec, res, decode.stop)
    return 0


def _prompt_ids(args, decode: DecodeOptions) -> tuple[Any, list[int]]:
    """The tokenizer and the prompt's ids: the prompt and the stop strings read as UTF-8, the folders checked and
    the prompt held against the target's context, all before a model loads."""
    from ..io import check_utf8, read_utf8
    from ..tokenizer import encode, load_tokenizer

    text = read_utf8(args.prompt_file, "--prompt-file") if args.prompt_file else check_utf8(args.prompt, "--prompt")
    for s in decode.stop or ():
        check_utf8(s, "--stop")
    check_folders(args.target, None if args.baseline else args.draft)
    tok = load_tokenizer(args.target)
    ids = encode(tok, text, chat=args.chat)
    check_prompt_fits(len(ids), target_context(args.target))
    return tok, ids


def _run_generation(
    dec: Decoder, ids: list[int], decode: DecodeOptions, sp: SamplingParams, tok, trace: str | None
) -> GenerationResult:
    """One generation; with `trace` (--profile-trace), under torch.profiler, written to that file."""
    if not trace:
        return dec.generate(ids, decode.max_new_tokens, sp, stop_strings=decode.stop or (), tokenizer=tok)
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if dec.target.device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    dec.generate(ids, min(decode.max_new_tokens, 8), sp)  # warm-up (CUDA-graph recording) outside the trace
    with torch.profiler.profile(activities=acts) as prof:
        res = dec.generate(ids, decode.max_new_tokens, sp, stop_strings=decode.stop or (), tokenizer=tok)
    prof.export_chrome_trace(trace)
    print(f"wrote a torch.profiler trace (chrome://tracing, Perfetto) to {trace}", file=sys.stderr)
    return res


def _print_generation(args, dec: Decoder, res: GenerationResult, stop: list[str] | None) -> None:
    """The text, cut before the stop string that ended it: with --json in one object with the metrics, else
    printed, then the metrics table (and, profiled, the phases)."""
    from ..observe.report import metrics_table, print_table

    m = res.metrics
    assert res.text is not None  # decoded with a tokenizer
    text = cut_at_stop(res.text, stop) if res.stop_reason == "stop_string" else res.text
    if args.json:
        print(json.dumps(_generation_json(dec, res, text)))
        return
    print(text)
    print_table(
        metrics_table(
            m,
            title="generation"
            + (
                f" (steps {dec.shape.steps}, topk {dec.shape.topk}, draft tokens {dec.shape.draft_tokens})"
                if m.speculative
                else " (target alone)"
            ),
        )
    )
    if (args.profile or args.profile_trace) and m.phases:
        from ..observe.report import phase_table

        print_table(phase_table(m.phases))


def _generation_json(dec: Decoder, res: GenerationResult, text: str) -> dict:
    """--json's object: the text, the ids, the metrics (the headline ones first) and, with a draft, the tree."""
    m = res.metrics
    metrics = m.to_dict()
    keep = ["new_tokens", "tokens_per_s"] + (
        ["accept_length", "accept_rate", "verify_count", "per_position"] if m.speculative else []
    )
    # which decoder served (ours, deepseek, tp, hf) and how its products ran, with the chooser's reason
    target, draft = dec.target, dec.draft
    choice = target.products_choice
    served = {
        "backend": target.backend,
        "products": {"kind": choice.kind, "reason": choice.reason} if choice is not None else None,
        "draft_precision": draft.precision if draft is not None else None,
        "prompt_graphs": target.compiled_prompts,
        "experts": target.experts,
        "plan": target.plan.as_dict() if target.plan is not None else None,
    }
    out = {
        "text": text,
        "token_ids": res.token_ids,
        "metrics": {k: metrics[k] for k in keep} | {k: v for k, v in metrics.items() if k not in keep} | served,
        "stop_reason": res.stop_reason,
    }
    if m.speculative:
        out["tree"] = {"steps": dec.shape.steps, "topk": dec.shape.topk, "draft_tokens": dec.shape.draft_tokens}
    return out


def _generate_args(p):
    p.add_argument(
        "--target", required=True, help="target model folder (config.json, safetensors, tokenizer) or a .gguf file"
    )
    p.add_argument("--draft", help="EAGLE-3 draft folder; without it the target decodes alone")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file whose whole content is the prompt (UTF-8)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    DecodeOptions.add_args(p, only=("max_new_tokens",))
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        help="stop string (repeatable; not empty): decoding "
        "ends when the text contains it, and the text printed ends before it, as the server and "
        "OpenAI's API return it (--json's token_ids keep the tokens that completed it)",
    )
    p.add_argument("--baseline", action="store_true", help="decode with the target alone")
    p.add_argument("--auto", action="store_true", help="pick (steps, topk, draft tokens) by a short sweep first")
    p.add_argument("--profile", action="store_true", help="time each phase of the cycle (CUDA events on a GPU)")
    p.add_argument("--profile-trace", metavar="FILE", help="write a torch.profiler trace with a range per phase")
    p.add_argument("--no-graphs", action="store_true", help="GPU: run the cycle eagerly instead of CUDA graphs")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    add_tree(p)
    add_sampling(p)
    add_capture(p)
    add_runtime(p)
    add_tp(p)
    add_compile(p)


cmd_generate.add_args = _generate_args


# --- sweep -----------------------------------------------------------------------------------------
@command("sweep", "accept length and tokens/s over (steps, topk, draft tokens); table, CSV, JSON, heatmap")
def cmd_sweep(args) -> int:
    """Decodes the prompts with the target alone and with each setting of the grid, side by side in one
    run, prints a table, writes sweep.csv, sweep.json and sweep.png (a heatmap per topk) to --out, and
    names the best setting. topk 1 is a chain: its draft token count is steps + 1."""
    from ..observe.metrics import fmt
    from ..observe.report import print_table, sweep_table
    from ..pair import load_pair
    from ..tokenizer import encode, load_tokenizer, read_prompts
    from ..tune.sweep import sweep, write_results

    def ints(s):
        try:
            return tuple(int(x) for x in s.split(","))
        except ValueError:
            raise InputError(
                f"{s!r} is not a comma-separated list of integers", code="E108", fix="e.g. --steps 1,3,5"
            ) from None

    grid = {"steps": ints(args.steps), "topk": ints(args.topk), "draft_tokens": ints(args.draft_tokens)}
    for name, values in grid.items():
        DecodeOptions(**{name: min(values)})  # the same bounds as a single value (E108)
    PromptSetOptions.from_args(args)
    model, decode = model_options(args), decode_options(args, steps=None, topk=None, draft_tokens=None)
    from ..io import need_file, no_file_at, no_overlap

    need_file(args.prompt_file, "--prompt-file")
    no_file_at(args.out, "--out")
    no_overlap(args.out, "--out", {"--target": model.target, "--draft": model.draft, "--prompt-file": args.prompt_file})
    check_folders(model.target, model.draft)
    assert model.target is not None  # --target is required
    tok = load_tokenizer(model.target)
    prompts = [encode(tok, p) for p in read_prompts(args.prompt_file)[: args.prompts]]
    target, draft = load_pair(
        model.target, model.draft, model.backend, model.device_name, model.dtype_name, run=model.runtime
    )
    res = sweep(
        target, draft, prompts, grid, decode.sampling(), decode.max_new_tokens, model.capture, model.allow_other_target
    )
    paths = write_results(res, args.out)
    if args.json:
        print(json.dumps(res))
    else:
        print_table(sweep_table(res))
        b = res["best"]
        print(
            f"best: --steps {b['steps']} --topk {b['topk']} --draft-tokens {b['draft_tokens']} "
            f"({b['tokens_per_s']:.1f} tok/s, {b['speedup']:.2f}x, accept length {fmt(b['accept_length'])}); "
            f"wrote {', '.join(str(p) for p in paths.values())}",
            file=sys.stderr,
        )
    return 0


def _sweep_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompt-file", required=True, help="prompts (JSONL with 'prompt', or ---separated text)")
    PromptSetOptions.add_args(p)
    DecodeOptions.add_args(p, only=("max_new_tokens",), max_new_tokens=64)
    p.add_argument("--steps", default="1,3,5")
    p.add_argument("--topk", default="1,4,8")
    p.add_argument("--draft-tokens", default="4,8,16,32")
    p.add_argument("--out", default="sweep", help="folder for sweep.csv, sweep.json, sweep.png")
    p.add_argument("--json", action="store_true")
    add_sampling(p)
    add_capture(p)
    add_runtime(p)
    add_compile(p)


cmd_sweep.add_args = _sweep_args


@command(
    "trace",
    "trace diff A B: put two EAGLE3_DEBUG traces side by side (e.g. vLLM's and eaglekit's), name where they part",
)
def cmd_trace(args) -> int:
    """Compares two trace files (JSON lines from EAGLE3_DEBUG_FILE, written by eaglekit or by the eaglekit plugin
    inside vLLM) record by record at matching (cycle, point) and names the first point where they part: layers,
    shape, widths, or statistics beyond the tolerance. Says what was compared (engines batch the draft work
    differently). Exit status 0: they agree; 1: they part; 2: a file could not be read."""
    from ..observe.tracediff import diff, format_diff

    res = diff(args.a, args.b, args.rtol, args.atol)
    print(json.dumps(res) if args.json else format_diff(res))
    return 0 if res["agree"] else 1


def _trace_args(p):
    p.add_argument("action", choices=["diff"])
    p.add_argument("a", help="trace file A (JSON lines)")
    p.add_argument("b", help="trace file B (JSON lines)")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance on mean / std / absmax (default 1e-3)")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4)")
    p.add_argument("--json", action="store_true")


cmd_trace.add_args = _trace_args


@command("inspect", "what a draft folder says, in plain words: format, convention, layers, vocab, tensors")
def cmd_inspect(args) -> int:
    """Reads a draft folder of any supported format (eaglekit, SGLang / SpecForge, vLLM speculators, EAGLE
    reference) and says which convention its ids use, the capture layers in both conventions (for --target's
    layer count), the fc width, the draft vocabulary and its coverage, the d2t form, and missing or extra
    tensors. With --target it also checks the pair."""
    from ..interop.inspect import inspect_folder
    from ..io import need_dir

    need_dir(args.dir, "the draft folder")
    check_folders(args.target, args.dir)
    target = None
    if args.target:
        from ..models import load_target

        target = load_target(args.target, backend=args.backend)
    res = inspect_folder(args.dir, target)
    if args.json:
        print(json.dumps(res))
    else:
        print("\n".join(res["summary"]))
    return 0


def _inspect_args(p):
    p.add_argument("dir", help="a draft folder")
    p.add_argument("--target", help="the target folder (for its layer count and the pair checks)")
    p.add_argument("--json", action="store_true")
    ModelOptions.add_args(p, only=("backend",))


cmd_inspect.add_args = _inspect_args


# --- demo ------------------------------------------------------------------------------------------
@command("demo", "the shipped trained pair on held-out prompts: target alone vs EAGLE-3, side by side")
def cmd_demo(args) -> int:
    """Decode held-out prompts with the shipped demo pair (a 12-layer target trained on the Python standard
    library, and its EAGLE-3 draft) with and without the draft; check the outputs are identical and print
    accept length, per-position acceptance, tokens/s and the speedup."""
    from ..demo import print_demo, run_demo

    opts, decode, model = DemoOptions.from_args(args), decode_options(args), model_options(args)
    if args.prompt_file:
        from ..io import need_file

        need_file(args.prompt_file, "--prompt-file")
    check_folders(args.target, args.draft)
    res = run_demo(args.target, args.draft, opts, decode, model, progress=not args.json)
    if args.json:
        print(json.dumps(res))
    else:
        print_demo(res)
    return 0 if res["identical"] else 1


def _demo_args(p):
    DemoOptions.add_args(p)
    DecodeOptions.add_args(p, only=("max_new_tokens",))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--target", default=None, help="another target folder instead of the shipped one")
    p.add_argument("--draft", default=None, help="another draft folder instead of the shipped one")
    ModelOptions.add_args(p, only=("device", "dtype"), device=DEMO_DEVICE)
    add_tree(p)
    add_compile(p)


cmd_demo.add_args = _demo_args
