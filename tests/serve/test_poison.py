"""The poison suite (`python -m pytest -m poison`; also in the default tier): a real in-process server over a tiny
random pair, a busy batch of normal requests, and beside them every hostile request the API has been shown to choke
on: temperatures and top_p too small for float32, stop lists past the limit and at it, integers of thousands of
digits, NaN / Infinity literals. Each poison request is answered (a 200 with defined output, or a coded 400); no
normal request is harmed: each returns exactly what it returns when it runs alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers import make_hf_model, make_tokenizer

pytestmark = pytest.mark.poison

MAX_BATCH = 8
# the normal requests: greedy ones (streamed and not) and a seeded sampled one, whose output is its own whatever
# shares the batch (docs/serving.md); long enough to be still decoding when the poison arrives
NORMAL = [
    {"prompt": "def add(a, b):", "max_tokens": 200, "temperature": 0},
    {"prompt": "print(add(1, 2))", "max_tokens": 180, "temperature": 0, "stream": True},
    {"prompt": "hello world", "max_tokens": 200, "temperature": 0.8, "seed": 7},
    {"prompt": "return a + b", "max_tokens": 160, "temperature": 0, "stream": True, "stop": ["zzz"]},
]
WORST_STOPS = ["~%02d" % i + "q" * 60 for i in range(64)]  # 64 strings, 4096 characters: the most accepted

# (body, the status it gets, the error code of a refusal)
POISON = [
    ({"prompt": "def add(a, b):", "max_tokens": 24, "temperature": 1e-300}, 200, None),
    ({"prompt": "hello world", "max_tokens": 24, "temperature": 1e-38, "seed": 1}, 200, None),
    ({"prompt": "print(add(1, 2))", "max_tokens": 24, "temperature": 1.0, "top_p": 1e-300, "seed": 2}, 200, None),
    ({"prompt": "def add(a, b):", "max_tokens": 24, "temperature": 0, "stop": WORST_STOPS}, 200, None),
    ({"prompt": "hello", "max_tokens": 8, "stop": ["ab"] * 250_000}, 400, "E310"),
    ({"prompt": "hello", "max_tokens": 8, "stop": "x" * 5000}, 400, "E310"),
    ('{"prompt": "hello", "max_tokens": %s}' % ("9" * 5000), 400, "invalid_value"),
    ('{"prompt": "hello", "seed": -%s}' % ("9" * 5000), 400, "invalid_value"),
    ('{"prompt": "hello", "top_k": %s}' % ("9" * 5000), 400, "invalid_value"),
    ('{"prompt": "hello", "temperature": NaN}', 400, "invalid_json"),
    ('{"prompt": "hello", "top_p": Infinity}', 400, "invalid_json"),
    ('{"prompt": "hello", "temperature": 1e999}', 400, "invalid_value"),
    ({"prompt": [5, 10**12]}, 400, "invalid_token_id"),
    ({"prompt": [5, 10**30]}, 400, "invalid_value"),
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from eaglekit.draft import new_draft, save_draft
    from eaglekit.models import load_target

    d = tmp_path_factory.mktemp("poison")
    make_hf_model(d / "target", "llama", seed=3, layers=2)
    make_tokenizer(d / "target", 96)
    save_draft(new_draft(load_target(d / "target"), seed=4), d / "draft", dtype=__import__("torch").float32)
    return d / "target", d / "draft"


@pytest.fixture(scope="module")
def client(pair):
    import uvicorn

    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.options import PairRuntime, ServeOptions
    from eaglekit.pair import load_pair
    from eaglekit.serve.app import build_app
    from eaglekit.tokenizer import load_tokenizer

    target, draft = load_pair(str(pair[0]), str(pair[1]), "ours", "cpu", "float32", run=PairRuntime(batched=True))
    engine = BatchEngine(target, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=MAX_BATCH),
                         tokenizer=load_tokenizer(str(pair[0])))
    app = build_app(engine, load_tokenizer(str(pair[0])), ServeOptions(served_model_name=["m"], max_batch=MAX_BATCH,
                                                                       max_queue=32), 512, vocab_size=96)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    while not srv.started:
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
        yield c
    srv.should_exit = True
    th.join(30)


def send(c: httpx.Client, body):
    """(status, text or error body): a stream is read to its end and its pieces joined."""
    if isinstance(body, str):
        r = c.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        return r.status_code, r.json()
    if body.get("stream"):
        import json

        with c.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return r.status_code, json.loads(r.read())
            text, errors = [], []
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        errors.append(ev)
                    else:
                        text += [ch["text"] for ch in ev["choices"]]
            return (200 if not errors else 500), ("".join(text) if not errors else errors)
    r = c.post("/v1/completions", json=body)
    return r.status_code, (r.json()["choices"][0]["text"] if r.status_code == 200 else r.json())


def test_poison_requests_harm_no_other_request(client):
    alone = [send(client, b) for b in NORMAL]
    assert all(s == 200 for s, _ in alone)
    greedy_alone = {b["prompt"]: send(client, {**b, "temperature": 0, "stream": False, "stop": None})[1]
                    for b, _, _ in POISON if isinstance(b, dict) and b.get("max_tokens") == 24}
    with ThreadPoolExecutor(len(NORMAL) + len(POISON)) as pool:
        normal = [pool.submit(send, client, b) for b in NORMAL]
        # the poison once every normal request decodes in the batch: a failed step would end them all
        deadline = time.monotonic() + 60
        while client.get("/server_info").json()["internal_states"][0]["num_running"] < len(NORMAL):
            assert time.monotonic() < deadline and not any(f.done() for f in normal), "the batch never filled"
            time.sleep(0.01)
        poisoned = [pool.submit(send, client, b) for b, _, _ in POISON]
        poisoned, normal = [f.result() for f in poisoned], [f.result() for f in normal]
    assert normal == alone  # 0 requests harmed
    for (body, status, code), (got, out) in zip(POISON, poisoned):
        assert got == status, (str(body)[:80], out)
        if status == 400:
            assert out["error"]["code"] == code and out["error"]["type"] == "invalid_request_error", out
        elif isinstance(body, dict) and body.get("temperature") != 0:  # too small for float32: greedy
            assert out == greedy_alone[body["prompt"]], body
    state = client.get("/server_info").json()["internal_states"][0]
    assert state["engine_step_errors"] == 0
    assert client.get("/health").json() == {"status": "ok"}
