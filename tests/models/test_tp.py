"""Tensor parallelism on CPU: 2 processes over gloo, spawned by the test.

TP=2 equals TP=1 (greedy output for the lossless suite's tree shapes, the captured features, the logits);
shapes the ranks cannot split and a mismatched --tp give a readable error on every rank; a rank killed
mid-generation makes the survivor fail with a DistributedError within a bounded time instead of hanging.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from helpers import make_hf_model

from eaglekit.distributed import free_port

ROOT = Path(__file__).resolve().parents[2]


def _spawn(name, *args, timeout_s=30.0):
    import tp_workers

    mp.start_processes(tp_workers.run, args=(2, free_port(), name, args, timeout_s), nprocs=2, join=True,
                       start_method="spawn")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    # heads 4, kv heads 2, MLP 96, vocab 96: all divisible by 2; o and MLP biases on (added once, after the sum)
    make_hf_model(root / "llama", "llama", seed=3, layers=4, attention_bias=True, mlp_bias=True)
    make_hf_model(root / "kv1", "llama", seed=4, kv_heads=1, layers=2)
    return root


def test_tp2_equals_tp1_features_and_greedy_trees(tiny, tmp_path):
    _spawn("equal", str(tiny / "llama"), str(tmp_path))
    for r in (0, 1):
        assert (tmp_path / f"equal.{r}").read_text().startswith("ok")
    # the drafts were random but not useless: some trees accepted tokens (the equality covered accepted runs)
    assert int((tmp_path / "equal.0").read_text().split()[1]) > 0


def test_indivisible_heads_error_on_every_rank(tiny, tmp_path):
    _spawn("bad", str(tiny / "kv1"), str(tmp_path))
    for r in (0, 1):
        msg = (tmp_path / f"bad.{r}").read_text()
        assert msg.startswith("E144") and "key/value heads (num_key_value_heads) 1" in msg, msg


def test_divisibility_and_lm_head_rules():
    from eaglekit.distributed import check_divisible, pick_lm_head
    from eaglekit.errors import InputError
    from eaglekit.models.config import TargetConfig

    cfg = TargetConfig("llama", vocab_size=101, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16)
    check_divisible(cfg, 2, vocab_parallel=False)
    with pytest.raises(InputError) as e:
        check_divisible(cfg, 2, vocab_parallel=True)
    assert e.value.code == "E144" and "vocabulary" in e.value.message and "replicated" in e.value.fix
    with pytest.raises(InputError) as e:
        check_divisible(cfg, 3, vocab_parallel=False)
    assert "attention heads (num_attention_heads) 4" in e.value.message
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert pick_lm_head("auto", 128256, 4096, 2, gpu, 2) is True
    assert pick_lm_head("auto", 96, 64, 2, cpu, 4) is False  # tiny on a CPU: the gather costs more
    assert pick_lm_head("auto", 101, 64, 2, gpu, 2) is False  # indivisible: replicated
    assert pick_lm_head("vocab", 96, 64, 2, cpu, 4) is True


def test_tp_mismatch_with_world_size(monkeypatch):
    from eaglekit import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(distributed.DistributedError) as e:
        distributed.init_tp(4, "cpu")
    assert e.value.code == "E143" and "--tp 4" in e.value.message and "2 processes" in e.value.message
    assert distributed.current() is None


def test_dying_rank_fails_the_others_in_bounded_time(tiny, tmp_path):
    import tp_workers

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=tp_workers.run, args=(r, 2, port, "die", (str(tiny / "llama"), str(tmp_path)), 20.0))
             for r in (0, 1)]
    t0 = time.time()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"ranks still running after {time.time() - t0:.0f}s: a hang"
    assert procs[1].exitcode == -9
    secs, msg = (tmp_path / "die.0").read_text().split(" ", 1)
    assert msg.startswith("E141") and "rank 0 of 2" in msg and "another rank died" in msg, msg
    assert float(secs) < 60


@pytest.mark.slow
def test_cli_tp2_equals_tp1_and_errors_on_every_rank(tiny, tmp_path):
    """`eaglekit generate --tp 2` (2 CPU processes) prints what the single-process run prints, once."""
    from helpers import make_tokenizer

    from eaglekit.draft import new_draft, save_draft
    from eaglekit.models import load_target

    folder = tiny / "llama"
    make_tokenizer(folder, 96)
    save_draft(new_draft(load_target(folder), seed=1), tmp_path / "d")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    base = [sys.executable, "-m", "eaglekit", "generate", "--target", str(folder), "--draft", str(tmp_path / "d"),
            "--prompt", "def add(a, b):", "--max-new-tokens", "16", "--json", "--device", "cpu"]
    one = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    two = subprocess.run(base + ["--tp", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert len(two.stdout.strip().splitlines()) == 1  # rank 1 is silent
    assert json.loads(two.stdout)["token_ids"] == json.loads(one.stdout)["token_ids"]
    make_tokenizer(tiny / "kv1", 96)
    bad = subprocess.run([*base[:5], str(tiny / "kv1"), *base[6:], "--tp", "2"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert bad.returncode == 2
    assert "[rank 0/2]: error [E144]" in bad.stderr and "[rank 1/2]: error [E144]" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_serve_tp2_answers_as_tp1_and_drains_on_sigterm(tiny, tmp_path):
    """`eaglekit serve --tp 2` (2 CPU processes, rank 0 serves HTTP, rank 1 follows in lockstep): concurrent
    greedy completions equal those of the single-process server, an unseeded sampled request in the same
    batch keeps the ranks together, and SIGTERM to the launcher drains and stops every rank with exit 0."""
    import threading
    import urllib.request

    pytest.importorskip("fastapi")
    from helpers import make_tokenizer

    from eaglekit.draft import new_draft, save_draft
    from eaglekit.models import load_target
    from eaglekit.serve.local import LocalServer

    folder = tiny / "llama"
    make_tokenizer(folder, 96)
    save_draft(new_draft(load_target(folder), seed=1), tmp_path / "d")
    args = ["--target", str(folder), "--draft", str(tmp_path / "d"), "--device", "cpu", "--threads", "1",
            "--max-batch", "4", "--served-model-name", "m", "--log-level", "warning"]
    prompts = ["def add(a, b):", "import os", "class A:", "x = [1, 2"]

    def complete(url, prompt, **extra):
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0, **extra}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["choices"][0]["text"]

    def run_all(srv):
        out, threads = {}, []
        for i, p in enumerate(prompts):
            threads.append(threading.Thread(target=lambda i=i, p=p: out.__setitem__(i, complete(srv.url, p))))
        threads.append(threading.Thread(target=lambda: out.__setitem__("s", complete(srv.url, "def", temperature=1.0))))
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        return out

    env = {"PYTHONPATH": str(ROOT)}
    with LocalServer(args, env=env, cwd=ROOT) as one:
        want = run_all(one)
    two = LocalServer([*args, "--tp", "2"], log=tmp_path / "tp2.log", env=env, cwd=ROOT)
    try:
        got = run_all(two)
        assert two.get("/server_info")["tp_size"] == 2
        again = complete(two.url, prompts[0])  # after the sampled row: the ranks still agree
    finally:
        rc = two.stop(timeout_s=90)
    assert all(got[i] == want[i] for i in range(len(prompts))), (got, want)
    assert again == want[0] and isinstance(got["s"], str)
    assert rc == 0, (tmp_path / "tp2.log").read_text()[-2000:]
