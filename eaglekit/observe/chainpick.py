"""Which chain length pays on this machine, from a model instead of a race.

Why: the speed of a chain of n draft tokens is its accept length over its cycle time. A race of the chains on a
sample small enough for ~10 s ranks them badly: acceptance varies so much between prompts, and between the start of
a continuation and its later tokens, that the sample's accept lengths are not the run's (benchmarks/NOTES.md, "Why
the CPU demo's chain pick wanders": picks 2, 5, 3, 2 in four demo runs).

How: (1) the target's greedy continuations of the prompts, batched; (2) one teacher-forced pass of the draft over
them (eaglekit.train.ttt) gives, at each position p, the run r_p of a chain drafted from p that the target accepts,
up to the longest chain. A greedy draft's first n tokens from p are the same whatever the chain's length, so a chain
of n accepts min(r_p, n) there; walking each text cycle by cycle gives every chain's accept length on that text at
once (NOTES: 2.355 / 3.10 / 3.55 predicted for chains 2 / 4 / 6 on the demo, 2.36 / 3.12 / 3.59 measured); (3) a few
generations per chain time its cycles (a line through them: line_fit says why). Predicted tokens/s = accept length
/ cycle time; the fastest wins.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..decoding.engine import Decoder
from ..decoding.tree import TreeShape

CHAINS = (2, 3, 4, 5, 6)
TIME_PROMPTS, TIME_TOKENS, TIME_ROUNDS = 2, 32, 2  # the cycle timing: per chain, rounds x prompts generations


@torch.inference_mode()
def accepted_runs(target, draft, texts: list[list[int]], capture, steps: int, chunk: int = 8) -> list[torch.Tensor]:
    """Per text (the target's own greedy text): r [len] with r[p] = how many tokens of a chain of `steps` drafted
    from position p the target accepts (0 where nothing is counted: the text's last positions)."""
    from ..train.data import Example, pad_batch
    from ..train.ttt import TargetBatch, teacher_forced_hits

    dev, lm = target.device, target.lm_head_weight()
    hot = draft.to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device))
    out = []
    for i in range(0, len(texts), chunk):
        part = texts[i:i + chunk]
        ids, _, valid = pad_batch([Example(t, [1] * len(t)) for t in part])
        ids, valid = ids.to(dev), valid.to(dev)
        hidden, feats = target.features(ids, valid.long(), capture)
        correct, _ = teacher_forced_hits(draft, TargetBatch(feats, ids, valid.long(), valid, hidden), lm, hot, steps)
        runs = torch.cumprod(correct.long(), 1).sum(1).cpu()  # leading correct steps [B, T] (correct: counted too)
        out += [runs[j, :len(t)] for j, t in enumerate(part)]
    return out


def accept_lengths(runs: list[torch.Tensor], starts: list[int], chains) -> dict[int, float]:
    """Each chain's accept length (tokens per verify, the bonus token included) over the texts, walking each from
    q = start[i] (the first generated token, which the prefill emits) cycle by cycle to the text's end: with q the
    last token emitted, the chain is drafted from the draft entry at q - 1 (target features at q - 1, token q), so
    it accepts min(runs[q - 1], n) tokens, then the bonus token, never past the text's last token."""
    out = {}
    for n in chains:
        tokens = cycles = 0
        for r, q in zip(runs, starts):
            end = len(r)
            while q < end - 1:
                a = min(int(r[q - 1]), n, end - 2 - q)
                tokens, cycles, q = tokens + a + 1, cycles + 1, q + a + 1
        out[n] = tokens / cycles if cycles else 1.0
    return out


def cycle_seconds(target, draft, prompts: list[list[int]], chains, tokens: int = TIME_TOKENS,
                  rounds: int = TIME_ROUNDS) -> dict[int, list[float]]:
    """Seconds per cycle of each chain here, one sample a generation (its time after its prefill over its verifies)
    of `tokens` on each prompt, the chains taking turns round by round (against drift). A first untimed generation
    per chain meets its shapes' one-time costs (oneDNN makes its primitives per row count)."""
    decs = {n: Decoder(target, draft, TreeShape.make(n, 1), profile=True) for n in chains}
    for n in chains:
        decs[n].generate(prompts[0], tokens)
    per: dict[int, list[float]] = {n: [] for n in chains}
    for _ in range(rounds):
        for n in chains:
            for p in prompts:
                m = decs[n].generate(p, tokens).metrics
                if m.verify_count:
                    per[n].append((m.elapsed_s - m.phases.get("prefill", 0.0)) / m.verify_count)
    return per


def line_fit(samples: dict[int, list[float]]) -> dict[int, float]:
    """Each chain's cycle time from the least-squares line through every (n, seconds) sample. A chain of n costs
    n - 1 draft steps, a verify of n + 1 rows and an extend of up to n + 1: each grows about linearly in n on a CPU,
    while a 2-core machine's timings wander by 10-20% from one generation to the next (NOTES); the line pools
    every sample, where a per-chain median of four would let that noise rank the chains."""
    pts = [(n, s) for n, v in samples.items() for s in v]
    medians = {n: statistics.median(v) if v else float("inf") for n, v in samples.items()}
    if len({n for n, _ in pts}) < 2:
        return medians
    mx, my = statistics.fmean(n for n, _ in pts), statistics.fmean(s for _, s in pts)
    slope = sum((n - mx) * (s - my) for n, s in pts) / sum((n - mx) ** 2 for n, _ in pts)
    fit = {n: my + slope * (n - mx) for n in samples}
    return fit if all(v > 0 for v in fit.values()) else medians  # (a line through wild noise may cross zero)


def pick_chain(target, draft, prompts: list[list[int]], max_new_tokens: int, chains=CHAINS) -> tuple[TreeShape, dict]:
    """The chain (steps in `chains`) with the most predicted tokens/s for these prompts at this length on this
    machine -> (shape, what was measured and predicted)."""
    from ..draft import check_pair
    from ..train.regen import greedy_texts

    t0 = time.perf_counter()
    with torch.inference_mode():
        texts = greedy_texts(target, prompts, max_new_tokens, tuple(target.info.eos_token_ids))
    runs = accepted_runs(target, draft, texts, check_pair(draft, target), max(chains))
    acc = accept_lengths(runs, [len(p) for p in prompts], chains)
    t1 = time.perf_counter()
    samples = cycle_seconds(target, draft, prompts[:TIME_PROMPTS], chains)
    secs = line_fit(samples)
    rows = [{"steps": n, "accept_length": round(acc[n], 3), "cycle_ms": round(secs[n] * 1e3, 2),
             "cycle_ms_median": round(statistics.median(samples[n]) * 1e3, 2) if samples[n] else None,
             "tokens_per_s": round(acc[n] / secs[n], 1)} for n in chains]
    best = max(rows, key=lambda r: r["tokens_per_s"])
    return TreeShape.make(best["steps"], 1), {
        "by": "model", "seconds": round(time.perf_counter() - t0, 1), "model_s": round(t1 - t0, 1),
        "prompts": len(prompts), "max_new_tokens": max_new_tokens, "candidates": rows}
