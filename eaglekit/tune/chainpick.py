"""Which chain length pays on this machine, from a model instead of a race, within a time budget.

Why: the speed of a chain of n draft tokens is its accept length over its cycle time. A race of the chains on a
sample small enough for ~10 s ranks them badly: acceptance varies so much between prompts, and between the start of
a continuation and its later tokens, that the sample's accept lengths are not the run's (four demo runs raced to
four different picks: docs/performance.md#d35).

How: (1) the target's greedy continuations of the prompts, batched; (2) one teacher-forced pass of the draft over
them (eaglekit.train.ttt) gives, at each position p, the run r_p of a chain drafted from p that the target accepts,
up to the longest chain. A greedy draft's first n tokens from p are the same whatever the chain's length, so a chain
of n accepts min(r_p, n) there; walking each text cycle by cycle gives every chain's accept length on that text at
once (within 1% of the measured ones on the demo: docs/performance.md#d35); (3) short
generations time each chain's cycle against the target's own step, interleaved round by round (the step, then each
chain, the order rotating), so a machine whose speed changes (other processes taking the cores) weighs on every
candidate of a round alike: a chain's cost is the median over rounds of its cycle over the step of the same round.
Predicted speedup = accept length / that ratio; the fastest wins.

Time: on a loaded 2-core machine every forward costs several times its quiet figure, so the pick runs against a
budget (`budget_s`): the model walks the prompts in interleaved slices (a spread of the set, not its first few;
the first one half a slice, the least it rests on) until half the budget is spent, the timing rounds until all of
it is (MIN_ROUNDS while the budget lasts, one past it). What was measured by then decides, and the result says how
much that was.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ..decoding.decoder import Decoder
from ..decoding.tree import TreeShape

CHAINS = (2, 3, 4, 5, 6)
BUDGET_S = 20.0  # the whole pick, model and timing (the README's promise; a loaded machine gets what fits)
MODEL_SHARE = 0.5  # of the budget, for the model's slices (at least one slice runs)
SLICE = 8  # prompts per slice of the model (its batch: the greedy continuations and the teacher-forced pass)
TIME_PROMPTS, TIME_TOKENS = 4, 24  # the timing rounds cycle over this many prompts, one generation of this length
MIN_ROUNDS, MAX_ROUNDS = 2, 40  # rounds of the timing: at least (within the budget; one past it), at most


class Progress:
    """The pick's time against its budget, and a tqdm line (stderr) saying what is being measured and how far."""

    def __init__(self, budget_s: float, show: bool):
        self.t0, self.budget_s, self.bar = time.perf_counter(), budget_s, None
        if show:
            from tqdm import tqdm

            self.bar = tqdm(
                total=round(budget_s),
                desc="chain pick",
                unit="s",
                leave=False,
                bar_format="{desc} |{bar}| {n:.0f}/{total} s budget",
            )

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, what: str) -> None:
        if self.bar is not None:
            self.bar.n = min(self.elapsed, self.budget_s)
            self.bar.set_description_str(f"chain pick: {what}", refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@torch.inference_mode()
def accepted_runs(target, draft, texts: list[list[int]], capture, steps: int, chunk: int = 8) -> list[torch.Tensor]:
    """Per text (the target's own greedy text): r [len] with r[p] = how many tokens of a chain of `steps` drafted
    from position p the target accepts (0 where nothing is counted: the text's last positions)."""
    from ..train.ttt import accepted_runs as runs_of

    return [runs for runs, _ in runs_of(target, draft, texts, capture, steps, chunk)]


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


def spread(prompts: list, size: int) -> list[list]:
    """The prompts in slices of `size`, each a spread over the whole set (every k-th), so that the first slices
    alone, all a tight budget leaves time for, stand for the set rather than for its first few prompts."""
    k = max(1, -(-len(prompts) // size))
    return [prompts[i::k] for i in range(k) if prompts[i::k]]


def model_accept_lengths(
    target, draft, prompts: list[list[int]], max_new_tokens: int, chains, clock: Progress, until_s: float
) -> tuple[dict[int, float], int]:
    """(each chain's predicted accept length, how many prompts it rests on): the model's slices until `until_s` of
    the clock (one slice at least)."""
    from ..draft import check_pair
    from ..train.regen import greedy_texts

    capture, eos = check_pair(draft, target), tuple(target.info.eos_token_ids)
    runs: list[torch.Tensor] = []
    starts: list[int] = []
    last = 0.0
    slices = spread(prompts, SLICE)
    if slices:  # the first slice in two halves: a loaded machine past its share after the first stops there
        head = slices[0]
        slices = [head[: (len(head) + 1) // 2], head[(len(head) + 1) // 2 :]] + slices[1:]
    for part in (s for s in slices if s):
        if runs and clock.elapsed + last > until_s:  # (the next slice would end past the share: as long as the last)
            break
        clock.say(f"accept lengths, {len(starts)}/{len(prompts)} prompts")
        t0 = clock.elapsed
        with torch.inference_mode():
            texts = greedy_texts(target, part, max_new_tokens, eos)
        runs += accepted_runs(target, draft, texts, capture, max(chains))
        starts += [len(p) for p in part]
        last = clock.elapsed - t0
    return accept_lengths(runs, starts, chains), len(starts)


def _per_step(m, baseline: bool) -> float | None:
    """Seconds a baseline step (new tokens after the prefill's) or a chain's cycle (per verify) took in one
    generation, the prefill left out (it runs once a generation, whatever the chain)."""
    n = m.new_tokens - 1 if baseline else m.verify_count
    return (m.elapsed_s - m.phases.get("prefill", 0.0)) / n if n > 0 else None


def cycle_ratios(
    target,
    draft,
    prompts: list[list[int]],
    chains,
    clock: Progress,
    until_s: float,
    tokens: int = TIME_TOKENS,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
) -> tuple[dict[int, list[float]], list[float]]:
    """(per chain: its cycle over the target's step, one sample a round; the step's seconds, one a round).
    A round is one generation of `tokens` with the target alone and one with each chain, on the round's prompt,
    in an order that rotates from round to round; rounds run until `until_s` of the clock (at least `min_rounds`).
    A first untimed generation per chain meets its shapes' one-time costs (oneDNN makes its primitives per row
    count)."""
    decs = {n: Decoder(target, draft, TreeShape.make(n, 1), profile=True) for n in chains}
    first = decs[chains[0]]
    clock.say("timing: warm-up")
    first.generate(prompts[0], 8, baseline=True)
    for n in chains:
        decs[n].generate(prompts[0], 8)
    ratios: dict[int, list[float]] = {n: [] for n in chains}
    steps: list[float] = []
    order = [None, *chains]  # None: the target alone
    last = 0.0
    for r in range(max_rounds):
        if r >= 1 and clock.elapsed > until_s:  # past the budget: what one round measured decides
            break
        if r >= min_rounds and clock.elapsed + last > until_s:  # (the next round would end past the budget)
            break
        t0 = clock.elapsed
        p = prompts[r % len(prompts)]
        k = r % len(order)
        got: dict[int | None, float | None] = {}
        for n in order[k:] + order[:k]:
            clock.say(f"timing round {r + 1}, {'the target alone' if n is None else f'chain {n}'}")
            dec = first if n is None else decs[n]
            got[n] = _per_step(dec.generate(p, tokens, baseline=n is None).metrics, n is None)
        last = clock.elapsed - t0
        step = got[None]
        if not step:
            continue
        steps.append(step)
        for n in chains:
            cycle = got[n]
            if cycle:
                ratios[n].append(cycle / step)
    return ratios, steps


def line_fit(samples: dict[int, list[float]]) -> dict[int, float]:
    """Each chain's cycle cost from the least-squares line through every (n, cost) sample. A chain of n costs
    n - 1 draft steps, a verify of n + 1 rows and an extend of up to n + 1: each grows about linearly in n on a CPU,
    while a 2-core machine's timings wander from one generation to the next by more than the chains differ; the
    line pools
    every sample, where a per-chain median of four would let that noise rank the chains."""
    pts = [(n, s) for n, v in samples.items() for s in v]
    medians = {n: statistics.median(v) if v else float("inf") for n, v in samples.items()}
    if len({n for n, _ in pts}) < 2:
        return medians
    mx, my = statistics.fmean(n for n, _ in pts), statistics.fmean(s for _, s in pts)
    slope = sum((n - mx) * (s - my) for n, s in pts) / sum((n - mx) ** 2 for n, _ in pts)
    fit = {n: my + slope * (n - mx) for n in samples}
    return fit if all(v > 0 for v in fit.values()) else medians  # (a line through wild noise may cross zero)


def pick_chain(
    target,
    draft,
    prompts: list[list[int]],
    max_new_tokens: int,
    chains=CHAINS,
    budget_s: float = BUDGET_S,
    progress: bool = False,
) -> tuple[TreeShape, dict]:
    """The chain (steps in `chains`) with the most predicted speedup for these prompts at this length on this
    machine, measured within about `budget_s` -> (shape, what was measured and predicted)."""
    clock = Progress(budget_s, progress)
    try:
        acc, used = model_accept_lengths(target, draft, prompts, max_new_tokens, chains, clock, budget_s * MODEL_SHARE)
        t_model = clock.elapsed
        ratios, steps = cycle_ratios(target, draft, spread(prompts, TIME_PROMPTS)[0], chains, clock, budget_s)
    finally:
        clock.close()
    cost = line_fit(ratios)  # a chain's cycle in target steps
    step = statistics.median(steps)
    rows = [
        {
            "steps": n,
            "accept_length": round(acc[n], 3),
            "cycle_steps": round(cost[n], 3),
            "cycle_steps_median": round(statistics.median(ratios[n]), 3) if ratios[n] else None,
            "cycle_ms": round(cost[n] * step * 1e3, 2),
            "speedup": round(acc[n] / cost[n], 3),
            "tokens_per_s": round(acc[n] / (cost[n] * step), 1),
        }
        for n in chains
    ]
    ranked = sorted(rows, key=lambda r: r["speedup"], reverse=True)
    best = ranked[0]
    why = (
        f"chain {best['steps']}: accept length {best['accept_length']:.2f} over a cycle of "
        f"{best['cycle_steps']:.2f} target steps = {best['speedup']:.2f}x predicted"
    )
    if len(ranked) > 1:
        why += f" (next: chain {ranked[1]['steps']}, {ranked[1]['speedup']:.2f}x)"
    return TreeShape.make(best["steps"], 1), {
        "chain": best["steps"],
        "by": "model",
        "seconds": round(clock.elapsed, 1),
        "model_s": round(t_model, 1),
        "budget_s": budget_s,
        "prompts": len(prompts),
        "model_prompts": used,
        "rounds": len(steps),
        "max_new_tokens": max_new_tokens,
        "step_ms": round(step * 1e3, 2),
        "baseline_tokens_per_s": round(1 / step, 1),
        "speedup": best["speedup"],
        "tokens_per_s": best["tokens_per_s"],
        "why": why,
        "candidates": rows,
    }


def pick_threads(
    target, draft, prompt: list[int], counts: tuple[int, ...], rounds: int = 3, tokens: int = 6, budget_s: float = 4.0
) -> dict:
    """The thread count whose target step is the fastest here and now, the counts taking turns round by round
    (`rounds` timed, fewer where `budget_s` runs out; one at least).
    Why: on a 2-core machine where other processes hold the cores, two threads wait on each other at every
    parallel region (one of them is off its core), and a step costs 10-50x its quiet time; one thread does not
    wait (docs/performance.md#d37). The pair's speed follows the target's step, and
    the speedup is measured against the target alone
    at the same count, so the count is chosen by the target's step (a faster one would flatter the draft).
    Leaves torch at the chosen count -> {"threads": n, "step_ms": {count: median ms}, "seconds": s}."""
    t0 = time.perf_counter()
    dec = Decoder(target, draft, TreeShape.make(2, 1), profile=True)
    times: dict[int, list[float]] = {c: [] for c in counts}
    for r in range(rounds + 1):
        if r > 1 and time.perf_counter() - t0 > budget_s:
            break
        for c in counts if r % 2 else counts[::-1]:
            torch.set_num_threads(c)
            s = _per_step(dec.generate(prompt, tokens, baseline=True).metrics, True)
            if r and s:  # (round 0 is untimed: first-use costs)
                times[c].append(s)
    ms = {c: round(statistics.median(v) * 1e3, 3) for c, v in times.items() if v}
    first = counts[0]
    # another count only where it is clearly faster (10%): the quiet machine's figures keep the default
    best = min(ms, key=ms.__getitem__) if ms else first
    if ms.get(first) is not None and ms[best] > 0.9 * ms[first]:
        best = first
    torch.set_num_threads(best)
    return {
        "threads": best,
        "step_ms": {str(c): v for c, v in ms.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }


# --- this machine's pick, kept between runs -------------------------------------------------------------------
CACHE_NAME = "chain_pick.json"


def cache_file() -> Path:
    """$XDG_CACHE_HOME/eaglekit/chain_pick.json, else ~/.cache/eaglekit/chain_pick.json."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eaglekit" / CACHE_NAME


def cache_key(fields: dict) -> str:
    """The entry's name: a hash of what the pick depends on (the processor, cores, torch, dtype, products, thread
    count, the pair's and the prompts' bytes, the length): any of them changed, the pick is made anew."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _entries(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable (a hand edit): the pick is redone and rewrites it
        return {}
    return data.get("entries", {}) if isinstance(data, dict) and isinstance(data.get("entries"), dict) else {}


def cached_pick(fields: dict) -> dict | None:
    """The pick stored for these fields on this machine, or None."""
    e = _entries(cache_file()).get(cache_key(fields))
    if not (isinstance(e, dict) and isinstance(e.get("picked"), dict) and e["picked"].get("chain") in CHAINS):
        return None
    return {**e["picked"], "picked_at": e.get("at")}


def remember_pick(fields: dict, picked: dict) -> Path | None:
    """Store the pick (atomically: a reader never sees half a file) -> the file, or None where it cannot be
    written (a read-only home: the demo goes on, the next run picks again)."""
    from ..errors import EaglekitError
    from ..io import atomic_write_json

    path = cache_file()
    entries = _entries(path)
    entries[cache_key(fields)] = {"key": fields, "picked": picked, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        atomic_write_json(
            path, {"what": "eaglekit demo: the chain picked per machine (eaglekit.tune.chainpick)", "entries": entries}
        )
    except (OSError, EaglekitError):  # (EaglekitError: a full disk, E160)
        return None
    return path
