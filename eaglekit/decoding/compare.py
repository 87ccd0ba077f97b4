"""Decode a prompt set, with the draft and with the target alone, compare, aggregate: the one loop
behind `eaglekit demo`, `eval`, `sweep`, the recipe's evaluation and the doctor's decoded check.

    runs = decode_set(dec, prompts, 64)                      # one mode: results + aggregate metrics
    cmp = compare(dec, prompts, 64, warmup=16)               # both modes, prompt by prompt
    cmp.identical, cmp.eagle.metrics.accept_length, cmp.speedup, cmp.summary(), cmp.rows()

Greedy speculative output must equal the baseline's token for token (losslessness), so `identical`
is the check; under sampling the two modes draw differently and `identical` is not expected.

Where the decoder's baseline steps through verify-shaped kernels (`Decoder.baseline_rows` > 1: bf16 without
batch-invariant kernels), `identical` is checked against that baseline, and the speed is compared with the plain one-row
baseline, decoded too (the faster of the two: a speedup over a slowed-down baseline would flatter the draft).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..observe.metrics import GenerationMetrics, aggregate, rounded
from .decoder import Decoder, GenerationResult
from .sampling import SamplingParams


@dataclass
class RunSet:
    """Every prompt's result in one mode, and their aggregate (tokens/s = all new tokens / all wall time)."""

    results: list[GenerationResult]
    metrics: GenerationMetrics


def warm_up(
    dec: Decoder,
    prompt,
    tokens: int,
    sampling: SamplingParams | None = None,
    baseline: bool = False,
    baseline_rows: int | None = None,
):
    """One short generation whose first-call costs (allocations, CUDA-graph recording, compiles) stay out
    of the timings that follow."""
    if tokens > 0:
        dec.generate(prompt, tokens, sampling, baseline=baseline, baseline_rows=baseline_rows)


def decode_set(
    dec: Decoder,
    prompts,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    baseline: bool = False,
    warmup: int = 0,
) -> RunSet:
    """Each prompt decoded in one mode (the draft, or the target alone with baseline=True)."""
    if prompts:
        warm_up(dec, prompts[0], min(max_new_tokens, warmup), sampling, baseline)
    res = [dec.generate(p, max_new_tokens, sampling, baseline=baseline) for p in prompts]
    return RunSet(res, aggregate([r.metrics for r in res]))


@dataclass
class Comparison:
    prompt_tokens: list[int]
    eagle: RunSet
    baseline: RunSet
    same: list[bool]  # per prompt: the draft's output equals the target's
    baseline_rows: int = 1  # rows per step of `baseline` (see Decoder.baseline_rows)
    plain: RunSet | None = None  # the one-row baseline, decoded for the timing when baseline_rows > 1
    warmup_s: float = 0.0  # wall time of the warm-up generations (graph recording, compiles), outside the timings

    @property
    def timing_baseline(self) -> RunSet:
        return self.plain if self.plain is not None else self.baseline

    @property
    def identical(self) -> bool:
        return all(self.same)

    @property
    def speedup(self) -> float:
        b = self.timing_baseline.metrics.tokens_per_s
        return self.eagle.metrics.tokens_per_s / b if b else 0.0

    def summary(self) -> dict:
        E, B = self.eagle.metrics, self.timing_baseline.metrics
        out = {
            "accept_length": rounded(E.accept_length, 3),
            "accept_rate": rounded(E.accept_rate, 4),
            "per_position": [round(x, 4) for x in E.per_position],
            "histogram": E.histogram,
            "baseline_tokens_per_s": round(B.tokens_per_s, 2),
            "eagle_tokens_per_s": round(E.tokens_per_s, 2),
            "speedup": round(self.speedup, 3),
            "identical": self.identical,
            "prompts": len(self.same),
            "new_tokens": E.new_tokens,
            "baseline_rows": self.baseline_rows,
            "warm_up_s": round(self.warmup_s, 2),
        }
        if self.plain is not None:
            out["identical_one_row"] = sum(
                e.token_ids == b.token_ids for e, b in zip(self.eagle.results, self.plain.results)
            )
            out["baseline_rows_tokens_per_s"] = round(self.baseline.metrics.tokens_per_s, 2)
        return out

    def rows(self) -> list[dict]:
        return [
            {
                "prompt_tokens": n,
                "new_tokens": e.metrics.new_tokens,
                "identical": same,
                "accept_length": rounded(e.metrics.accept_length, 3),
                "baseline_tokens_per_s": round(b.metrics.tokens_per_s, 1),
                "eagle_tokens_per_s": round(e.metrics.tokens_per_s, 1),
            }
            for n, e, b, same in zip(self.prompt_tokens, self.eagle.results, self.baseline.results, self.same)
        ]


def compare(
    dec: Decoder,
    prompts,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    warmup: int = 0,
    alternate: bool = True,
    progress: str | None = None,
) -> Comparison:
    """Each prompt decoded with the draft and with the target alone. `alternate` swaps the order on every
    other prompt so that neither mode always runs on a warmer cache; `progress` names a tqdm bar."""
    from tqdm import tqdm

    rows = dec.baseline_rows
    t0 = time.perf_counter()
    if prompts and warmup:
        n = min(max_new_tokens, warmup)
        runs: list[tuple[str, dict[str, Any]]] = [("the draft's cycle", {}), ("the target alone", {"baseline": True})]
        if rows > 1:  # the one-row baseline records its own CUDA graph
            runs.append(("the one-row baseline", {"baseline": True, "baseline_rows": 1}))
        # a first run on a GPU compiles and records for a minute or more: say so, and show each run
        if progress and dec.target.device.type == "cuda":
            tqdm.write(
                f"{progress}: warming up; a first run compiles the layers and records CUDA graphs (a minute "
                f"or more), later runs reuse the compiled kernels from the cache"
            )
        with tqdm(
            total=len(runs), desc=f"{progress}: warm-up", unit="run", leave=False, mininterval=0, disable=not progress
        ) as bar:
            for what, kw in runs:
                bar.set_description_str(f"{progress}: warm-up, {what}")
                warm_up(dec, prompts[0], n, sampling, **kw)
                bar.update()
    warmup_s = time.perf_counter() - t0
    it = tqdm(prompts, desc=progress, unit="prompt", leave=False) if progress else prompts
    eagle, base, plain = [], [], []
    for i, p in enumerate(it):
        order = (True, False) if (alternate and i % 2 == 0) else (False, True)
        res = {b: dec.generate(p, max_new_tokens, sampling, baseline=b) for b in order}
        base.append(res[True])
        eagle.append(res[False])
        if rows > 1:
            plain.append(dec.generate(p, max_new_tokens, sampling, baseline=True, baseline_rows=1))
    return Comparison(
        [len(p) for p in prompts],
        RunSet(eagle, aggregate([r.metrics for r in eagle])),
        RunSet(base, aggregate([r.metrics for r in base])),
        [e.token_ids == b.token_ids for e, b in zip(eagle, base)],
        rows,
        RunSet(plain, aggregate([r.metrics for r in plain])) if plain else None,
        warmup_s,
    )
