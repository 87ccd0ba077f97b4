"""Hostile clients against the real server (a subprocess on 127.0.0.1, a free port, the shipped demo pair on
CPU, stopped by its own PID): a 10 MB body, stalled and abandoned uploads, bodies that used to be 500s, bad
serve options, and a SIGTERM drain past its timeout, each as its client sees it. Bounded: a few dozen
requests, every wait has a deadline. Figures (stalls, latencies) are printed, not asserted: the machine is
shared. The probes are eaglekit.serve.hostile's."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

from eaglekit.serve import hostile as H
from eaglekit.serve.local import LocalServer

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "eaglekit" / "assets" / "demo"
TARGET, DRAFT = str(DEMO / "target"), str(DEMO / "draft")
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"
READ_TIMEOUT = 2  # seconds: stalled uploads are dropped after this


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    s = LocalServer(["--target", TARGET, "--draft", DRAFT, "--served-model-name", "demo", "--threads", "1",
                     "--device", "cpu", "--dtype", "float32", "--log-level", "warning", "--max-batch", "2",
                     "--max-queue", "4", "--read-timeout", str(READ_TIMEOUT), "--drain-timeout", "1",
                     "--chat-template", TEMPLATE], log=log, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
    s.log_path = log
    yield s
    s.stop()


def _is_openai_error(body, code):
    return (isinstance(body, dict) and set(body.get("error", {})) == {"message", "type", "param", "code"}
            and body["error"]["code"] == code and body["error"]["message"])


def test_a_10mb_body_is_a_413_and_stalls_neither_health_nor_a_stream(srv):
    r = H.big_body(srv.port, "demo", mb=10)
    print(f"\n10 MB body: {r['status']} in {r['seconds']} s; /health worst {r['health_max_s']} s "
          f"(before: {r['health_max_before_s']} s); the stream's longest gap {r['stream_max_gap_s']} s "
          f"(before: {r['stream_max_gap_before_s']} s)")
    assert r["status"] == 413 and _is_openai_error(r["error"], "request_too_large")
    assert r["stream_error"] is None and r["stream_chunks_during"] > 0  # the stream went on during the upload
    assert r["health_polls"] > 0 and r["health_max_s"] < 30  # every poll answered


def test_a_chunked_body_over_the_limit_is_a_413(srv):
    piece = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(80)) + b"0\r\n\r\n"  # 5 MiB > 4
    r = H.raw_exchange(srv.port, H.post_head("/v1/completions", None, chunked=True), chunks)
    assert r["status"] == 413 and _is_openai_error(r["body"], "request_too_large")


def test_bodies_that_were_500s_are_400s_naming_the_field(srv):
    res = H.malformed(srv.port, "demo")
    expect = {"lone surrogate in the prompt": ("invalid_unicode", "prompt"),
              "lone surrogate in a chat message": ("invalid_unicode", "messages[0].content"),
              "seed 2**70": ("invalid_value", "seed"),
              "JSON nested 100,000 deep": ("invalid_json", None),
              "prompt longer than the context": ("context_length_exceeded", "prompt")}
    for name, (code, param) in expect.items():
        assert (res[name]["status"], res[name]["code"], res[name]["param"]) == (400, code, param), (name, res[name])
    assert "shorten" in res["prompt longer than the context"]["message"]
    # a prompt far past any context is refused by its length, before the tokenizer spends time on it
    status, err = H.request(srv.port, "/v1/completions", json.dumps({"model": "demo", "prompt": "y" * 2_000_000,
                                                                     "max_tokens": 2}).encode())
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert H.request(srv.port, "/health", method="GET") == (200, {"status": "ok"})


def test_stalled_and_abandoned_uploads_are_dropped(srv):
    r = H.stalled_uploads(srv.port, n=3, wait_s=READ_TIMEOUT + 2)
    assert r["held_open_body"] == 0 and r["held_open_headers"] == 0, r
    assert r["statuses"] == [408]
    H.abandoned_uploads(srv.port, 3)
    assert H.request(srv.port, "/health", method="GET") == (200, {"status": "ok"})


def test_serve_options_are_checked_before_the_model_loads(capsys, monkeypatch):
    import eaglekit.pair
    from eaglekit.cli import main

    def never(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(eaglekit.pair, "load_pair", never)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = [(["--port", "99999"], "E108", "--port"), (["--threads", "-1"], "E108", "--threads"),
                 (["--threads", "0"], "E108", "--threads"), (["--drain-timeout", "-5"], "E108", "--drain-timeout"),
                 (["--spec-max-batch", "-1"], "E108", "--spec-max-batch"),
                 (["--max-body-mb", "0"], "E108", "--max-body-mb"),
                 (["--warm-up-span", "-1"], "E108", "--warm-up-span"),
                 (["--chat-template", "/nonexistent/template.jinja"], "E114", "--chat-template"),
                 (["--chat-template", "{% if %}"], "E115", "Jinja"),
                 (["--port", str(port)], "E113", str(port))]
        for extra, code, named in cases:
            rc = main(["serve", "--target", TARGET, "--device", "cpu", *extra])
            err = capsys.readouterr().err
            assert rc == 2 and f"[{code}]" in err and named in err and "Traceback" not in err, (extra, err)


def test_drain_past_its_timeout_as_each_client_sees_it(srv):
    """Last: it stops the module's server. A plain request gets a JSON 503, a stream an error event and [DONE];
    the server exits 0, and its log holds no traceback from anything this module did."""
    r = H.drain_past_timeout(srv.port, "demo", lambda: os.kill(srv.proc.pid, signal.SIGTERM),
                             lambda: srv.proc.wait(60))
    print(f"\ndrain past --drain-timeout 1: plain {r['plain_status']} {r['plain_error']}; stream ends "
          f"{r['stream_tail']}; exit {r['exit_status']} after {r['seconds_to_exit']} s")
    assert r["plain_status"] == 503 and r["plain_error"]["code"] == "shutting_down"
    assert r["stream_error"] is None and r["stream_tail"][-1] == "[DONE]"
    assert json.loads(r["stream_tail"][0])["error"]["code"] == "shutting_down"
    assert r["exit_status"] == 0
    srv.stop()
    log = srv.log_path.read_text()
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
