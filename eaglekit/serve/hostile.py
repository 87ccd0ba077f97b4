"""Hostile-client probes against a running server on this machine (the hostile test tier runs them; so did
benchmarks/lab/hostile_before_after.py, in git at 3620f2a): raw sockets for what a well-behaved client never
sends (huge, stalled, abandoned or malformed bodies), and a timer on /health and on another client's stream
while that happens. Every probe is bounded in bytes and seconds and returns a plain dict.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import cast


def request(
    port: int,
    path: str,
    body: bytes | None = None,
    method: str = "POST",
    timeout: float = 60.0,
    headers: dict | None = None,
) -> tuple[int, dict | str]:
    """(status, JSON body or text) of one request; an HTTP error status is returned, not raised."""
    h = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def raw_exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 30.0) -> dict:
    """Send `head` (request line and headers) and `body` on a raw socket, read until the server closes or
    `timeout`: {"status", "body" (JSON or text), "closed" (the server closed the connection), "seconds"}."""
    t0 = time.perf_counter()
    out: dict[str, object] = {"status": None, "body": None, "closed": False, "send_error": None}
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(head + body)
        except OSError as e:  # the server refused and closed while the body was still going out
            out["send_error"] = type(e).__name__
        data = b""
        s.settimeout(max(timeout - (time.perf_counter() - t0), 0.1))
        try:
            while chunk := s.recv(65536):
                data += chunk
            out["closed"] = True
        except (TimeoutError, socket.timeout):
            pass
        except ConnectionResetError:
            out["closed"] = True
    out["seconds"] = time.perf_counter() - t0
    if data:
        line, _, rest = data.partition(b"\r\n")
        out["status"] = int(line.split()[1])
        payload = rest.partition(b"\r\n\r\n")[2]
        try:
            out["body"] = json.loads(payload)
        except ValueError:
            out["body"] = payload.decode(errors="replace")[:300]
    return out


def post_head(path: str, length: int | None, chunked: bool = False) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class StreamTimer(threading.Thread):
    """A streamed completion (ignore_eos, greedy) whose chunk arrival times are recorded; `stop` ends it early
    (the client goes away)."""

    times: list[float]  # perf_counter() at each chunk's arrival
    events: list[str]  # each chunk's payload, after "data: "
    error: str | None

    def __init__(self, port: int, model: str, max_tokens: int = 400, prompt: str = "import os"):
        super().__init__(daemon=True)
        self.port, self.times, self.events, self.error = port, [], [], None
        self.stop = threading.Event()
        self.body = json.dumps(
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "ignore_eos": True,
            }
        ).encode()

    def run(self):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions", data=self.body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                for line in r:
                    if self.stop.is_set():
                        break
                    if line.startswith(b"data: "):
                        self.times.append(time.perf_counter())
                        self.events.append(line[6:].strip().decode())
        except Exception as e:  # noqa: BLE001 -- reported, not raised: a probe
            self.error = repr(e)

    def max_gap(self, t0: float, t1: float, inside: bool = False) -> float | None:
        """The longest wait for a chunk that overlaps [t0, t1] (`inside`: that lies within it)."""
        ts = self.times
        gaps = [b - a for a, b in zip(ts, ts[1:]) if (a >= t0 and b <= t1 if inside else b >= t0 and a <= t1)]
        return max(gaps) if gaps else None

    def count(self, t0: float, t1: float) -> int:
        return sum(t0 <= t <= t1 for t in self.times)

    def median_gap(self) -> float | None:
        gaps = sorted(b - a for a, b in zip(self.times, self.times[1:]))
        return gaps[len(gaps) // 2] if gaps else None


def health_during(port: int, stop: threading.Event, every: float = 0.05) -> list[float]:
    """/health latencies (s), one request every `every` s until `stop` is set (a refused request counts 30 s)."""
    lat = []
    while not stop.is_set():
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
                r.read()
            lat.append(time.perf_counter() - t)
        except OSError:
            lat.append(30.0)
        stop.wait(every)
    return lat


def big_body(port: int, model: str, mb: float = 10.0, stream_tokens: int = 1500) -> dict:
    """A `mb` MB prompt while another client streams and /health is polled: the refusal, the stream's longest
    gap during the upload (against its median gap) and /health's worst latency, before and during it. The
    body is built first: building it holds this process's GIL, and would show as a stall of the timers."""
    body = json.dumps({"model": model, "prompt": "x" * int(mb * 1e6), "max_tokens": 4}).encode()
    st = StreamTimer(port, model, stream_tokens)
    st.start()
    deadline = time.monotonic() + 120
    while len(st.times) < 5 and st.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    quiet = threading.Event()
    tb = time.perf_counter()
    threading.Timer(1.0, quiet.set).start()
    base = health_during(port, quiet)  # /health while only the stream runs
    stop = threading.Event()
    lat: list[float] = []
    hth = threading.Thread(target=lambda: lat.extend(health_during(port, stop)), daemon=True)
    hth.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    res = raw_exchange(port, post_head("/v1/completions", len(body)), body, timeout=120)
    time.sleep(0.3)  # what the refusal costs afterwards (a tokenization left running) shows here too
    t1 = time.perf_counter()
    stop.set()
    hth.join(60)
    st.stop.set()
    st.join(60)
    return {
        "status": res["status"],
        "error": res["body"],
        "seconds": round(res["seconds"], 3),
        "send_error": res["send_error"],
        "stream_max_gap_s": _r(st.max_gap(t0, t1)),
        "stream_max_gap_before_s": _r(st.max_gap(tb, t0, inside=True)),
        "stream_median_gap_s": _r(st.median_gap()),
        "stream_chunks_during": st.count(t0, t1),
        "stream_error": st.error,
        "health_max_s": _r(max(lat) if lat else None),
        "health_polls": len(lat),
        "health_max_before_s": _r(max(base) if base else None),
    }


def stalled_uploads(port: int, n: int = 4, wait_s: float = 10.0) -> dict:
    """`n` connections that send half a body and stall, and `n` that send half their headers and stall: how
    many the server still holds open after `wait_s` s, and what the body-stalled ones were answered."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=wait_s + 5)
        s.sendall(post_head("/v1/completions", 1000) + b'{"prompt": "')
        socks.append(("body", s))
        s = socket.create_connection(("127.0.0.1", port), timeout=wait_s + 5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        socks.append(("headers", s))
    time.sleep(wait_s)
    held, statuses = {"body": 0, "headers": 0}, []
    for kind, s in socks:
        s.settimeout(0.5)
        try:
            data = s.recv(65536)
            while data and (more := s.recv(65536)):
                data += more
            if data.startswith(b"HTTP/1.1"):
                statuses.append(int(data.split()[1]))
        except (TimeoutError, socket.timeout):
            held[kind] += 1  # nothing came and the connection is still open
        except ConnectionResetError:
            pass
        s.close()
    return {
        "held_open_body": held["body"],
        "held_open_headers": held["headers"],
        "of": n,
        "wait_s": wait_s,
        "statuses": sorted(set(statuses)),
    }


def abandoned_uploads(port: int, n: int = 3) -> None:
    """`n` clients that announce a body, send part of it and go away."""
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(post_head("/v1/completions", 100000) + b'{"prompt": "abc')
        time.sleep(0.1)


def malformed(port: int, model: str) -> dict:
    """Bodies that once gave a 500: {case: (status, error code, param)}."""
    cases = {
        "lone surrogate in the prompt": (
            "/v1/completions",
            b'{"model": "%s", "prompt": "abc\\ud800", "max_tokens": 2}' % model.encode(),
        ),
        "lone surrogate in a chat message": (
            "/v1/chat/completions",
            b'{"model": "%s", "messages": [{"role": "user", "content": "hi \\udc80"}]}' % model.encode(),
        ),
        "seed 2**70": (
            "/v1/completions",
            json.dumps({"model": model, "prompt": "x", "max_tokens": 2, "seed": 2**70}).encode(),
        ),
        "JSON nested 100,000 deep": ("/v1/completions", b"[" * 100000 + b"]" * 100000),
        "prompt longer than the context": (
            "/v1/completions",
            json.dumps({"model": model, "prompt": "x = 1\n" * 3000, "max_tokens": 2}).encode(),
        ),
    }
    out = {}
    for name, (path, body) in cases.items():
        status, err = request(port, path, body)
        e = err.get("error", {}) if isinstance(err, dict) else {}
        out[name] = {"status": status, "code": e.get("code"), "param": e.get("param"), "message": e.get("message")}
    return out


def _r(x):
    return None if x is None else round(x, 4)


def drain_past_timeout(port: int, model: str, terminate, wait_exit, max_tokens: int = 1500) -> dict:
    """A plain and a streamed request that cannot finish within --drain-timeout, then `terminate()` (SIGTERM to
    the server): what each client receives, and the server's exit status (`wait_exit()`)."""
    body = {"model": model, "prompt": "import os", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    plain: dict = {}

    def send():
        plain["status"], plain["body"] = request(port, "/v1/completions", json.dumps(body).encode(), timeout=120)

    th = threading.Thread(target=send, daemon=True)
    th.start()
    st = StreamTimer(port, model, max_tokens)
    st.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, info = request(port, "/server_info", method="GET")
        info = cast(dict, info)  # /server_info answers JSON
        if len(st.events) >= 2 and info["internal_states"][0]["num_running"] >= 2:
            break
        time.sleep(0.05)
    t0 = time.perf_counter()
    terminate()
    th.join(120)
    st.join(120)
    rc = wait_exit()
    b = plain.get("body")
    return {
        "plain_status": plain.get("status"),
        "plain_error": b.get("error") if isinstance(b, dict) else b,
        "stream_tail": st.events[-2:],
        "stream_error": st.error,
        "exit_status": rc,
        "seconds_to_exit": round(time.perf_counter() - t0, 2),
    }
