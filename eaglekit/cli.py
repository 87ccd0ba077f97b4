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


def add_compile(p):
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decoder layers (GPU: fused kernels inside the CUDA graphs; the first "
                        "generation pays the compile)")


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
                        "'emb' = the embedding, or write --capture-layers=-1,...). For experiments and diagnosis.")
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
        return CaptureSpec(tuple(-1 if x.strip() in ("emb", "embedding") else int(x)
                                 for x in args.capture_layers.split(",")))
    except ValueError:
        raise InputError(f"--capture-layers {args.capture_layers!r} is not a comma-separated list of integers",
                         fix="e.g. --capture-layers 1,3,4 (the embedding: emb,1,3,4 or --capture-layers=-1,1,3,4)",
                         code="E108") from None


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
                              args.dtype, compile=args.compile)
    if args.auto and draft is not None:
        from .observe.sweep import auto_shape

        shape = auto_shape(target, draft, [ids], sp, capture=capture_override(args),
                           allow_other_target=args.allow_other_target)
    dec = Decoder(target, draft, shape, capture=capture_override(args), allow_other_target=args.allow_other_target,
                  profile=args.profile, profile_ranges=bool(args.profile_trace),
                  graphs=False if args.no_graphs else "auto")
    if args.profile_trace:
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if target.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        dec.generate(ids, min(args.max_new_tokens, 8), sp)  # warm-up (graph capture) outside the trace
        with torch.profiler.profile(activities=acts) as prof:
            res = dec.generate(ids, args.max_new_tokens, sp, stop_strings=args.stop or (), tokenizer=tok)
        prof.export_chrome_trace(args.profile_trace)
        print(f"wrote a torch.profiler trace (chrome://tracing, Perfetto) to {args.profile_trace}", file=sys.stderr)
    else:
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
        if (args.profile or args.profile_trace) and m.phases:
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
    p.add_argument("--profile", action="store_true", help="time each phase of the cycle (CUDA events on a GPU)")
    p.add_argument("--profile-trace", metavar="FILE", help="write a torch.profiler trace with a range per phase")
    p.add_argument("--no-graphs", action="store_true", help="GPU: run the cycle eagerly instead of CUDA graphs")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    add_tree(p)
    add_sampling(p)
    add_capture(p)
    add_runtime(p)
    add_compile(p)


cmd_generate.add_args = _generate_args


# --- sweep -----------------------------------------------------------------------------------------
@command("sweep", "accept length and tokens/s over (steps, topk, draft tokens); table, CSV, JSON, heatmap")
def cmd_sweep(args) -> int:
    """Decodes the prompts with the target alone and with each setting of the grid, side by side in one
    run, prints a table, writes sweep.csv, sweep.json and sweep.png (a heatmap per topk) to --out, and
    names the best setting. topk 1 is a chain: its draft token count is steps + 1."""
    from .observe.report import print_table, sweep_table
    from .observe.sweep import sweep, write_results
    from .pair import load_pair
    from .tokenizer import encode, load_tokenizer, read_prompts

    def ints(s):
        try:
            return tuple(int(x) for x in s.split(","))
        except ValueError:
            raise InputError(f"{s!r} is not a comma-separated list of integers", code="E108",
                             fix="e.g. --steps 1,3,5") from None

    tok = load_tokenizer(args.target)
    prompts = [encode(tok, p) for p in read_prompts(args.prompt_file)[: args.prompts]]
    target, draft = load_pair(args.target, args.draft, args.backend, args.device,
                              None if args.dtype == "auto" else args.dtype, compile=args.compile)
    grid = {"steps": ints(args.steps), "topk": ints(args.topk), "draft_tokens": ints(args.draft_tokens)}
    res = sweep(target, draft, prompts, grid, sampling_params(args), args.max_new_tokens, capture_override(args),
                args.allow_other_target)
    paths = write_results(res, args.out)
    if args.json:
        print(json.dumps(res))
    else:
        print_table(sweep_table(res))
        b = res["best"]
        print(f"best: --steps {b['steps']} --topk {b['topk']} --draft-tokens {b['draft_tokens']} "
              f"({b['tokens_per_s']:.1f} tok/s, {b['speedup']:.2f}x, accept length {b['accept_length']:.2f}); "
              f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def _sweep_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompt-file", required=True, help="prompts (JSONL with 'prompt', or ---separated text)")
    p.add_argument("--prompts", type=int, default=8, help="how many prompts of the file (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=64)
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
    Exit status 0: a clean pair; 1: a fault was found; 2: doctor could not run."""
    from .doctor import run_doctor
    from .observe.report import doctor_report

    try:
        res = run_doctor(args.target, args.draft, args.prompt_file, args.prompts, args.max_new_tokens,
                         capture_override(args), args.backend, args.device if args.device != "auto" else "cpu",
                         None if args.dtype == "auto" else args.dtype)
    except EaglekitError as e:
        if args.json:
            print(json.dumps({"verdict": f"doctor could not run: {e}", "findings": [
                {"code": e.code, "severity": "error", "message": e.message}], "probe": []}))
        else:
            print(f"eaglekit doctor: could not run: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res))
    else:
        doctor_report(res)
    return 1 if res["fault"] else 0


def _doctor_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompt-file", help="probe prompts (default: the target's demo prompts or built-in ones)")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--json", action="store_true", help='one object: {"verdict", "findings", "probe", ...}')
    p.add_argument("--capture-layers", default=None,
                   help="the wiring you serve with, if not the draft's own (after_layers ids; 'emb' = the embedding)")
    add_runtime(p)


cmd_doctor.add_args = _doctor_args


# --- interop ---------------------------------------------------------------------------------------
@command("export", "write a draft for SGLang, vLLM or SpecForge with that engine's layer-id convention")
def cmd_export(args) -> int:
    """Writes OUT so that the engine captures exactly the tensors the draft was trained on. sglang: the
    LlamaForCausalLMEagle3 layout, eagle_config ids in the 'output of layer' meaning (= after_layers).
    specforge: the same, with the embedding. vllm: the speculators layout, 'input of layer' ids at the top
    level and nested. d2t as offsets, t2d derived. Reads any supported format (see eaglekit inspect)."""
    from .interop.export import export
    from .models import resolve_dtype
    from .pair import load_pair

    target, draft = load_pair(args.target, args.draft, args.backend, "cpu", "float32")
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
    p.add_argument("--backend", default="auto", choices=["auto", "ours", "hf"])


cmd_export.add_args = _export_args


@command("inspect", "what a draft folder says, in plain words: format, convention, layers, vocab, tensors")
def cmd_inspect(args) -> int:
    """Reads a draft folder of any supported format (eaglekit, SGLang / SpecForge, vLLM speculators, EAGLE
    reference) and says which convention its ids use, the capture layers in both conventions (for --target's
    layer count), the fc width, the draft vocabulary and its coverage, the d2t form, and missing or extra
    tensors. With --target it also checks the pair."""
    from .interop.inspect import inspect_folder

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
    p.add_argument("--backend", default="auto", choices=["auto", "ours", "hf"])


cmd_inspect.add_args = _inspect_args


# --- demo ------------------------------------------------------------------------------------------
@command("demo", "the shipped trained pair on held-out prompts: target alone vs EAGLE-3, side by side")
def cmd_demo(args) -> int:
    """Decode held-out prompts with the shipped demo pair (a 12-layer target trained on the Python standard
    library, and its EAGLE-3 draft) with and without the draft; check the outputs are identical and print
    accept length, per-position acceptance, tokens/s and the speedup."""
    from .demo import print_demo, run_demo

    shape = tree_shape(args) if any(v is not None for v in (args.steps, args.topk, args.draft_tokens)) else None
    res = run_demo(args.target, args.draft, args.prompt_file, args.prompts, args.max_new_tokens, shape,
                   args.device if args.device != "auto" else "cpu", args.dtype, args.threads, progress=not args.json)
    if args.json:
        print(json.dumps(res))
    else:
        print_demo(res)
    return 0 if res["identical"] else 1


def _demo_args(p):
    p.add_argument("--prompts", type=int, default=32, help="how many held-out prompts (default: all 32)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--target", default=None, help="another target folder instead of the shipped one")
    p.add_argument("--draft", default=None, help="another draft folder instead of the shipped one")
    p.add_argument("--prompt-file", default=None, help="another prompt file (JSONL or ---separated text)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", default="auto")
    add_tree(p)


cmd_demo.add_args = _demo_args


# --- training ---------------------------------------------------------------------------------------
_DATA_HELP = ("training data: a text file or folder, JSONL with 'text', chat JSONL with 'messages' or "
              "'conversations' (loss on assistant turns only), or pre-tokenized JSONL with 'input_ids' and "
              "'loss_mask' (what eaglekit regenerate writes)")


@command("regenerate", "have the target write the responses its draft will learn from")
def cmd_regenerate(args) -> int:
    """A draft must learn the target's own distribution. For chat data the target answers each conversation's
    first user turn; for text data it continues windows of --prompt-len tokens. Batched and seeded; writes
    pre-tokenized JSONL that eaglekit extract / train read directly."""
    from .pair import pick_device
    from .train.run import run_regenerate

    n = run_regenerate(args.target, args.data, args.out, args.max_new_tokens, args.temperature, args.greedy_share,
                       args.batch_size, args.seed, args.prompt_len, args.max_prompts, args.backend,
                       pick_device(args.device), None if args.dtype == "auto" else args.dtype)
    print(f"wrote {n} regenerated examples to {args.out}", file=sys.stderr)
    return 0


def _regen_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help=_DATA_HELP)
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.8, help="for the sampled share")
    p.add_argument("--greedy-share", type=float, default=0.5, help="share of batches decoded greedily")
    p.add_argument("--prompt-len", type=int, default=64, help="text data: prompt window in tokens")
    p.add_argument("--max-prompts", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    add_runtime(p)


cmd_regenerate.add_args = _regen_args


@command("extract", "offline: capture the target's features for training into shards + a manifest")
def cmd_extract(args) -> int:
    """Runs the target over the data and writes safetensors shards holding, per token, the aux features
    (captures x hidden) and the final hidden state, plus manifest.json (target fingerprint, CaptureSpec,
    dtype, counts, per-shard sha256). Prints the disk it needs first; a killed run resumes where it stopped.
    For targets that fit beside the draft, train online instead (eaglekit train --data)."""
    from .pair import pick_device
    from .train.run import run_extract

    m = run_extract(args.target, args.data, args.out, capture_override(args), args.max_len, args.shard_size,
                    args.batch_size, args.feature_dtype, args.backend, pick_device(args.device),
                    None if args.dtype == "auto" else args.dtype, log=lambda s: print(s, file=sys.stderr))
    print(f"{m['sequences']} sequences, {m['tokens']} tokens in {len(m['shards'])} shards at {args.out}",
          file=sys.stderr)
    return 0


def _extract_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help=_DATA_HELP)
    p.add_argument("--out", required=True, help="folder for the shards and manifest.json")
    p.add_argument("--capture-layers", default=None, help="after_layers ids (default: [1, n//2-1, n-4])")
    p.add_argument("--max-len", type=int, default=2048, help="longest sequence, in tokens")
    p.add_argument("--shard-size", type=int, default=256, help="sequences per shard")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--feature-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
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
    from .pair import pick_device
    from .train.run import run_train
    from .train.trainer import TrainConfig

    cfg = TrainConfig(out=args.out, batch_size=args.batch_size, epochs=args.epochs, max_steps=args.max_steps,
                      lr=args.lr, warmup=args.warmup, ttt_length=args.ttt_length, save_every=args.save_every,
                      eval_every=args.eval_every, seed=args.seed, grad_clip=args.grad_clip)
    res = run_train(args.target, args.out, cfg, args.data, args.features, args.init_draft, capture_override(args),
                    args.draft_vocab_size, args.max_len, args.heldout, args.backend, pick_device(args.device),
                    None if args.dtype == "auto" else args.dtype, log=lambda s: print(s, file=sys.stderr))
    if "heldout" in res:
        from .observe.report import per_position_table, print_table

        h = res["heldout"]
        print_table(per_position_table({"held-out top-1 accuracy": h["per_position_acc"]},
                                       title=f"after {res['steps']} steps: simulated accept length "
                                             f"{h['simulated_accept_length']:.2f}"))
    return 0


def _train_args(p):
    p.add_argument("--target", required=True, help="the target model folder the draft is for")
    p.add_argument("--data", help=_DATA_HELP + " (online training)")
    p.add_argument("--features", help="a folder written by eaglekit extract (offline training)")
    p.add_argument("--out", required=True, help="run folder: checkpoint/, train_log.jsonl, draft/")
    p.add_argument("--init-draft", help="continue from this draft (its vocabulary mapping is kept)")
    p.add_argument("--capture-layers", default=None, help="after_layers ids (default: [1, n//2-1, n-4])")
    p.add_argument("--draft-vocab-size", type=int, default=None, help="default: the target's vocabulary size")
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--heldout", type=float, default=0.02, help="share of samples kept for evaluation")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8, help="per process")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=float, default=0.03, help="fraction of steps (< 1) or a step count")
    p.add_argument("--grad-clip", type=float, default=0.5)
    p.add_argument("--ttt-length", type=int, default=7)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    add_runtime(p)


cmd_train.add_args = _train_args


@command("eval", "held-out accuracy per draft position, simulated and real accept length")
def cmd_eval(args) -> int:
    """With --data: top-1 accuracy at each TTT position and the simulated accept length
    (1 + sum_k prod_{i<=k} acc_i, SGLang scale) on held-out data. With --prompt-file: the real engine's
    accept length, per-position acceptance and a check that the output equals the target's."""
    from .pair import pick_device
    from .train.run import run_eval

    shape = tree_shape(args)
    res = run_eval(args.target, args.draft, args.data, args.prompt_file, shape, args.max_new_tokens, args.max_len,
                   args.ttt_length, args.batch_size, capture_override(args), args.backend, pick_device(args.device),
                   None if args.dtype == "auto" else args.dtype)
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
        print(f"decode: accept length {d['accept_length']:.2f} over {d['prompts']} prompts, "
              f"identical to the target: {d['identical_to_target']}", file=sys.stderr)
    print_table(per_position_table(rows))
    return 0


def _eval_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--data", help="held-out data in a training format")
    p.add_argument("--prompt-file", help="prompts to decode (JSONL or ---separated text)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--ttt-length", type=int, default=7)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", action="store_true")
    add_tree(p)
    add_capture(p)
    add_runtime(p)


cmd_eval.add_args = _eval_args


@command("recipe", "rebuild the shipped demo pair from nothing (eaglekit recipe demo)")
def cmd_recipe(args) -> int:
    """Trains the demo target on the Python standard library of this interpreter (file list and hash recorded
    in OUT/corpus.json, ~5% of files held out), regenerates data with it, trains its EAGLE-3 draft and
    evaluates the pair. --preset gpu is what the shipped pair used (one H200, ~7 minutes); --preset cpu makes
    a smaller pair on a CPU. Stages already done in OUT are skipped, so a killed recipe resumes."""
    import shutil
    from pathlib import Path

    from .train.recipe import run_demo_recipe

    if args.name != "demo":
        raise InputError(f"unknown recipe {args.name!r}", fix="the recipe is: demo", code="E108")
    s = run_demo_recipe(args.out, args.preset, args.device, log=lambda m: print(m, file=sys.stderr),
                        stop_after=args.stop_after, stdlib=args.stdlib)
    if "stopped_after" in s:
        print(json.dumps(s, indent=2))
        return 0
    if args.install:
        from .demo import ASSETS

        ASSETS.mkdir(parents=True, exist_ok=True)
        for name in ("target", "draft"):
            shutil.rmtree(ASSETS / name, ignore_errors=True)
            shutil.copytree(Path(args.out) / name, ASSETS / name)
        for name in ("prompts.jsonl", "recipe.json", "corpus.json"):
            shutil.copy(Path(args.out) / name, ASSETS / name)
        print(f"installed the pair into {ASSETS}", file=sys.stderr)
    print(json.dumps(s["eval"], indent=2))
    return 0


def _recipe_args(p):
    p.add_argument("name", choices=["demo"])
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--preset", default="cpu", choices=["gpu", "cpu", "tiny"])
    p.add_argument("--device", default="auto")
    p.add_argument("--install", action="store_true", help="copy the result into eaglekit/assets/demo")
    p.add_argument("--stdlib", default=None,
                   help="the standard-library folder to train on (default: this interpreter's); the shipped pair "
                        "used CPython 3.11.7's")
    p.add_argument("--stop-after", choices=["corpus", "tokenizer", "target", "regen"], default=None,
                   help="stop after this stage (a later call continues from it)")


cmd_recipe.add_args = _recipe_args


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
            with open(args.json, "w") as f:
                f.write(doc + "\n")
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
