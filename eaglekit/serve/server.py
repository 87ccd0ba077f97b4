"""Load the pair, build the batched engine and the app, run uvicorn until SIGTERM/SIGINT, drain, exit 0.

Every option is checked (check_options) before the tokenizer or the model loads: a bad port or template is
an error in a second, not after the load. On SIGTERM the listening socket closes, requests in flight get
--drain-timeout seconds to finish, the rest end with a 503 their clients read (eaglekit.serve.app), then
uvicorn closes the connections and the process exits 0.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..options import MAX_BODY_MB, READ_TIMEOUT_S, WARM_UP_SPAN, ModelOptions, ServeOptions

if TYPE_CHECKING:
    from ..decoding.engine import BatchEngine
    from .lockstep import Lockstep

# WARM_UP_SPAN (options): cache slots per row that serve prepares before listening (`--warm-up-span`): a prompt plus
# its max_tokens up to it never records a CUDA graph or times the policy inside a step; longer ones grow the caches
# (and record again) once
FLUSH_S = 10  # after the drain: time for the last responses (the 503s) to be written before uvicorn cancels


def chat_template_text(value: str) -> str:
    """--chat-template as vLLM reads it: a value holding `{{` or `{%` is the template itself; anything else is
    the path of a file that holds it (a path that names no file is an error, not a one-line template)."""
    if "{{" in value or "{%" in value:
        text, where = value, "the --chat-template text"
    else:
        f = Path(value)
        if f.is_dir():
            raise InputError(
                f"--chat-template {value} is a directory, expected a Jinja template file",
                code="E114",
                fix="pass the template file (e.g. template.jinja), or the template text itself",
            )
        if not f.is_file():
            raise InputError(
                f"--chat-template {value!r} is neither an existing file nor a template (a template "
                f"holds '{{{{' or '{{%')",
                code="E114",
                fix="pass the path of a Jinja file, or the template text, e.g. "
                "--chat-template \"{% for m in messages %}{{ m['content'] }}{% endfor %}\"",
            )
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"--chat-template {f} is not UTF-8 text ({e.reason} at byte {e.start})",
                code="E116",
                fix="save the template as UTF-8",
            ) from None
        where = str(f)
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise InputError(
            f"{where} is not a valid Jinja template: {e.message} (line {e.lineno})",
            code="E115",
            fix="fix the template; transformers renders it with jinja2",
        ) from None
    return text


def check_port(host: str, port: int) -> None:
    """The address can be bound now (it may still be taken before uvicorn binds it, seconds later)."""
    if not 0 <= port <= 65535:
        raise InputError(
            f"--port {port} is not a TCP port",
            fix="pass a port in 1..65535 (0: any free port, printed at start)",
            code="E108",
        )
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(
            f"--host {host!r} is not an address this machine can listen on ({e.strerror})",
            fix="use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)",
            code="E113",
        ) from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        try:
            s.bind(addr)
        except OSError as e:
            raise InputError(
                f"cannot listen on {host}:{port}: {e.strerror}",
                code="E113",
                fix="pick another --port (0: any free port) or stop what holds this one",
            ) from None


def check_options(o: ServeOptions) -> str | None:
    """Every serve option, before anything loads (E108 / E113-E116). Returns the chat template's text."""
    max_batch, max_queue, spec_max_batch, threads = o.max_batch, o.max_queue, o.spec_max_batch, o.threads
    drain_timeout, max_body_mb, read_timeout, warm_up_span = (
        o.drain_timeout,
        o.max_body_mb,
        o.read_timeout,
        o.warm_up_span,
    )

    def need(ok, flag, value, rule, example):
        if not ok:
            raise InputError(
                f"{flag} {value!r} is not valid: it must be {rule}", fix=f"e.g. {flag} {example}", code="E108"
            )

    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    need(max_batch >= 1, "--max-batch", max_batch, ">= 1", 8)
    need(max_queue >= 0, "--max-queue", max_queue, ">= 0", 64)
    need(
        spec_max_batch is None or spec_max_batch >= 0,
        "--spec-max-batch",
        spec_max_batch,
        ">= 0 (0: never use the draft)",
        4,
    )
    need(threads is None or threads >= 1, "--threads", threads, ">= 1 (leave it out for torch's choice)", 2)
    need(
        number(drain_timeout) and drain_timeout >= 0, "--drain-timeout", drain_timeout, "a number of seconds >= 0", 120
    )
    need(number(max_body_mb) and max_body_mb > 0, "--max-body-mb", max_body_mb, "a size in MiB > 0", MAX_BODY_MB)
    need(
        number(read_timeout) and read_timeout > 0,
        "--read-timeout",
        read_timeout,
        "a number of seconds > 0",
        READ_TIMEOUT_S,
    )
    need(
        isinstance(warm_up_span, int) and not isinstance(warm_up_span, bool) and warm_up_span >= 0,
        "--warm-up-span",
        warm_up_span,
        "a number of cache slots per row >= 0 (0: no warm-up)",
        WARM_UP_SPAN,
    )
    template = chat_template_text(o.chat_template) if o.chat_template else None
    check_port(o.host, o.port)
    return template


def default_threads(device: str) -> int | None:
    """torch's thread count for a server without --threads: on a CPU one fewer than torch's own (at least 1), so that
    the event loop and the HTTP work have a core while the engine steps; None (torch's own) elsewhere. Why: a parallel
    region waits at its barrier for a worker the event loop took the core from. On the 2-core VM the shipped pair
    served 108 / 318 / 582 tok/s with one thread against 86 / 271 / 603 with two at concurrency 1 / 4 / 16, the draft
    166 / 358 / 586 against 133 / 332 / 625 (`python -m benchmarks run cpu-serve-demo --param threads=1` and `=2`,
    docs/performance.md#d39): interactive loads gain, a batch of 16 loses up to
    12% (`--threads` serves it with all of them)."""
    import torch

    if not str(device).startswith("cpu"):
        return None
    return max(1, torch.get_num_threads() - 1)


def _uvicorn_server(config, drain, announce: bool):
    """A uvicorn.Server whose shutdown drains the scheduler before uvicorn waits on (and, past its own timeout,
    cancels) the open responses; defined here because uvicorn is imported only once the options are good."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if announce and self.servers and self.servers[0].sockets:  # --port 0: say which port was picked
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                print(f"eaglekit serve: listening on http://{host}:{port}", file=sys.stderr, flush=True)

        async def shutdown(self, sockets=None):
            for s in self.servers:
                s.close()  # no new connections while the requests in flight finish
            await drain()  # ... and those past --drain-timeout end with a 503 their clients read
            await super().shutdown(sockets)

    return Server(config)


def serve(model: ModelOptions, o: ServeOptions, shape=None) -> int:
    """`eaglekit serve`: the pair of `model` (its target, draft, backend, device, dtype, wiring and how it runs)
    behind the API, served as `o` says; `shape`: the draft tree (None: TreeShape.make()'s)."""
    template = check_options(o)
    from ..distributed import current
    from .app import build_app

    tok, target, draft = _load(model, o, shape)
    tp = current()
    engine: BatchEngine | Lockstep = _engine(target, draft, tok, model, o, shape, tp)
    lockstep = None
    if tp is not None and tp.world > 1:  # --tp N / torchrun: rank 0 serves, the others decode in lockstep
        from .lockstep import Lockstep, follow

        lockstep = Lockstep(engine)
        if tp.rank != 0:
            return follow(lockstep)
        engine = lockstep
    shape = engine.shape
    positions = shape.steps if draft is not None and shape else 0
    assert model.target is not None  # _load refuses a model without one
    served = o.served_model_name or [model.target]
    app = build_app(
        engine,
        tok,
        dataclasses.replace(o, served_model_name=served),
        target.info.max_position_embeddings,
        template,
        _info(model, o, target, draft, engine, tp),
        speculative=draft is not None,
        positions=positions,
        vocab_size=target.info.vocab_size,
    )
    try:
        _run(app, o)
    finally:
        if lockstep is not None:
            lockstep.close()
    print("eaglekit serve: drained and stopped", file=sys.stderr)
    return 0


def _load(model: ModelOptions, o: ServeOptions, shape):
    """(tokenizer, target, draft) as `eaglekit serve` loads them, torch's thread count set first."""
    import torch

    from ..decoding.tree import TreeShape
    from ..pair import load_pair, pick_device
    from ..tokenizer import load_tokenizer

    threads = o.threads or default_threads(pick_device(model.device))
    if threads:
        torch.set_num_threads(threads)  # global to torch: the engine thread runs with it too
    assert model.target is not None  # serving needs a target (--target is required)
    tok = load_tokenizer(model.target)
    # compile 'auto' is off for a server (eaglekit.pair.plan_run says why). A server of one row never batches
    # requests together: it takes the products `generate` takes (`hopper` on sm_90 in bf16, faster than the
    # batch-invariant kernels at one row), so its greedy output is generate's, bit for bit
    rows = o.max_batch * ((shape or TreeShape.make()).draft_tokens if model.draft else 1)
    run = dataclasses.replace(model.runtime, batched=o.max_batch > 1, rows=rows, server=True)
    target, draft = load_pair(model.target, model.draft, model.backend, model.device, model.dtype_name, run=run)
    return tok, target, draft


def _engine(target, draft, tok, model: ModelOptions, o: ServeOptions, shape, tp) -> BatchEngine:
    """The BatchEngine `o` asks for, warmed up (one process; under tensor parallelism the first requests pay)."""
    from ..decoding.config import EngineOptions
    from ..decoding.engine import BatchEngine

    # (under tensor parallelism every rank must take the same step: the policy's timings differ by rank)
    alone = tp is None or tp.world == 1
    opts = EngineOptions(
        shape=shape,
        max_batch=o.max_batch,
        spec_max_batch=o.spec_max_batch,
        capture=model.capture,
        allow_other_target=model.allow_other_target,
        graphs=False if o.no_graphs else "auto",
        adaptive=not o.no_adaptive and alone,
        synthetic_accept_length=o.synthetic_accept_length,
        profile=o.profile,
    )
    engine = BatchEngine(target, draft, opts, tokenizer=tok)
    if engine.synthetic is not None:
        print(
            f"eaglekit serve: SYNTHETIC ACCEPTANCE (benchmark mode): each draft position accepted at rate "
            f"{engine.synthetic:.4f} (accept length {o.synthetic_accept_length}) whatever the target says; the "
            f"output is NOT the target's",
            file=sys.stderr,
            flush=True,
        )
    if o.warm_up_span and alone:  # (the profile counts serving only: warm-up runs no phase)
        # every padded batch size's graphs and policy timings now, before a request waits on them (under tensor
        # parallelism every rank would have to warm up in step: there the first requests still pay)
        w = engine.warm_up(min(o.warm_up_span, target.info.max_position_embeddings), progress=True)
        said = (
            f"warmed up batch sizes {', '.join(map(str, w['sizes']))} at {w['span']} cache slots a row in "
            f"{w['seconds']:.1f} s"
            if w["sizes"]
            else "a one-sequence backend (one row, eager): nothing to warm up"
        )
        print(f"eaglekit serve: {said}", file=sys.stderr, flush=True)
    return engine


def _info(model: ModelOptions, o: ServeOptions, target, draft, engine: BatchEngine | Lockstep, tp) -> dict:
    """/server_info's description of the server (SGLang's field names)."""
    import torch

    from .. import __version__

    shape = engine.shape
    spec = draft is not None and shape
    return {
        "version": f"eaglekit {__version__}",
        "model_path": str(model.target),
        "draft_model_path": None if model.draft is None else str(model.draft),
        "speculative_algorithm": "EAGLE3" if draft is not None else None,
        "speculative_num_steps": shape.steps if spec else None,
        "speculative_eagle_topk": shape.topk if spec else None,
        "speculative_num_draft_tokens": shape.draft_tokens if spec else None,
        "spec_max_batch": engine.spec_max_batch,
        "adaptive_speculation": engine.policy is not None,
        "synthetic_acceptance": None
        if engine.synthetic is None
        else {"accept_length": o.synthetic_accept_length, "rate": engine.synthetic},
        "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads() if target.device.type == "cpu" else None,
        "tp_size": tp.world if tp is not None else 1,
    }


def _run(app, o: ServeOptions) -> None:
    """uvicorn over `app` until SIGTERM or SIGINT, the open responses drained first."""
    import uvicorn

    from .limits import h11_protocol

    config = uvicorn.Config(
        app,
        host=o.host,
        port=o.port,
        log_level=o.log_level,
        lifespan="on",
        http=h11_protocol(o.read_timeout),
        timeout_graceful_shutdown=FLUSH_S,
    )
    server = _uvicorn_server(config, app.state.drain, announce=o.port == 0)
    # uvicorn drains open responses on SIGTERM, then re-raises the signal to the handler that was there before
    # it started; with the default handler the process would die by the signal after a clean drain
    drained = lambda sig, frame: None  # noqa: E731
    signal.signal(signal.SIGTERM, drained)
    signal.signal(signal.SIGINT, drained)
    server.run()
