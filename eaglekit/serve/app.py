"""The OpenAI-compatible routes over one Scheduler (FastAPI).

    POST /v1/completions, /v1/chat/completions   (stream: SSE `data: {chunk}` ... `data: [DONE]`)
    GET  /v1/models, /health, /metrics (Prometheus, vLLM names), /server_info and /get_server_info (SGLang)

Every refusal is an OpenAI error body {"error": {"message", "type", "param", "code"}}: 400 for bad input
(checked before the request reaches the engine, and before any streamed byte), 408 for a body that does not
arrive within --read-timeout, 413 for one larger than --max-body-mb, 429 when the queue is full, 503 while
shutting down (and for a request still running when --drain-timeout ends: a stream then ends with an error
event and `data: [DONE]`). A client that goes away is cancelled in the engine at once (slot and KV freed).
Responses carry `usage` and, as an extension, `spec_decode` (this request's accept length on SGLang's
scale: tokens per verify step, bonus included).

The event loop does no CPU work of size set by a client: JSON parsing, tokenization, chat templates and the
detokenization of a long window run in worker threads (`prep` and `text`), so that one large prompt does not stall
/health or other clients' streams. A step's few tokens are detokenized on the loop (at most INLINE_DETOK_TOKENS
decoded): a hop to a thread and back per streamed step costs more than the decode (two decodes of at most 64
tokens, ~25 us), and takes the GIL from the engine thread each time (a tiny-shape engine served one request at a
time on 2 cores: output 636 -> 731 tok/s without a draft, 873 -> 889 with one, medians of 16 alternating rounds;
docs/performance.md#d38).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..decoding.protocols import missing
from ..decoding.sampling import SamplingParams
from ..errors import EaglekitError
from ..observe import trace
from ..options import ServeOptions
from ..tokenizer import encode
from .detok import Detokenizer
from .limits import PromptBound, read_body
from .metrics import ServerMetrics
from .protocol import ApiError, bad, chat_ids, from_eaglekit, parse_chat, parse_completion, parse_json
from .scheduler import Handle, Scheduler

# tokens a push may decode on the event loop (its window and its new tokens: tens of microseconds). A stream's window
# is its last released piece plus what a step added; steps of up to 8 tokens over 3-byte characters stay under it
INLINE_DETOK_TOKENS = 64


def _trace(point: str, **meta) -> None:
    """EAGLE3_DEBUG request records, beside the engine's tensor records (same stream and file)."""
    if not trace.ENABLED:
        return
    print(f"[EAGLE3_DEBUG] {point:<22} " + " ".join(f"{k}={v}" for k, v in meta.items()), file=sys.stderr)
    if trace.FILE:
        with open(trace.FILE, "a") as f:
            f.write(json.dumps({"point": point, **meta}) + "\n")


class _SSE(StreamingResponse):
    """A stream whose request is cancelled in the engine however the response ends (done, client gone,
    server shutting down), at once rather than when the generator is garbage-collected."""

    def __init__(self, content, handle: Handle):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.handle = handle

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.handle.cancel()


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _Exchange:
    """One request's answer as it is built: its id, the head every chunk carries, the detokenizer, and the usage,
    spec_decode and finish_reason fields read from its Handle at the end."""

    def __init__(self, app: "ServeApp", p, prompt_ids: list[int], chat: bool, h: Handle):
        self.app, self.p, self.prompt_ids, self.chat, self.h = app, p, prompt_ids, chat, h
        self.detok = Detokenizer(app.tokenizer, p.stop)
        self.created = int(time.time())
        self.head = {
            "id": h.rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": p.model,
            **app.fingerprint,
        }

    async def push(self, ids, final: bool) -> str:
        """On the loop up to INLINE_DETOK_TOKENS (module docstring), else in the text pool."""
        if self.detok.window + len(ids) <= INLINE_DETOK_TOKENS:
            return self.detok.push(ids, final)
        return await asyncio.get_running_loop().run_in_executor(self.app.text_pool, self.detok.push, ids, final)

    def usage(self) -> dict:
        n = len(self.prompt_ids)
        return {"prompt_tokens": n, "completion_tokens": self.h.tokens, "total_tokens": n + self.h.tokens}

    def spec(self) -> dict | None:
        h = self.h
        if h.drafts == 0:
            return None
        assert h.accept_length is not None  # a request that drafted has verified
        return {
            "accept_length": round(h.accept_length, 4),
            "num_drafts": h.drafts,
            "num_draft_tokens": h.draft_tokens,
            "num_accepted_tokens": h.accepted,
        }

    def finish_reason(self) -> str:
        return "length" if self.h.stop_reason == "length" else "stop"

    def choice(self, text: str, fr: str | None, final: bool) -> dict:
        """A choice of a chunk (`final` False) or of the whole answer."""
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": fr}
        if final:
            return {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": fr,
            }
        return {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None, "finish_reason": fr}

    async def chunks(self):
        """The SSE stream: a role chunk (chat), a chunk per step with text, the usage chunk if asked, [DONE]."""
        p, h = self.p, self.h
        try:
            if self.chat:
                yield _sse(
                    {
                        **self.head,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            async for ev in h:
                text = await self.push(ev.token_ids, ev.finished)
                fr = self.finish_reason() if ev.finished else None
                if not text and fr is None:
                    continue  # a character still incomplete, or text held back for a stop string
                body = {**self.head, "choices": [self.choice(text, fr, False)]}
                if p.include_usage:
                    body["usage"] = None
                if fr is not None:
                    body["spec_decode"] = self.spec()
                yield _sse(body)
                if ev.finished:
                    break
            if p.include_usage:
                yield _sse({**self.head, "choices": [], "usage": self.usage(), "spec_decode": self.spec()})
        except ApiError as e:
            yield _sse(e.body())
        yield "data: [DONE]\n\n"

    async def whole(self, request: Request):
        """The non-streamed answer, or a 499 when the client goes away first (the request is cancelled then)."""
        h = self.h

        async def collect():
            text = []
            async for ev in h:
                text.append(await self.push(ev.token_ids, ev.finished))
                if ev.finished:
                    break
            return "".join(text)

        async def disconnected():
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected())
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
            h.cancel()  # no-op when finished; frees the slot when the client went away
        if work not in done:
            return Response(status_code=499)  # nobody is listening
        return {
            "id": h.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.p.model,
            **self.app.fingerprint,
            "choices": [self.choice(work.result(), self.finish_reason(), True)],
            "usage": self.usage(),
            "spec_decode": self.spec(),
        }


class ServeApp:
    """The routes over one Scheduler. `engine`: an Engine (eaglekit.decoding.protocols: a BatchEngine, a Lockstep);
    `opts`: the server's options, of which the app reads the model names accepted in `model` (served_model_name, the
    first listed first by /v1/models; required), the batch and queue sizes, the drain timeout and the request limits;
    `context`: the target's context length in tokens. `.app` is the FastAPI application; `app.state.drain()` is what
    SIGTERM runs before uvicorn closes the connections (eaglekit.serve.server)."""

    def __init__(
        self,
        engine,
        tokenizer,
        opts: ServeOptions,
        context: int,
        chat_template: str | None = None,
        info: dict | None = None,
        speculative: bool = False,
        positions: int = 0,
        vocab_size: int | None = None,
    ):
        if not opts.served_model_name:
            raise ValueError("build_app: opts.served_model_name names no model")
        lacks = missing(engine)
        if lacks:
            raise TypeError(
                f"build_app: {type(engine).__name__} is not an engine "
                f"(eaglekit.decoding.protocols.Engine): it lacks {', '.join(lacks)}"
            )
        self.engine, self.tokenizer, self.opts, self.context = engine, tokenizer, opts, context
        self.served: list[str] = list(opts.served_model_name)
        self.chat_template, self.info, self.vocab_size = chat_template, info, vocab_size
        self.metrics = ServerMetrics(self.served[0], speculative, positions)
        # benchmark mode: every response names it (OpenAI's system_fingerprint), as /server_info and /metrics do
        synthetic = engine.synthetic
        self.fingerprint = {"system_fingerprint": "eaglekit-synthetic-acceptance"} if synthetic is not None else {}
        self.metrics.synthetic.set(synthetic or 0.0)
        self.max_body = int(opts.max_body_mb * 2**20)
        self.bound = PromptBound(tokenizer, context)
        # two pools: a long tokenization in `prep` must not delay the detokenization of running streams in `text`
        self.prep = ThreadPoolExecutor(max_workers=2, thread_name_prefix="eaglekit-prep")
        self.text_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eaglekit-text")
        self.sched = Scheduler(engine, self.metrics, opts.max_batch, opts.max_queue, on_finish=self._finished)
        self.started = int(time.time())
        self.app = self._routes(FastAPI(title="eaglekit", lifespan=self._lifespan))

    @staticmethod
    def _finished(h: Handle) -> None:
        _trace(
            "serve.request.done",
            rid=h.rid,
            reason=h.stop_reason,
            completion_tokens=h.tokens,
            accept_length=None if h.accept_length is None else round(h.accept_length, 4),
        )

    @asynccontextmanager
    async def _lifespan(self, app):
        self.sched.start()
        yield
        await self.sched.drain(self.opts.drain_timeout)  # no-op after app.state.drain (SIGTERM); a test's server's end
        await self.sched.close()
        self.prep.shutdown(wait=False, cancel_futures=True)
        self.text_pool.shutdown(wait=False, cancel_futures=True)

    def _routes(self, app: FastAPI) -> FastAPI:
        app.state.scheduler, app.state.metrics, app.state.engine = self.sched, self.metrics, self.engine
        app.state.drain = lambda: self.sched.drain(self.opts.drain_timeout)
        app.exception_handler(ApiError)(self._api_error)
        app.exception_handler(ClientDisconnect)(self._gone)
        app.exception_handler(StarletteHTTPException)(self._http_error)
        app.exception_handler(Exception)(self._bug)
        app.get("/health")(self.health)
        app.get("/v1/models")(self.models)
        app.get("/metrics")(self.prom)
        app.get("/server_info")(self.server_info)
        app.get("/get_server_info")(self.server_info)
        app.post("/v1/completions")(self.completions)
        app.post("/v1/chat/completions")(self.chat_completions)
        return app

    # --- refusals ------------------------------------------------------------------------------------
    async def _api_error(self, request, e: ApiError):
        if e.status in (400, 408, 413):
            self.metrics.reject({400: "bad_request", 408: "timeout", 413: "too_large"}[e.status])
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def _gone(self, request, e):
        return Response(status_code=499)  # the client left mid-upload: nobody reads this, nothing to log

    async def _http_error(self, request, e):
        return JSONResponse(
            ApiError(e.status_code, str(e.detail), code=str(e.status_code)).body(), status_code=e.status_code
        )

    async def _bug(self, request, e):
        return JSONResponse(ApiError(500, f"internal error: {e!r}", code="internal_error").body(), status_code=500)

    # --- plain routes --------------------------------------------------------------------------------
    async def health(self):
        if not self.sched.alive:
            raise ApiError(503, "the engine thread is not running", code="engine_down")
        return {"status": "ok"}

    async def models(self):
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": self.started,
                    "owned_by": "eaglekit",
                    "root": self.served[0],
                    "max_model_len": self.context,
                }
                for name in self.served
            ],
        }

    async def prom(self):
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def server_info(self):
        engine, sched = self.engine, self.sched
        s = dict(engine.spec_stats or {})
        policy = engine.policy
        phases = engine.profile()  # (eaglekit serve --profile: each phase's time since the start; else None)
        # (with the profile: the engine thread's busy seconds since the start, inside its steps and around them)
        loop = None if phases is None else {k: round(1e3 * v, 3) for k, v in sched.loop_seconds.items()}
        avg = 1 + s["num_accepted_tokens"] / s["num_drafts"] if s.get("num_drafts") else None
        return {
            **(self.info or {}),
            "served_model_name": self.served[0],
            "max_batch": self.opts.max_batch,
            "max_queue": self.opts.max_queue,
            "context_length": self.context,
            "internal_states": [
                {
                    "avg_spec_accept_length": avg,
                    "num_running": engine.num_running,
                    "num_waiting": engine.num_waiting,
                    "in_flight": len(sched.handles),
                    "cancelled": sched.cancelled,
                    "engine_steps": sched.steps,
                    "engine_step_errors": sched.step_errors,
                    "spec_stats": s,
                    "spec_policy": policy.summary() if policy is not None else None,
                    "phase_profile": phases,
                    "loop_ms": loop,
                }
            ],
        }

    # --- generation ----------------------------------------------------------------------------------
    async def completions(self, request: Request):
        p, ids = await self._in_prep(self._completion_ids, await self._body(request))
        return await self._run(request, p, ids, chat=False)

    async def chat_completions(self, request: Request):
        p, ids = await self._in_prep(self._chat_prompt_ids, await self._body(request))
        return await self._run(request, p, ids, chat=True)

    async def _body(self, request: Request) -> bytes:
        return await read_body(request, self.max_body, self.opts.read_timeout)

    async def _in_prep(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.prep, fn, *args)

    def _completion_ids(self, raw: bytes):  # prep thread
        p = parse_completion(parse_json(raw), self.served)
        assert p.prompt is not None  # parse_completion sets it or raises
        if isinstance(p.prompt, str):
            self.bound.check(p.prompt, "prompt")
            ids = encode(self.tokenizer, p.prompt)
        else:
            ids = list(p.prompt)
        if self.vocab_size is not None and not all(0 <= i < self.vocab_size for i in ids):
            raise bad(f"prompt token ids must lie in 0..{self.vocab_size - 1}", "prompt", "invalid_token_id")
        return p, ids

    def _chat_prompt_ids(self, raw: bytes):  # prep thread
        p = parse_chat(parse_json(raw), self.served)
        assert p.messages is not None  # parse_chat sets them or raises
        self.bound.check("".join(m["content"] for m in p.messages), "messages")
        return p, chat_ids(self.tokenizer, p.messages, self.chat_template)

    def _make_request(self, p, prompt_ids: list[int], default_max: int, rid: str):
        from ..decoding.engine import Request

        context = self.context
        max_tokens = p.max_tokens if p.max_tokens is not None else default_max
        if len(prompt_ids) >= context:  # no room for one new token, whatever max_tokens says
            raise bad(
                f"the prompt is {len(prompt_ids)} tokens, {len(prompt_ids) - context + 1} more than the "
                f"model's context of {context} tokens leaves for it (one token is kept for the answer); "
                f"shorten it",
                "messages" if p.messages is not None else "prompt",
                "context_length_exceeded",
            )
        if len(prompt_ids) + max_tokens > context:
            raise bad(
                f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
                f"context of {context} tokens",
                "max_tokens" if p.max_tokens is not None else "prompt",
                "context_length_exceeded",
            )
        try:
            sp = SamplingParams(p.temperature, p.top_p, p.top_k, p.seed)
            req = Request(
                rid=rid,
                prompt_ids=prompt_ids,
                max_new_tokens=max_tokens,
                sampling=sp,
                stop_strings=p.stop,
                eos_ids=() if p.ignore_eos else None,
            )
            self.engine.validate(req)
        except EaglekitError as e:
            raise from_eaglekit(e) from None
        return req

    async def _run(self, request: Request, p, prompt_ids: list[int], chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        remaining = max(self.context - len(prompt_ids), 1)
        req = self._make_request(p, prompt_ids, remaining if chat else min(16, remaining), rid)
        h = self.sched.submit(req)
        _trace(
            "serve.request",
            rid=rid,
            prompt_tokens=len(prompt_ids),
            max_tokens=req.max_new_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            stop=list(p.stop),
            stream=p.stream,
        )
        x = _Exchange(self, p, prompt_ids, chat, h)
        if p.stream:
            return _SSE(x.chunks(), h)
        return await x.whole(request)


def build_app(
    engine,
    tokenizer,
    opts: ServeOptions,
    context: int,
    chat_template: str | None = None,
    info: dict | None = None,
    speculative: bool = False,
    positions: int = 0,
    vocab_size: int | None = None,
) -> FastAPI:
    """The FastAPI application of a ServeApp (which says what each argument is)."""
    return ServeApp(engine, tokenizer, opts, context, chat_template, info, speculative, positions, vocab_size).app
