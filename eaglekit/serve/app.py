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
`benchmarks/lab/serve_app_ab.py`; docs/performance.md#d38).
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


def build_app(engine, tokenizer, opts: ServeOptions, context: int, chat_template: str | None = None,
              info: dict | None = None, speculative: bool = False, positions: int = 0,
              vocab_size: int | None = None) -> FastAPI:
    """`engine`: an Engine (eaglekit.decoding.protocols: a BatchEngine, a Lockstep); `opts`: the server's options, of
    which the app reads the model names accepted in `model` (served_model_name, the first listed first by /v1/models;
    required), the batch and queue sizes, the drain timeout and the request limits; `context`: the target's context
    length in tokens. `app.state.drain()` is what SIGTERM runs before uvicorn closes the connections
    (eaglekit.serve.server)."""
    served, max_batch, max_queue, drain_timeout = opts.served_model_name, opts.max_batch, opts.max_queue, \
        opts.drain_timeout
    max_body_mb, read_timeout = opts.max_body_mb, opts.read_timeout
    if not served:
        raise ValueError("build_app: opts.served_model_name names no model")
    lacks = missing(engine)
    if lacks:
        raise TypeError(f"build_app: {type(engine).__name__} is not an engine (eaglekit.decoding.protocols.Engine): "
                        f"it lacks {', '.join(lacks)}")
    metrics = ServerMetrics(served[0], speculative, positions)
    # benchmark mode: every response names it (OpenAI's system_fingerprint), as /server_info and /metrics do
    synthetic = engine.synthetic
    fingerprint = {"system_fingerprint": "eaglekit-synthetic-acceptance"} if synthetic is not None else {}
    metrics.synthetic.set(synthetic or 0.0)
    max_body = int(max_body_mb * 2**20)
    bound = PromptBound(tokenizer, context)
    # two pools: a long tokenization in `prep` must not delay the detokenization of running streams in `text`
    prep = ThreadPoolExecutor(max_workers=2, thread_name_prefix="eaglekit-prep")
    text_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eaglekit-text")

    async def in_prep(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(prep, fn, *args)

    def finished(h: Handle) -> None:
        _trace("serve.request.done", rid=h.rid, reason=h.stop_reason, completion_tokens=h.tokens,
               accept_length=None if h.accept_length is None else round(h.accept_length, 4))

    sched = Scheduler(engine, metrics, max_batch, max_queue, on_finish=finished)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        sched.start()
        yield
        await sched.drain(drain_timeout)  # no-op after app.state.drain (SIGTERM); the end of a test's server
        await sched.close()
        prep.shutdown(wait=False, cancel_futures=True)
        text_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="eaglekit", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.engine = sched, metrics, engine
    app.state.drain = lambda: sched.drain(drain_timeout)

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        if e.status in (400, 408, 413):
            metrics.reject({400: "bad_request", 408: "timeout", 413: "too_large"}[e.status])
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request, e):
        return Response(status_code=499)  # the client left mid-upload: nobody reads this, nothing to log

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e):
        return JSONResponse(ApiError(e.status_code, str(e.detail), code=str(e.status_code)).body(),
                            status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _bug(request, e):
        return JSONResponse(ApiError(500, f"internal error: {e!r}", code="internal_error").body(), status_code=500)

    # --- plain routes --------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if not sched.alive:
            raise ApiError(503, "the engine thread is not running", code="engine_down")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": started, "owned_by": "eaglekit",
                                            "root": served[0], "max_model_len": context} for name in served]}

    @app.get("/metrics")
    async def prom():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def server_info():
        s = dict(engine.spec_stats or {})
        policy = engine.policy
        phases = engine.profile()  # (eaglekit serve --profile: each phase's time since the start; else None)
        avg = 1 + s["num_accepted_tokens"] / s["num_drafts"] if s.get("num_drafts") else None
        return {**(info or {}), "served_model_name": served[0], "max_batch": max_batch, "max_queue": max_queue,
                "context_length": context,
                "internal_states": [{"avg_spec_accept_length": avg, "num_running": engine.num_running,
                                     "num_waiting": engine.num_waiting, "in_flight": len(sched.handles),
                                     "cancelled": sched.cancelled, "engine_steps": sched.steps,
                                     "engine_step_errors": sched.step_errors, "spec_stats": s,
                                     "spec_policy": policy.summary() if policy is not None else None,
                                     "phase_profile": phases}]}

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    # --- generation ----------------------------------------------------------------------------------
    def make_request(p, prompt_ids: list[int], default_max: int, rid: str):
        from ..decoding.engine import Request

        max_tokens = p.max_tokens if p.max_tokens is not None else default_max
        if len(prompt_ids) >= context:  # no room for one new token, whatever max_tokens says
            raise bad(f"the prompt is {len(prompt_ids)} tokens, {len(prompt_ids) - context + 1} more than the "
                      f"model's context of {context} tokens leaves for it (one token is kept for the answer); "
                      f"shorten it", "messages" if p.messages is not None else "prompt", "context_length_exceeded")
        if len(prompt_ids) + max_tokens > context:
            raise bad(f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
                      f"context of {context} tokens", "max_tokens" if p.max_tokens is not None else "prompt",
                      "context_length_exceeded")
        try:
            sp = SamplingParams(p.temperature, p.top_p, p.top_k, p.seed)
            req = Request(rid=rid, prompt_ids=prompt_ids, max_new_tokens=max_tokens, sampling=sp,
                          stop_strings=p.stop, eos_ids=() if p.ignore_eos else None)
            engine.validate(req)
        except EaglekitError as e:
            raise from_eaglekit(e) from None
        return req

    async def run(request: Request, p, prompt_ids: list[int], chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        remaining = max(context - len(prompt_ids), 1)
        req = make_request(p, prompt_ids, remaining if chat else min(16, remaining), rid)
        h = sched.submit(req)
        _trace("serve.request", rid=rid, prompt_tokens=len(prompt_ids), max_tokens=req.max_new_tokens,
               temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, stop=list(p.stop), stream=p.stream)
        detok = Detokenizer(tokenizer, p.stop)
        loop = asyncio.get_running_loop()

        async def push(ids, final):  # on the loop up to INLINE_DETOK_TOKENS (module docstring), else off it
            if detok.window + len(ids) <= INLINE_DETOK_TOKENS:
                return detok.push(ids, final)
            return await loop.run_in_executor(text_pool, detok.push, ids, final)

        created = int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": p.model, **fingerprint}

        def usage(h):
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": h.tokens,
                    "total_tokens": len(prompt_ids) + h.tokens}

        def spec(h):
            if h.drafts == 0:
                return None
            return {"accept_length": round(h.accept_length, 4), "num_drafts": h.drafts,
                    "num_draft_tokens": h.draft_tokens, "num_accepted_tokens": h.accepted}

        def finish_reason(h):
            return "length" if h.stop_reason == "length" else "stop"

        if p.stream:
            async def chunks():
                try:
                    if chat:
                        yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None}]})
                    async for ev in h:
                        text = await push(ev.token_ids, ev.finished)
                        fr = finish_reason(h) if ev.finished else None
                        if not text and fr is None:
                            continue  # a character still incomplete, or text held back for a stop string
                        choice = ({"index": 0, "delta": {"content": text} if text else {}, "logprobs": None,
                                   "finish_reason": fr} if chat else
                                  {"index": 0, "text": text, "logprobs": None, "finish_reason": fr})
                        body = {**head, "choices": [choice]}
                        if p.include_usage:
                            body["usage"] = None
                        if fr is not None:
                            body["spec_decode"] = spec(h)
                        yield _sse(body)
                        if ev.finished:
                            break
                    if p.include_usage:
                        yield _sse({**head, "choices": [], "usage": usage(h), "spec_decode": spec(h)})
                except ApiError as e:
                    yield _sse(e.body())
                yield "data: [DONE]\n\n"

            return _SSE(chunks(), h)

        async def collect():
            text = []
            async for ev in h:
                text.append(await push(ev.token_ids, ev.finished))
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
        text = work.result()
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": finish_reason(h)} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(h)})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": p.model, **fingerprint, "choices": [choice], "usage": usage(h), "spec_decode": spec(h)}

    def completion_ids(raw: bytes):  # prep thread
        p = parse_completion(parse_json(raw), served)
        assert p.prompt is not None  # parse_completion sets it or raises
        if isinstance(p.prompt, str):
            bound.check(p.prompt, "prompt")
            ids = encode(tokenizer, p.prompt)
        else:
            ids = list(p.prompt)
        if vocab_size is not None and not all(0 <= i < vocab_size for i in ids):
            raise bad(f"prompt token ids must lie in 0..{vocab_size - 1}", "prompt", "invalid_token_id")
        return p, ids

    def chat_prompt_ids(raw: bytes):  # prep thread
        p = parse_chat(parse_json(raw), served)
        assert p.messages is not None  # parse_chat sets them or raises
        bound.check("".join(m["content"] for m in p.messages), "messages")
        return p, chat_ids(tokenizer, p.messages, chat_template)

    @app.post("/v1/completions")
    async def completions(request: Request):
        p, ids = await in_prep(completion_ids, await read_body(request, max_body, read_timeout))
        return await run(request, p, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        p, ids = await in_prep(chat_prompt_ids, await read_body(request, max_body, read_timeout))
        return await run(request, p, ids, chat=True)

    return app
