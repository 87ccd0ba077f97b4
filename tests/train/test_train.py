"""Training: TTT matches decode-time drafting exactly, data formats, vocab mapping, extraction and
training killed midway and resumed (nothing lost or counted twice), offline == online, torchrun."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import extend, level
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglekit.capture import CaptureSpec
from eaglekit.draft import new_draft
from eaglekit.models import load_target
from eaglekit.train.data import Example, chat_example, load_examples, pad_batch, write_examples
from eaglekit.train.ttt import TargetBatch, simulated_accept_length, target_distribution, ttt_forward
from eaglekit.train.vocab import build_vocab_map

ROOT = Path(__file__).resolve().parents[2]


def test_ttt_steps_equal_decode_time_tree_steps(model_dirs):
    """Step k of TTT at index t computes exactly what the decoder computes for a depth-k tree node whose
    ancestors are the true next tokens: same inputs, positions and attention (float64)."""
    t = load_target(model_dirs["llama"], dtype="float64")
    spec = CaptureSpec((1, 3, 4))
    d = new_draft(t, capture=spec, seed=3, dtype=torch.float64)
    ids = torch.randint(3, 96, (1, 14), generator=torch.Generator().manual_seed(0))
    hidden, feats = t.features(ids, None, spec)
    batch = TargetBatch(feats, ids, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool), hidden)
    p, in_dv = target_distribution(batch, t.lm_head_weight(), torch.arange(96))
    logits = []
    ttt_forward(d, batch, p, in_dv, length=4, keep_logits=logits)
    for tpos in (0, 5, 8):
        kv = d.row_cache(1, 32)
        # committed entries 0..tpos: feature g_i with token i+1
        hid, lg = extend(d, kv, feats[0, :tpos + 1], ids[0, 1:tpos + 2])
        torch.testing.assert_close(lg, logits[0][0, tpos], rtol=1e-9, atol=1e-9)
        m = tpos + 1
        hid = hid[None]
        for k in range(1, 4):
            # a depth-k node: the true token t+1+k, the draft's own hidden, position m-1+k; it sees the
            # committed entries and its ancestors' pending slots m .. m+k-1
            mask = torch.zeros(1, 32, dtype=torch.bool)
            mask[0, :m + k] = True
            hid, lg = level(d, kv, hid, ids[0, tpos + 1 + k:tpos + 2 + k], torch.tensor([m - 1 + k]),
                            torch.tensor([m + k - 1]), mask)
            torch.testing.assert_close(lg[0], logits[k][0, tpos], rtol=1e-9, atol=1e-9)


def test_the_per_position_loss_is_the_training_loss_position_by_position(model_dirs):
    """teacher_forced_hits' loss at t is the decayed sum of the steps' cross-entropies of the chain drafted from t:
    over the positions where every step counts, each step's mean equals the step loss ttt_forward trains on, and a
    position where a step does not count is NaN (the doctor pairs wirings on these values)."""
    from eaglekit.train.ttt import teacher_forced_hits

    t = load_target(model_dirs["llama"], dtype="float64")
    spec = CaptureSpec((1, 3, 4))
    d = new_draft(t, capture=spec, seed=5, dtype=torch.float64)
    ids = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, 11:] = False
    hidden, feats = t.features(ids, valid.long(), spec)
    batch = TargetBatch(feats, ids, valid.long(), valid, hidden)
    hot = torch.arange(96)
    correct, counted, loss = teacher_forced_hits(d, batch, t.lm_head_weight(), hot, 1)
    p, in_dv = target_distribution(batch, t.lm_head_weight(), hot)
    _, step_losses, _, _ = ttt_forward(d, batch, p, in_dv, length=1)
    assert torch.equal(loss.isnan(), ~counted[:, 0]) and counted[:, 0].sum() > 8
    torch.testing.assert_close(loss[counted[:, 0]].mean(), step_losses[0])
    _, counted3, loss3 = teacher_forced_hits(d, batch, t.lm_head_weight(), hot, 3, decay=0.5)
    ce: list = []
    ttt_forward(d, batch, p, in_dv, length=3, keep_loss=ce)
    every = counted3.all(1)
    torch.testing.assert_close(loss3[every], (ce[0] + 0.5 * ce[1] + 0.25 * ce[2])[every])
    assert loss3[~every].isnan().all() and every.sum() < counted3[:, 0].sum()


def test_vocab_map_offsets_and_padding():
    ex = [Example([5, 5, 5, 7, 7, 9, 1], [1, 1, 1, 1, 1, 1, 0])]
    vm = build_vocab_map(ex, vocab_size=12, draft_vocab_size=4)
    assert vm.hot.tolist() == [0, 5, 7, 9]  # three seen tokens, padded with the lowest unused id
    assert torch.equal(torch.arange(4) + vm.d2t, vm.hot)
    assert vm.t2d(12).nonzero().squeeze(1).tolist() == [0, 5, 7, 9]
    assert vm.coverage == 1.0
    vm2 = build_vocab_map(ex, 12, 2)
    assert vm2.hot.tolist() == [5, 7] and abs(vm2.coverage - 5 / 6) < 1e-9


def test_chat_loss_mask_covers_assistant_content_only(model_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dirs["llama"]))
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    ex = chat_example(tok, [{"role": "user", "content": "add one"}, {"role": "assistant", "content": "return a"},
                            {"role": "user", "content": "print"}, {"role": "assistant", "content": "print(a)"}])
    text = tok.decode([i for i, m in zip(ex.input_ids, ex.loss_mask) if m])
    assert "return a" in text and "print(a)" in text and "add one" not in text and "user" not in text
    sharegpt = chat_example(tok, [{"from": "human", "value": "add one"}, {"from": "gpt", "value": "return a"}])
    assert sum(sharegpt.loss_mask) > 0


def test_data_formats(tmp_path, model_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dirs["llama"]))
    (tmp_path / "a.py").write_text("def add(a, b):\n    return a + b\n" * 8)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "print(add(1, 2))\n" * 6}) + "\n"
                                      + json.dumps({"input_ids": list(range(3, 40)), "loss_mask": [0] * 10 + [1] * 27})
                                      + "\n")
    ex = load_examples(tmp_path, tok, max_len=32)
    assert all(len(e) <= 32 for e in ex) and any(e.loss_mask[0] == 0 for e in ex)
    write_examples(tmp_path / "out" / "x.jsonl", ex)
    assert len(load_examples(tmp_path / "out" / "x.jsonl", None, 32)) == len(ex)
    ids, mask, valid = pad_batch(ex[:3])
    assert ids.shape == mask.shape == valid.shape
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    from eaglekit.errors import InputError

    with pytest.raises(InputError, match="bad.jsonl:1 is not JSON"):
        load_examples(tmp_path / "bad.jsonl", tok, 32)


def test_simulated_accept_length():
    assert simulated_accept_length([1.0, 1.0, 1.0]) == 4.0
    assert simulated_accept_length([0.5, 0.5]) == 1 + 0.5 + 0.25


# --- killed and resumed --------------------------------------------------------------------------------
def _regen_file(model_dirs, path, n=24):
    from eaglekit.train.regen import regenerate

    t = load_target(model_dirs["llama"])
    prompts = [[3 + (i * 7 + j) % 90 for j in range(6)] for i in range(n)]
    write_examples(path, regenerate(t, prompts, 18, batch_size=8, temperature=0.9, greedy_share=0.5, seed=1,
                                    progress=False))
    return path


def _command(args, env_extra=None) -> dict:
    """Popen/run keywords of an `eaglekit` command run from this checkout."""
    return dict(args=[sys.executable, "-m", "eaglekit.cli", *args],
                env={**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})})


def _cli(args, env_extra=None, check=True):
    r = subprocess.run(**_command(args, env_extra), capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


# the killed-and-resumed tests run their commands on one thread each, the uninterrupted run beside the killed one
# (_clis): a command is mostly a process importing torch on one core, so a pair takes 5.5 s where one after the other
# took 9.5 on 2 cores (with two threads each, the pair's threads spun against each other: 8-15 s); and runs whose
# results are compared bit for bit use the same threads
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def _clis(*runs):
    """Independent commands at once: (args, env_extra) each -> their results."""
    procs = [subprocess.Popen(**_command(args, env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args, env_extra in runs]
    outs = [p.communicate() for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]


def test_extraction_killed_midway_resumes_identically(model_dirs, tmp_path):
    data = _regen_file(model_dirs, tmp_path / "data.jsonl")
    common = ["extract", "--target", str(model_dirs["llama"]), "--data", str(data), "--shard-size", "5",
              "--feature-dtype", "float32", "--device", "cpu"]
    kill = {**ONE_THREAD, "EAGLEKIT_KILL_AT": "extract_shard:2"}
    full, r = _clis((common + ["--out", str(tmp_path / "full")], ONE_THREAD),
                    (common + ["--out", str(tmp_path / "killed")], kill))
    assert full.returncode == 0, full.stderr[-3000:]
    assert r.returncode == -9  # SIGKILL
    m = json.loads((tmp_path / "killed" / "manifest.json").read_text())
    assert len(m["shards"]) == 2 and not m["complete"]
    r = _cli(common + ["--out", str(tmp_path / "killed")], ONE_THREAD)
    assert "2 already done" in r.stderr
    a = json.loads((tmp_path / "full" / "manifest.json").read_text())
    b = json.loads((tmp_path / "killed" / "manifest.json").read_text())
    assert a["complete"] and b["complete"] and a["shards"] == b["shards"]  # same files, same sha256
    assert sum(s["tokens"] for s in b["shards"]) == b["tokens"]  # nothing lost, nothing twice
    assert a["capture"] == {"convention": "after_layers", "after_layers": [1, 3, 4]}
    # a shard changed on disk is refused on read
    from eaglekit.errors import InputError
    from eaglekit.train.extract import FeatureStore

    store = FeatureStore(tmp_path / "killed")
    f = tmp_path / "killed" / b["shards"][0]["file"]
    f.write_bytes(f.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(InputError, match="does not match its sha256"):
        store.batch([0], "cpu")


def test_training_killed_midway_resumes_identically(model_dirs, tmp_path):
    data = _regen_file(model_dirs, tmp_path / "data.jsonl")
    common = ["train", "--target", str(model_dirs["llama"]), "--data", str(data), "--max-steps", "9",
              "--batch-size", "4", "--save-every", "3", "--lr", "1e-3", "--draft-vocab-size", "64",
              "--heldout", "0.1", "--device", "cpu"]
    kill = {**ONE_THREAD, "EAGLEKIT_KILL_AT": "train_step:5"}
    full, r = _clis((common + ["--out", str(tmp_path / "full")], ONE_THREAD),
                    (common + ["--out", str(tmp_path / "killed")], kill))
    assert full.returncode == 0, full.stderr[-3000:]
    assert r.returncode == -9
    assert torch.load(tmp_path / "killed" / "checkpoint" / "state.pt", weights_only=False)["step"] == 3
    log = tmp_path / "killed" / "train_log.jsonl"
    log.write_text(log.read_text() + '{"step": 5, "loss": 2.7')  # killed mid-append, as a kill can be
    r = _cli(common + ["--out", str(tmp_path / "killed")], ONE_THREAD)
    assert "resuming at step 3" in r.stdout + r.stderr and "dropped 1 partial line" in r.stdout + r.stderr
    a = torch.load(tmp_path / "full" / "checkpoint" / "state.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "checkpoint" / "state.pt", weights_only=False)
    assert a["step"] == b["step"] == 9 and a["samples_seen"] == b["samples_seen"] == 36
    for k in a["draft"]:
        assert torch.equal(a["draft"][k], b["draft"][k]), k
    steps = [json.loads(x)["step"] for x in log.read_text().splitlines()]
    assert steps == list(range(9))  # each step logged once, the partial line gone
    assert (tmp_path / "killed" / "draft" / "config.json").is_file()


def test_offline_training_equals_online(model_dirs, tmp_path):
    from eaglekit.cli import main

    data = _regen_file(model_dirs, tmp_path / "data.jsonl", n=16)
    t = str(model_dirs["llama"])
    # the commands run in this process: as three processes they took 24 s, nearly all of it imports; the two runs
    # compared here need only be alike (the killed-and-resumed tests above run the commands as processes)
    assert main(["extract", "--target", t, "--data", str(data), "--out", str(tmp_path / "feat"), "--shard-size",
                 "100", "--feature-dtype", "float32", "--device", "cpu"]) == 0
    # one batch holds every sample, so the two sources' different sample orders cannot matter
    base = ["--target", t, "--max-steps", "4", "--batch-size", "16", "--draft-vocab-size", "64", "--heldout", "0",
            "--device", "cpu", "--lr", "1e-3"]
    assert main(["train", *base, "--data", str(data), "--out", str(tmp_path / "on")]) == 0
    assert main(["train", *base, "--features", str(tmp_path / "feat"), "--out", str(tmp_path / "off")]) == 0
    a = torch.load(tmp_path / "on" / "checkpoint" / "state.pt", weights_only=False)["draft"]
    b = torch.load(tmp_path / "off" / "checkpoint" / "state.pt", weights_only=False)["draft"]
    assert torch.equal(a["d2t"], b["d2t"])
    # both paths record the feature fingerprint of the same features (issue 14.8c)
    fa, fb = (json.loads((tmp_path / r / "draft" / "config.json").read_text())["eaglekit"]["features"]
              for r in ("on", "off"))
    assert fa["after_layers"] == fb["after_layers"] == [1, 3, 4] and fa["tokens"] == fb["tokens"] > 0
    for x, y in zip(fa["slots"], fb["slots"]):
        assert x["rms"] == pytest.approx(y["rms"], rel=1e-4)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_training_learns(model_dirs, tmp_path):
    """A few dozen steps on the target's own continuations lift held-out accuracy well above the start."""
    from eaglekit.options import ModelOptions, TrainOptions
    from eaglekit.train.run import run_train

    data = _regen_file(model_dirs, tmp_path / "data.jsonl", n=64)
    cpu = ModelOptions(device="cpu")
    res0 = run_train(model_dirs["llama"], tmp_path / "r0", TrainOptions(data=str(data), max_steps=1, batch_size=8,
                     lr=1e-9, draft_vocab_size=96, heldout=0.15), cpu, log=lambda s: None)
    res = run_train(model_dirs["llama"], tmp_path / "r1", TrainOptions(data=str(data), max_steps=80, batch_size=8,
                    lr=3e-3, warmup=5, draft_vocab_size=96, heldout=0.15), cpu, log=lambda s: None)
    before, after = res0["heldout"]["per_position_acc"][0], res["heldout"]["per_position_acc"][0]
    assert after > before + 0.2, (before, after)


def test_torchrun_data_parallel_on_cpu(model_dirs, tmp_path):
    data = _regen_file(model_dirs, tmp_path / "data.jsonl", n=16)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        "29533", "-m", "eaglekit.cli", "train", "--target", str(model_dirs["llama"]), "--data",
                        str(data), "--out", str(tmp_path / "ddp"), "--max-steps", "3", "--batch-size", "2",
                        "--draft-vocab-size", "64", "--heldout", "0", "--device", "cpu"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    state = torch.load(tmp_path / "ddp" / "checkpoint" / "state.pt", weights_only=False)
    assert state["samples_seen"] == 3 * 2 * 2  # steps x ranks x per-rank batch
    assert (tmp_path / "ddp" / "draft" / "model.safetensors").is_file()


def test_training_leaves_the_group_it_joined(model_dirs, tmp_path, monkeypatch):
    """run_train tears down the process group it joined, after a barrier when it succeeded and at once when it
    failed: a torchrun rank exiting with its gloo group alive aborted at exit now and then ("terminate called
    without an active exception", the torchrun test above failing about once in ten runs). A launch of two ranks as
    run_train sees it (WORLD_SIZE), whose group is one rank in this process."""
    import torch.distributed as dist

    from eaglekit.options import TrainOptions
    from eaglekit.train import run

    barriers, joins = [], []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: barriers.append(1))
    init = dist.init_process_group

    def join(backend):
        joins.append(1)
        init(backend, init_method=f"file://{tmp_path}/store{len(joins)}", world_size=1, rank=0)

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "init_process_group", join)
    with pytest.raises(Exception, match="nothing.jsonl"):
        run.run_train(model_dirs["llama"], tmp_path / "bad", TrainOptions(data=tmp_path / "nothing.jsonl"))
    assert not dist.is_initialized() and barriers == []  # a failed rank leaves at once
    data = _regen_file(model_dirs, tmp_path / "data.jsonl", n=4)
    run.run_train(model_dirs["llama"], tmp_path / "ok", TrainOptions(data=data, max_steps=1, batch_size=2,
                                                                        draft_vocab_size=64, heldout=0))
    assert not dist.is_initialized() and barriers == [1]
    assert (tmp_path / "ok" / "draft" / "model.safetensors").is_file()


def test_fingerprint_names_layers_where_adjacent_layers_are_close(tmp_path):
    """Layers that each change the residual stream by a few percent: acceptance could hardly tell them apart,
    the fingerprint recorded on one text still names each slot's layer on another text."""
    from helpers import make_hf_model
    from safetensors.torch import load_file, save_file

    from eaglekit.train.fingerprint import FeatureSketch, match, sketch_of

    d = tmp_path / "close"
    make_hf_model(d, "llama", seed=5, layers=8)
    w = load_file(d / "model.safetensors")
    for k in w:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            w[k] = w[k] * 0.1
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    t = load_target(d)
    L, H = t.info.num_layers, t.info.hidden_size

    def text(seed, n=48, T=40):
        g = torch.Generator().manual_seed(seed)
        return [Example(torch.randint(3, 96, (T,), generator=g).tolist(), [1] * T) for _ in range(n)]

    every = CaptureSpec(tuple(range(-1, L)))
    _, f = t.features(torch.tensor([text(9, 1)[0].input_ids]), None, every)
    f = f[0].view(-1, L + 1, H)
    step = [float((f[:, j + 1] - f[:, j]).norm() / f[:, j].norm()) for j in range(1, L)]
    assert max(step) < 0.25, step  # adjacent layers are close: each moves the residual stream by ~17%
    spec = CaptureSpec((1, 3, 4))
    recorded = sketch_of(t, text(1), spec).to_json(spec.after_layers)
    layers = FeatureSketch(L + 1, H)
    for e in text(2):
        _, f = t.features(torch.tensor([e.input_ids]), None, every)
        layers.add(f[0])
    m = match(recorded, layers, list(range(-1, L)))
    assert [x["layer"] for x in m] == [1, 3, 4] and all(x["confident"] for x in m), m


@pytest.mark.slow  # (15 s) the killed-training test above resumes after the same partial line, in the default tier
def test_resume_drops_a_partial_last_log_line(model_dirs, tmp_path):
    data = _regen_file(model_dirs, tmp_path / "data.jsonl", n=16)
    common = ["train", "--target", str(model_dirs["llama"]), "--data", str(data), "--batch-size", "4",
              "--save-every", "3", "--draft-vocab-size", "64", "--heldout", "0", "--device", "cpu",
              "--out", str(tmp_path / "r")]
    r = _cli(common + ["--max-steps", "6"], {"EAGLEKIT_KILL_AT": "train_step:5"}, check=False)
    assert r.returncode == -9
    log = tmp_path / "r" / "train_log.jsonl"
    log.write_text(log.read_text() + '{"step": 5, "loss": 2.7')  # killed mid-append
    r = _cli(common + ["--max-steps", "6"])
    assert "dropped 1 partial line" in r.stdout + r.stderr and "resuming at step 3" in r.stdout + r.stderr
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [0, 1, 2, 3, 4, 5]


def _tmpfs(path, size):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")


@pytest.mark.parametrize("size", ["600k", "1500k"])
def test_training_on_a_full_disk_says_what_ran_out_and_keeps_the_checkpoint(model_dirs, tmp_path, size):
    data = _regen_file(model_dirs, tmp_path / "data.jsonl", n=16)
    disk = tmp_path / "disk"
    _tmpfs(disk, size)
    try:
        r = _cli(["train", "--target", str(model_dirs["llama"]), "--data", str(data), "--batch-size", "4",
                  "--save-every", "1", "--max-steps", "40", "--heldout", "0", "--device", "cpu",
                  "--out", str(disk / "run")], check=False)
        assert r.returncode == 2 and "[E160]" in r.stderr and "no space left" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "resumes from its last checkpoint" in r.stderr
        ckpt = disk / "run" / "checkpoint" / "state.pt"
        if ckpt.is_file():  # what is on disk is a whole checkpoint
            assert torch.load(ckpt, weights_only=False)["step"] >= 1
        assert not list(disk.rglob(".*.tmp"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


@given(st.lists(st.integers(1, 400), min_size=1, max_size=300), st.integers(1, 9), st.integers(1, 5),
       st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_length_grouped_batches_keep_every_sample_once_and_sort_each_window(lengths, batch, window, seed):
    from eaglekit.train.loop import length_grouped

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=g).tolist()
    out = length_grouped(order, lengths, batch, g, window)
    assert sorted(out) == list(range(len(lengths)))  # a permutation: each sample once an epoch
    span = batch * window
    full = sum(len(order[s:s + span]) // batch for s in range(0, len(order), span)) * batch
    # every full batch comes from one window of the shuffled order, sorted there: its samples are neighbours in
    # that window's length order, so no sample of the window is strictly between a batch's shortest and longest
    # (the windows' short remainders follow the full batches, in the epoch's last steps)
    for k in range(0, full, batch):
        b = out[k:k + batch]
        w = next(s for s in range(0, len(order), batch * window) if b[0] in order[s:s + batch * window])
        win = order[w:w + batch * window]
        assert set(b) <= set(win)
        lo, hi = min(lengths[i] for i in b), max(lengths[i] for i in b)
        inside = sum(1 for i in win if lo < lengths[i] < hi and i not in b)
        assert inside == 0


def test_step_budget_fits_again_once_the_steps_are_warm(monkeypatch):
    """Slow first steps (new shapes meeting the allocator) must not fix the total: the second fit, from the steps
    after `last`, gives the count the budget holds at the warm rate, and a later step fits nothing."""
    from eaglekit.train import loop

    now = [0.0]
    monkeypatch.setattr(loop.time, "time", lambda: now[0])
    b = loop.StepBudget(100.0, 0, False, first=10, last=30)
    total, step = 10_000, 0
    fits = []
    while step < total:
        got = b.check(step, total, 10_000)
        if got is not None:
            fits.append((step, got))
            total = got
        now[0] += 0.5 if step < 30 else 0.1  # 0.5 s a step while cold, 0.1 s once warm
        step += 1
    (s1, t1), (s2, t2) = fits
    assert s1 == 30 and t1 == 30 + int((100 - 15) / 0.5)  # 200: what the cold rate promised
    # at step 120, 24 s spent: the 76 s left hold 760 steps at the warm rate (float rounding: one either way)
    assert s2 == max(t1 // 10, 120) and abs(t2 - (120 + 760)) <= 1
    assert abs(now[0] - 100) < 0.2  # the run ends at its budget


def test_step_budget_keeps_the_asked_steps_as_its_ceiling(monkeypatch):
    from eaglekit.train import loop

    now = [0.0]
    monkeypatch.setattr(loop.time, "time", lambda: now[0])
    b = loop.StepBudget(1000.0, 0, False, first=10, last=30)
    for step in range(31):
        got = b.check(step, 500, 500)
        now[0] += 0.1
    assert got == 500 and b.again is not None
    now[0] += 0.1 * (b.again - 31)
    assert b.check(b.again, 500, 500) == 500  # a budget that holds more never raises the count past --max-steps
