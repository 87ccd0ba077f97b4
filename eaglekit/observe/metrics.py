"""Acceptance and speed metrics, per generation and aggregated over a run.

Conventions (SGLang's and vLLM's, as docs/serving.md gives them):
- accept_length: tokens emitted per verify, the bonus included (SGLang's scale; vLLM's "mean acceptance
  length" is the same number). Counted before any stop truncation: it measures the draft, not the stop.
  None (JSON null, "n/a" in tables) when no verify ran: e.g. max_new_tokens 1, whose token comes from
  the prefill alone; it is not applicable, not zero. accept_rate likewise.
- accept_rate: accepted draft tokens / (verifies x (draft_tokens - 1)) (SGLang).
- per_position[k]: of the verifies whose tree reached depth k+1, the fraction that accepted at least
  k+1 tokens (vLLM's acceptance per draft position).
- tokens_per_s: new tokens over the wall time of the whole generate call (prefill included).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationMetrics:
    new_tokens: int = 0
    prompt_tokens: int = 0
    elapsed_s: float = 0.0
    draft_tokens: int = 0  # tree size including the root (0 for the baseline)
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per verify
    depths: list[int] = field(default_factory=list)  # deepest node of each verified tree
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, when profiled

    @property
    def speculative(self) -> bool:
        return self.draft_tokens > 0

    @property
    def verify_count(self) -> int:
        return len(self.accepted)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def accept_length(self) -> float | None:
        return (sum(self.accepted) + self.verify_count) / self.verify_count if self.verify_count else None

    @property
    def accept_rate(self) -> float | None:
        denom = self.verify_count * max(self.draft_tokens - 1, 1)
        return sum(self.accepted) / denom if self.verify_count else None

    @property
    def per_position(self) -> list[float]:
        top = max(self.depths, default=0)
        out = []
        for k in range(1, top + 1):
            reach = sum(1 for d in self.depths if d >= k)
            hit = sum(1 for a, d in zip(self.accepted, self.depths) if d >= k and a >= k)
            out.append(hit / reach if reach else 0.0)
        return out

    @property
    def histogram(self) -> list[int]:
        """histogram[a] = number of verifies that accepted exactly a draft tokens."""
        top = max(self.depths, default=0)
        h = [0] * (top + 1)
        for a in self.accepted:
            h[a] += 1
        return h

    def to_dict(self) -> dict:
        d: dict[str, object] = {
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "elapsed_s": round(self.elapsed_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
        }
        if self.speculative:
            d.update(
                accept_length=rounded(self.accept_length, 4),
                accept_rate=rounded(self.accept_rate, 4),
                verify_count=self.verify_count,
                per_position=[round(x, 4) for x in self.per_position],
                histogram=self.histogram,
                draft_tokens=self.draft_tokens,
            )
        if self.phases:
            d["phases_s"] = {k: round(v, 6) for k, v in self.phases.items()}
        return d


def rounded(x: float | None, digits: int) -> float | None:
    """round() that keeps a not-applicable metric (None) as None."""
    return None if x is None else round(x, digits)


def fmt(x: float | None, spec: str = ".2f") -> str:
    """A metric for a table: "n/a" where it does not apply (no verify ran)."""
    return "n/a" if x is None else format(x, spec)


def aggregate(runs: list[GenerationMetrics]) -> GenerationMetrics:
    out = GenerationMetrics(draft_tokens=max((r.draft_tokens for r in runs), default=0))
    for r in runs:
        out.new_tokens += r.new_tokens
        out.prompt_tokens += r.prompt_tokens
        out.elapsed_s += r.elapsed_s
        out.accepted += r.accepted
        out.depths += r.depths
        for k, v in r.phases.items():
            out.phases[k] = out.phases.get(k, 0.0) + v
    return out
