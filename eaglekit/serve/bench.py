"""`eaglekit bench --endpoint URL`: a load client for any OpenAI-compatible server (vLLM, SGLang, ours).

For each concurrency level: send the prompt set as streaming requests (/v1/completions or
/v1/chat/completions), at most `concurrency` in flight, arrivals Poisson at `request_rate` (inf: all at
once), bounded by `num_prompts` and `max_seconds`. Per request, from the SSE stream:

    TTFT   first content chunk - send            E2E  last byte - send
    ITL    gaps between content chunks           TPOT (E2E - TTFT) / (output tokens - 1)

A speculative server sends several tokens in one chunk, so ITL is per chunk (as `vllm bench serve`
reports it) and TPOT per token. Output tokens come from the stream's final usage record when the server
sends one (stream_options.include_usage), else one per content chunk.

Spec-decode figures, where the server exposes them: vLLM's Prometheus counters (/metrics) read before and
after each level, their difference giving drafts, draft tokens, accepted tokens and accepted per
position (mean acceptance length = 1 + accepted / drafts, per position = accepted_i / drafts); SGLang's
/server_info (older /get_server_info) internal_states[0].avg_spec_accept_length, a running figure since
the server started.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import httpx

from ..errors import InputError

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
DEMO_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "demo" / "prompts.jsonl"


@dataclass
class BenchOptions:
    endpoint: str
    api: str = "completions"  # or "chat"
    model: str | None = None  # None: the first of /v1/models
    prompts: str | None = None  # a prompt file (see eaglekit.tokenizer.read_prompts); None: the demo prompts
    num_prompts: int = 32
    max_tokens: int = 64
    concurrency: tuple[int, ...] = (1,)
    request_rate: float = math.inf
    max_seconds: float | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 300.0


@dataclass
class RequestResult:
    ok: bool
    error: str = ""
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0


# --- parsing ------------------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text exposition -> {(name, sorted labels): value}. A counter's `_total` suffix is dropped
    (servers differ in whether they expose it); `_created` samples (timestamps, not counts) are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if name.endswith("_created"):
            continue
        if name.endswith("_total"):
            name = name[: -len("_total")]
        lab = tuple(sorted((k, v.replace('\\"', '"').replace("\\\\", "\\")) for k, v in _LABEL.findall(labels)))
        try:
            out[(name, lab)] = float(value)
        except ValueError:
            continue
    return out


def vllm_spec_counters(samples: dict) -> dict:
    """The spec-decode counters summed over every other label (model, engine): {name: value} and
    per-position {position: value}."""
    out: dict = {"per_pos": {}}
    for (name, labels), v in samples.items():
        if name in SPEC_COUNTERS:
            out[name] = out.get(name, 0.0) + v
        elif name == PER_POS:
            pos = int(dict(labels).get("position", -1))
            out["per_pos"][pos] = out["per_pos"].get(pos, 0.0) + v
    return out


def spec_figures(before: dict, after: dict) -> dict | None:
    """The counters' difference over the run, as acceptance figures; None when the server has none."""
    if SPEC_COUNTERS[0] not in after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
    drafts, dtoks, acc = (d[k] for k in SPEC_COUNTERS)
    pos = sorted(after["per_pos"])
    per = [after["per_pos"][p] - before.get("per_pos", {}).get(p, 0.0) for p in pos]
    return {
        "source": "vllm /metrics",
        "drafts": int(drafts),
        "draft_tokens": int(dtoks),
        "accepted_tokens": int(acc),
        "accepted_per_pos": [int(x) for x in per],
        "mean_acceptance_length": 1 + acc / drafts if drafts else None,
        "acceptance_rate": acc / dtoks if dtoks else None,
        "acceptance_per_pos": [x / drafts for x in per] if drafts else None,
    }


def parse_sse(lines) -> list[dict | str]:
    """SSE `data:` payloads in order: parsed JSON chunks, and the string "[DONE]" at the end."""
    out: list[dict | str] = []
    for line in lines:
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            out.append("[DONE]")
        elif data:
            out.append(json.loads(data))
    return out


def chunk_text(chunk: dict) -> str:
    """The generated text a completions or chat chunk carries ("" for role-only or usage-only chunks)."""
    parts = []
    for ch in chunk.get("choices") or []:
        if "text" in ch:
            parts.append(ch.get("text") or "")
        else:
            parts.append((ch.get("delta") or {}).get("content") or "")
    return "".join(parts)


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats_ms(values) -> dict:
    xs = [v * 1000 for v in values]
    if not xs:
        return {"mean": None, "median": None, "p99": None}
    return {"mean": sum(xs) / len(xs), "median": percentile(xs, 50), "p99": percentile(xs, 99)}


def summarize(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    out_toks = sum(r.output_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1 and r.ttft is not None]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_tokens": out_toks,
        "output_throughput": out_toks / duration if duration > 0 else None,
        "ttft_ms": stats_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": stats_ms(tpot),
        "itl_ms": stats_ms([x for r in ok for x in r.itl]),
        "e2el_ms": stats_ms([r.latency for r in ok]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


# --- the client ---------------------------------------------------------------------------------------
def _payload(opts: BenchOptions, model: str, prompt: str) -> tuple[str, dict]:
    body = {
        "model": model,
        "max_tokens": opts.max_tokens,
        "temperature": opts.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.ignore_eos:
        body["ignore_eos"] = True  # vLLM and SGLang extension: fixed-length outputs
    if opts.api == "chat":
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


async def one_request(client: httpx.AsyncClient, path: str, body: dict) -> RequestResult:
    t0 = time.perf_counter()
    ttft, last, itl, chunks, usage = None, None, [], 0, None
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                return RequestResult(False, f"HTTP {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                for chunk in parse_sse([line]):
                    if chunk == "[DONE]":
                        continue
                    chunk = cast(dict, chunk)  # the other payloads of an OpenAI stream are JSON objects
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    if not chunk_text(chunk):
                        continue
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        assert last is not None  # set with the first token
                        itl.append(now - last)
                    last = now
                    chunks += 1
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestResult(False, f"{type(e).__name__}: {e}"[:200])
    end = time.perf_counter()
    n = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") is not None else chunks
    # a request that ends at once (EOS first) completed, with no first token to time: ttft None
    return RequestResult(True, ttft=ttft, latency=end - t0, itl=itl, output_tokens=n)


async def _server_figures(client: httpx.AsyncClient) -> tuple[dict | None, dict | None]:
    """(vLLM counters, SGLang server info), each None where the server does not answer."""
    vllm = sglang = None
    try:
        r = await client.get("/metrics")
        if r.status_code == 200:
            vllm = vllm_spec_counters(parse_prometheus(r.text))
    except httpx.HTTPError:
        pass
    for path in ("/server_info", "/get_server_info"):
        try:
            r = await client.get(path)
        except httpx.HTTPError:
            continue
        if r.status_code == 200:
            try:
                sglang = r.json()
            except ValueError:
                sglang = None
            break
    return vllm, sglang


def sglang_figures(info: dict | None) -> dict | None:
    states = (info or {}).get("internal_states") or []
    if states and isinstance(states[0], dict) and states[0].get("avg_spec_accept_length") is not None:
        return {
            "source": "sglang /server_info (since server start)",
            "mean_acceptance_length": float(states[0]["avg_spec_accept_length"]),
        }
    return None


async def run_level(
    client: httpx.AsyncClient, opts: BenchOptions, model: str, prompts: list[str], concurrency: int
) -> dict:
    before, _ = await _server_figures(client)
    sem = asyncio.Semaphore(concurrency)
    rng = random.Random(opts.seed)
    t0 = time.perf_counter()
    deadline = t0 + opts.max_seconds if opts.max_seconds else math.inf

    async def guarded(prompt):
        async with sem:
            if time.perf_counter() >= deadline:
                return None
            path, body = _payload(opts, model, prompt)
            try:
                return await asyncio.wait_for(
                    one_request(client, path, body),
                    max(deadline - time.perf_counter(), 0.001) if deadline < math.inf else None,
                )
            except asyncio.TimeoutError:
                return RequestResult(False, "cut at --max-seconds")

    tasks = []
    for i in range(opts.num_prompts):
        if time.perf_counter() >= deadline:
            break
        tasks.append(asyncio.create_task(guarded(prompts[i % len(prompts)])))
        if math.isfinite(opts.request_rate):
            await asyncio.sleep(rng.expovariate(opts.request_rate))
    results = [r for r in await asyncio.gather(*tasks) if r is not None]
    duration = time.perf_counter() - t0
    after, sg = await _server_figures(client)
    rate = opts.request_rate if math.isfinite(opts.request_rate) else "inf"
    out = {"concurrency": concurrency, "request_rate": rate, **summarize(results, duration)}
    out["spec_decode"] = (spec_figures(before or {}, after) if after else None) or sglang_figures(sg)
    if sg and sg.get("synthetic_acceptance"):  # eaglekit's benchmark mode: the figures are not a real draft's
        out["synthetic_acceptance"] = sg["synthetic_acceptance"]
    return out


async def _model_name(client: httpx.AsyncClient) -> str:
    r = await client.get("/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise InputError("the server lists no model at /v1/models", fix="pass --model", code="E175")
    return data[0]["id"]


def load_prompts(path: str | None) -> list[str]:
    from ..tokenizer import read_prompts

    return read_prompts(path or DEMO_PROMPTS)


async def bench(opts: BenchOptions, transport: httpx.AsyncBaseTransport | None = None) -> list[dict]:
    """One result dict per concurrency level. `transport` replaces the network (tests replay recorded
    server output through httpx.MockTransport)."""
    if opts.api not in ("completions", "chat"):
        raise InputError(f"unknown api {opts.api!r}", fix="use completions or chat", code="E108")
    prompts = load_prompts(opts.prompts)
    limits = httpx.Limits(max_connections=max(opts.concurrency) + 4)
    async with httpx.AsyncClient(
        base_url=opts.endpoint.rstrip("/"), timeout=opts.timeout_s, limits=limits, transport=transport
    ) as c:
        try:
            model = opts.model or await _model_name(c)
        except httpx.HTTPError as e:
            raise InputError(
                f"no OpenAI-compatible server answers at {opts.endpoint} ({type(e).__name__}: {e})",
                fix="start the server, or pass the right --endpoint (e.g. http://127.0.0.1:8000)",
                code="E176",
            ) from None
        levels = []
        for conc in opts.concurrency:
            levels.append(
                {
                    "endpoint": opts.endpoint,
                    "api": opts.api,
                    "model": model,
                    "max_tokens": opts.max_tokens,
                    **await run_level(c, opts, model, prompts, conc),
                }
            )
        return levels


def run_bench(opts: BenchOptions) -> list[dict]:
    return asyncio.run(bench(opts))


# --- output -------------------------------------------------------------------------------------------
def _f(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def render(levels: list[dict], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for lv in levels:
        t = Table(
            title=f"{lv['api']} {lv['endpoint']}  model {lv['model']}  concurrency {lv['concurrency']}  "
            f"rate {lv['request_rate']}",
            show_header=True,
        )
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_row("completed / failed", f"{lv['completed']} / {lv['failed']}")
        t.add_row("duration (s)", _f(lv["duration_s"]))
        t.add_row("request throughput (req/s)", _f(lv["request_throughput"], 3))
        t.add_row("output throughput (tok/s)", _f(lv["output_throughput"]))
        for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency")):
            s = lv[key]
            t.add_row(f"{name} mean / median / p99 (ms)", f"{_f(s['mean'])} / {_f(s['median'])} / {_f(s['p99'])}")
        if lv.get("synthetic_acceptance"):
            t.add_row(
                "SYNTHETIC ACCEPTANCE",
                f"benchmark mode, accept length "
                f"{lv['synthetic_acceptance'].get('accept_length')}: output is not the target's",
            )
        sd = lv.get("spec_decode")
        if sd:
            t.add_row("spec decode", sd["source"])
            t.add_row("mean acceptance length", _f(sd.get("mean_acceptance_length"), 4))
            if "drafts" in sd:
                t.add_row(
                    "drafts / draft tokens / accepted",
                    f"{sd['drafts']} / {sd['draft_tokens']} / {sd['accepted_tokens']}",
                )
                t.add_row("acceptance rate", _f(sd["acceptance_rate"], 4))
                if sd["acceptance_per_pos"]:
                    t.add_row("acceptance per position", " / ".join(f"{x:.4f}" for x in sd["acceptance_per_pos"]))
        else:
            t.add_row("spec decode", "not exposed by the server")
        for e in lv.get("errors") or []:
            t.add_row("error", e)
        console.print(t)


def options_dict(opts: BenchOptions) -> dict:
    d = asdict(opts)
    d["request_rate"] = str(opts.request_rate) if not math.isfinite(opts.request_rate) else opts.request_rate
    return d
