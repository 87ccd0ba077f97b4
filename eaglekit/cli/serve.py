"""The `eaglekit` commands about serving: serve (the OpenAI-compatible HTTP server), kernels (which products kinds run
on this machine, built and bit-checked) and bench (load on an OpenAI-compatible server, measured)."""

from __future__ import annotations

import json

from ..errors import InputError
from .common import add_capture, add_compile, add_runtime, add_tp, add_tree, check_folders, model_options, tree_shape
from .registry import command


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
    from ..options import ServeOptions
    from ..serve.server import check_options, serve

    model = model_options(args)
    shape = tree_shape(args) if args.draft else None
    names = args.served_model_name or [args.target_source or args.target]  # a .gguf: its path as given
    opts = ServeOptions.from_args(args, served_model_name=names)
    check_options(opts)
    if opts.synthetic_accept_length is not None:  # checked before anything loads, like every serve option
        from ..decoding.accept import synthetic_rate

        if not args.draft:
            raise InputError(
                "--synthetic-accept-length needs a draft to accept tokens of", fix="add --draft DIR", code="E317"
            )
        assert shape is not None  # made above when there is a draft
        synthetic_rate(opts.synthetic_accept_length, shape.path_len - 1)
    check_folders(args.target, args.draft)
    return serve(model, opts, shape)


def _serve_args(p):
    from ..options import ServeOptions

    p.add_argument(
        "--target", required=True, help="target model folder (config.json, safetensors, tokenizer) or a .gguf file"
    )
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
    from ..kernels.check import main as check

    return check((["--json"] if args.json else []) + (["--only", *args.only] if args.only else []))


def _kernels_args(p):
    from ..kernels.check import KINDS

    p.add_argument("action", choices=["check"], help="check: build and check every kind that runs here")
    p.add_argument("--json", action="store_true", help="the rows as JSON instead of a table")
    p.add_argument(
        "--only", nargs="+", choices=list(KINDS), metavar="KIND", help=f"check these kinds only ({', '.join(KINDS)})"
    )


cmd_kernels.add_args = _kernels_args


# --- bench ------------------------------------------------------------------------------------------
@command("bench", "load an OpenAI-compatible server: TTFT, TPOT, ITL, latency, tok/s, spec-decode acceptance")
def cmd_bench(args) -> int:
    """Streams the prompt set (the demo prompts, or --prompts FILE) to --endpoint's /v1/completions or
    /v1/chat/completions at each --concurrency level, arrivals Poisson at --request-rate (inf: all at once),
    bounded by --num-prompts and --max-seconds. Reports completed/failed, request and output throughput,
    TTFT, TPOT, ITL and end-to-end latency (mean, median, p99), and the server's spec-decode acceptance where
    it exposes it (vLLM /metrics counters over the run, SGLang /server_info)."""
    from ..serve.bench import BenchOptions, options_dict, render, run_bench

    try:
        levels = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
        rate = float(args.request_rate)
    except ValueError:
        raise InputError(
            f"--concurrency {args.concurrency!r} / --request-rate {args.request_rate!r} are not numbers",
            fix="e.g. --concurrency 1,4,16 --request-rate inf",
            code="E108",
        ) from None
    if not levels or min(levels) < 1 or rate <= 0 or args.num_prompts < 1:
        raise InputError(
            "concurrency levels, --num-prompts and --request-rate must be positive",
            fix="e.g. --concurrency 1,4 --num-prompts 32",
            code="E108",
        )
    if args.json and args.json != "-":
        from ..io import no_overlap

        no_overlap(args.json, "--json", {"--prompts": args.prompts})
    opts = BenchOptions(
        endpoint=args.endpoint,
        api=args.api,
        model=args.model,
        prompts=args.prompts,
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        concurrency=levels,
        request_rate=rate,
        max_seconds=args.max_seconds,
        ignore_eos=args.ignore_eos,
        seed=args.seed,
    )
    res = run_bench(opts)
    render(res)
    if args.json:
        doc = json.dumps({"options": options_dict(opts), "levels": res}, indent=1)
        if args.json == "-":
            print(doc)
        else:
            from ..io import atomic_write_bytes

            atomic_write_bytes(args.json, (doc + "\n").encode())
    return 0 if all(lv["failed"] == 0 for lv in res) else 1


def _bench_args(p):
    p.add_argument("--endpoint", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--api", default="completions", choices=["completions", "chat"])
    p.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    p.add_argument(
        "--prompts", help='a prompt file (.jsonl with "prompt", or text separated by ---); default: the demo prompts'
    )
    p.add_argument("--num-prompts", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,4,16")
    p.add_argument("--request-rate", default="inf", help="requests per second, Poisson arrivals (inf: all at once)")
    p.add_argument("--max-seconds", type=float, help="stop each level after this long (unfinished requests fail)")
    p.add_argument("--ignore-eos", action="store_true", help="fixed-length outputs (vLLM / SGLang extension)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    p.add_argument("--json", help="write the results as JSON to this path ('-': stdout)")


cmd_bench.add_args = _bench_args
