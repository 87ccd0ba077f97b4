"""Bodies of the 2-process tests in test_tp.py (a module of their own: spawned processes import them)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

# the 10 tree shapes of the lossless suite (tests/decoding/test_lossless.py)
SHAPES = [(1, 1, 2), (3, 1, 4), (5, 1, 6), (2, 2, 4), (3, 2, 6), (4, 3, 10), (5, 4, 16), (6, 8, 48), (5, 2, 4),
          (6, 4, 5)]


def run(rank: int, world: int, port: int, name: str, args: tuple, timeout_s: float = 30.0):
    """Entry of each spawned process: the torchrun environment, the group, then the named body."""
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from eaglekit import distributed

    group = distributed.init_tp(world, "cpu", timeout_s=timeout_s)
    try:
        globals()[name](group, *args)
    finally:
        if name != "die":
            distributed.shutdown()
    # a finished rank leaves as eaglekit.cli.entry ends one: the interpreter's finalization can abort it ("terminate
    # called without an active exception", SIGABRT) as torch's C++ threads are torn down, which failed this test about
    # one run in nine under the full suite after both ranks had written their results. A failing body raised above
    # (the spawn wrapper reports it); only a rank that succeeded gets here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def equal(group, folder, out_dir):
    """TP=2 == TP=1: captured features (prefill and batched), the baseline and every tree shape, greedy,
    with the lm_head split by vocabulary and replicated."""
    import sequence

    from eaglekit.capture import CaptureSpec
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.draft import new_draft
    from eaglekit.models import load_target
    from eaglekit.models.llama import LlamaTarget

    ref = LlamaTarget.from_folder(folder, "cpu", torch.float64)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, ref.info.vocab_size, (17,), generator=g)
    spec = CaptureSpec((-1, 1, 2, 3))
    report = []
    for mode in ("vocab", "replicated"):
        group.lm_head = mode
        tpt = load_target(folder, dtype="float64")
        assert type(tpt).__name__ == "TPLlamaTarget" and tpt.vocab_parallel == (mode == "vocab")
        assert tpt.cache is None or tpt.cache.k.shape[2] == ref.cfg.num_kv_heads // group.world
        # features: prefill capture and the batched cacheless path
        for t in (ref, tpt):
            t.reset(64)
        lr, fr = sequence.prefill(ref, prompt, spec)
        lt, ft = sequence.prefill(tpt, prompt, spec)
        assert tpt.cache.k.shape[2] == ref.cfg.num_kv_heads // group.world
        assert ft.shape == fr.shape and torch.allclose(ft, fr, rtol=0, atol=1e-10), (ft - fr).abs().max()
        assert torch.allclose(lt, lr, rtol=0, atol=1e-9)
        batch = torch.randint(3, ref.info.vocab_size, (2, 9), generator=g)
        hr, fr2 = ref.features(batch, None, spec)
        ht, ft2 = tpt.features(batch, None, spec)
        assert torch.allclose(ft2, fr2, rtol=0, atol=1e-10) and torch.allclose(ht, hr, rtol=0, atol=1e-10)
        assert torch.allclose(tpt.lm_head_weight(), ref.lm_head_weight())
        # the unsharded references run on rank 0 only (rank 1 decodes in step with it; its own output is
        # what rank 0 gets, both reading the same all-reduced tensors)
        me = group.rank == 0
        base = Decoder(ref).generate(prompt.tolist(), 20, eos_ids=()).token_ids if me else None
        got = Decoder(tpt).generate(prompt.tolist(), 20, eos_ids=()).token_ids
        assert not me or got == base
        # every shape with the split lm_head; a chain, a tree and a cut tree with the replicated one
        for i, (s, k, d) in enumerate(SHAPES if mode == "vocab" else [SHAPES[1], SHAPES[6], SHAPES[9]]):
            draft = new_draft(ref, seed=i, dtype=torch.float64, capture=CaptureSpec((0, 2, 3)))
            got = Decoder(tpt, draft, TreeShape(s, k, d)).generate(prompt.tolist(), 20, eos_ids=())
            if me:
                want = Decoder(ref, draft, TreeShape(s, k, d)).generate(prompt.tolist(), 20, eos_ids=())
                assert got.token_ids == want.token_ids == base, (mode, (s, k, d))
                assert got.metrics.accepted == want.metrics.accepted
            report.append(sum(got.metrics.accepted))
    Path(out_dir, f"equal.{group.rank}").write_text(f"ok {sum(report)}")


def bad(group, folder, out_dir):
    """A config the ranks cannot split: the same readable error on every rank, before any collective."""
    from eaglekit.errors import EaglekitError
    from eaglekit.models import load_target

    try:
        load_target(folder)
        msg = "no error"
    except EaglekitError as e:
        msg = f"{e.code} {e.message}"
    Path(out_dir, f"bad.{group.rank}").write_text(msg)


def die(group, folder, out_dir):
    """Rank 1 is killed mid-generation; rank 0 must fail with a DistributedError, not hang."""
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.errors import EaglekitError
    from eaglekit.models import load_target

    t = load_target(folder, dtype="float64")
    dec = Decoder(t)
    dec.generate([5, 6, 7], 4, eos_ids=())
    if group.rank == 1:
        os.kill(os.getpid(), 9)
    t0 = time.time()
    try:
        dec.generate([5, 6, 7], 400, eos_ids=())
        msg = "no error"
    except EaglekitError as e:
        msg = f"{e.code} {e.message}"
    Path(out_dir, f"die.{group.rank}").write_text(f"{time.time() - t0:.1f} {msg}")
    os._exit(3)  # a dead peer can make the group's teardown wait: leave at once
