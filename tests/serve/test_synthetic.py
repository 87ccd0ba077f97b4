"""Benchmark-only synthetic acceptance in the server: refused before anything loads where it cannot apply, and
named in every output of a run that uses it (responses, /server_info, /metrics, `eaglekit bench`)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from eaglekit.errors import EaglekitError

DEMO = Path(__file__).resolve().parents[2] / "eaglekit" / "assets" / "demo"


def _serve(engine, tok, fn):
    import uvicorn

    from eaglekit.options import ServeOptions
    from eaglekit.serve.app import build_app

    info = {"synthetic_acceptance": None if engine.synthetic is None else {"accept_length": 3.0,
                                                                            "rate": engine.synthetic}}
    app = build_app(engine, tok, ServeOptions(served_model_name=["m"], max_batch=2, max_queue=4), 2048, info=info,
                    speculative=True, positions=3)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    try:
        while not srv.started:
            time.sleep(0.02)
        port = srv.servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            return fn(c)
    finally:
        srv.should_exit = True
        th.join(30)


@pytest.mark.parametrize("synthetic", [None, 3.0])
def test_a_synthetic_run_says_so_everywhere_and_a_real_one_nowhere(synthetic):
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.serve.bench import render, sglang_figures  # noqa: F401  (the bench reads /server_info)
    from eaglekit.tokenizer import load_tokenizer

    target, draft = load_pair(str(DEMO / "target"), str(DEMO / "draft"), "auto", "cpu", "float32",
                              run=PairRuntime(batched=True))
    eng = BatchEngine(target, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=2,
                                                   synthetic_accept_length=synthetic))
    tok = load_tokenizer(str(DEMO / "target"))

    def check(c):
        r = c.post("/v1/completions", json={"model": "m", "prompt": "def f(x):", "max_tokens": 16}).json()
        stream = c.post("/v1/completions", json={"model": "m", "prompt": "import os", "max_tokens": 8,
                                                 "stream": True}).text
        info = c.get("/server_info").json()
        metrics = c.get("/metrics").text
        return r, stream, info, metrics

    r, stream, info, metrics = _serve(eng, tok, check)
    rate_line = next(x for x in metrics.splitlines() if x.startswith("eaglekit:synthetic_acceptance_rate{"))
    assert "eaglekit:spec_switches_total" in metrics and "eaglekit:spec_plain_steps_total" in metrics
    cycles = {x.split('length="')[1].split('"')[0]: float(x.split()[-1]) for x in metrics.splitlines()
              if x.startswith("eaglekit:spec_cycles_total{")}
    assert sum(cycles.values()) == info["internal_states"][0]["spec_stats"]["spec_cycles"] > 0
    policy = info["internal_states"][0]["spec_policy"]
    assert info["internal_states"][0]["phase_profile"] is None and info["internal_states"][0]["loop_ms"] is None
    assert (policy is None) == (synthetic is not None)  # synthetic runs measure the whole tree: no policy figures
    if policy is not None:
        assert policy["lengths"] == [3, 2, 1] and len(policy["rates"]) == 3 and policy["sizes"]
    if synthetic is None:
        assert "system_fingerprint" not in r and "synthetic" not in stream
        assert info["synthetic_acceptance"] is None and float(rate_line.split()[-1]) == 0.0
    else:
        assert r["system_fingerprint"] == "eaglekit-synthetic-acceptance"
        assert stream.count("eaglekit-synthetic-acceptance") >= 2  # every chunk
        assert info["synthetic_acceptance"]["accept_length"] == 3.0
        assert float(rate_line.split()[-1]) == pytest.approx(eng.synthetic)


def test_synthetic_acceptance_is_refused_before_loading():
    run = lambda *a: subprocess.run([sys.executable, "-m", "eaglekit.cli", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=120)
    r = run("serve", "--target", str(DEMO / "target"), "--draft", str(DEMO / "draft"), "--steps", "3",
            "--synthetic-accept-length", "9", "--port", "0")
    assert r.returncode != 0 and "E317" in r.stderr and "Traceback" not in r.stderr
    r = run("serve", "--target", str(DEMO / "target"), "--synthetic-accept-length", "2", "--port", "0")
    assert r.returncode != 0 and "E317" in r.stderr
    pair = ("--target", str(DEMO / "target"), "--draft", str(DEMO / "draft"))
    for cmd in (("demo",), ("eval", *pair), ("doctor", *pair), ("generate", *pair, "--prompt", "x")):
        r = run(*cmd, "--synthetic-accept-length", "2")  # where output is read the option does not exist
        assert r.returncode == 2 and "unrecognized arguments: --synthetic-accept-length" in r.stderr


def test_the_rate_is_checked_in_the_engine_too():
    from eaglekit.decoding.accept import synthetic_rate

    with pytest.raises(EaglekitError, match="E317"):
        synthetic_rate(0.5, 3)


def test_a_profiled_server_reports_each_phase():
    """eaglekit serve --profile: /server_info's phase_profile holds each phase's time since the start, with the cycles
    and plain steps it covers, and the steps' wall time by kind; loop_ms the engine thread's time inside its steps
    (which holds the steps' own wall time) and around them (both None when the engine does not profile: the test
    above)."""
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import load_tokenizer

    target, draft = load_pair(str(DEMO / "target"), str(DEMO / "draft"), "auto", "cpu", "float32",
                              run=PairRuntime(batched=True))
    eng = BatchEngine(target, draft, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=2, profile=True))
    tok = load_tokenizer(str(DEMO / "target"))

    def run(c):
        c.post("/v1/completions", json={"model": "m", "prompt": "def f(x):", "max_tokens": 16})
        return c.get("/server_info").json()["internal_states"][0]

    state = _serve(eng, tok, run)
    prof = state["phase_profile"]
    assert prof["cycles"] == state["spec_stats"]["spec_cycles"] and prof["cycles"] + prof["plain_steps"] > 0
    assert prof["ms"]["prefill"] > 0 and set(prof["share"]) == set(prof["ms"])
    wall, loop = prof["wall_ms"], state["loop_ms"]
    assert wall["prefill"] > 0 and wall["cycle"] + wall["plain"] > 0 and set(loop) == {"in_step", "outside_step"}
    assert loop["in_step"] >= sum(wall[k] for k in ("prefill", "cycle", "plain", "other")) - 4e-3  # (rounded to 1 us)
    assert loop["outside_step"] >= 0
