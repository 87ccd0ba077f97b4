"""When to speculate: per step, the draft tree or a plain decode step, whichever gives more tokens per second.

A speculative cycle over B padded rows costs `spec[B]` seconds and emits E tokens per row, E = 1 + sum over
draft positions i of prod_{j <= i} a_j, where a_j is the running rate at which position j is accepted given
that j - 1 was (per-position acceptance, as vLLM's spec-decode counters count it). A plain step costs
`plain[B]` and emits one token per row. The engine speculates iff E / spec[B] >= 1 / plain[B]: expected
tokens per second, never a fixed batch-size threshold, so a draft that stops paying (a hard prompt, an
untrained draft, a batch grown past where the verify stays memory-bound) is switched off by its own figures.

The costs are the engine's own wall times of the last cycles at each padded size (an exponential mean: the
step ends with the one host read, so its wall time is the device time), measured as the engine runs; a size
not yet timed is tried once each way. Acceptance is counted with exponential decay by steps of either kind
(half-life HALF_LIFE steps), from a weak prior: while plain steps run, old evidence fades, so a probe that
finds the draft right again outweighs it within a few probes.

While plain steps run, speculation's figures go stale, so every `probe` plain steps one speculative cycle
runs anyway; a probe that still loses doubles the interval (up to MAX_PROBE), one that wins resets it. The
rows keep their draft state through plain steps (the engine buffers each plain token's captured features and
the draft catches up before the next cycle), so switching back costs one draft extend, not a new prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HALF_LIFE = 32.0  # steps: how fast old acceptance counts fade
PRIOR_RATE, PRIOR_WEIGHT = 0.6, 1.0  # before any cycle: a draft of middling quality, worth one observation
COST_MEAN = 0.3  # weight of the newest wall time in the running cost
MIN_PROBE, MAX_PROBE = 16, 96  # plain steps between probes; MAX_PROBE < the engine's catch-up window


@dataclass
class SpecPolicy:
    positions: int  # draft positions of the tree's longest path (shape.path_len - 1)
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    spec: dict[int, float] = field(default_factory=dict)  # padded rows -> seconds per speculative cycle
    plain: dict[int, float] = field(default_factory=dict)  # padded rows -> seconds per plain step
    probe: int = MIN_PROBE
    since_spec: int = 0  # plain steps since the last speculative cycle
    speculating: bool = True  # the last choice (a switch is a choice that differs from it)

    def __post_init__(self):
        self.reached = [PRIOR_WEIGHT] * self.positions
        self.accepted = [PRIOR_WEIGHT * PRIOR_RATE] * self.positions

    # --- estimates ---------------------------------------------------------------------------------
    def rates(self) -> list[float]:
        return [a / r if r > 0 else 0.0 for a, r in zip(self.accepted, self.reached)]

    def expected_tokens(self) -> float:
        """Tokens a speculating row emits per cycle (the bonus included), from the running rates."""
        e, run = 1.0, 1.0
        for a in self.rates():
            run *= a
            e += run
        return e

    def gain(self, rows: int) -> float | None:
        """Expected tokens/s speculating over tokens/s plain at this padded size; None until both are timed."""
        if rows not in self.spec or rows not in self.plain:
            return None
        return self.expected_tokens() * self.plain[rows] / self.spec[rows]

    # --- the choice --------------------------------------------------------------------------------
    def choose(self, rows: int) -> tuple[bool, str]:
        """-> (speculate?, why) for a step over `rows` padded rows."""
        if rows not in self.spec:
            return True, "first cycle at this batch size: timing it"
        if rows not in self.plain:
            return False, "first plain step at this batch size: timing it"
        g = self.gain(rows)
        if g >= 1.0:
            return True, f"expected gain x{g:.2f}"
        if self.since_spec >= self.probe:
            return True, f"probe after {self.since_spec} plain steps (expected gain x{g:.2f})"
        return False, f"expected gain x{g:.2f} < 1"

    def switched(self, speculate: bool) -> bool:
        """Record the choice made; True when it differs from the last one (a switch: the engine counts them)."""
        changed = speculate != self.speculating
        self.speculating = speculate
        return changed

    # --- what happened -----------------------------------------------------------------------------
    def observe_cycle(self, rows: int, seconds: float, accepted: list[int]) -> None:
        """A speculative cycle at `rows` padded rows took `seconds`; `accepted` holds each drafting row's count
        of accepted draft tokens (0 .. positions)."""
        self.spec[rows] = _mean(self.spec.get(rows), seconds)
        self._fade()
        for n in accepted:
            for i in range(min(n + 1, self.positions)):  # positions 0..n reached; 0..n-1 accepted
                self.reached[i] += 1
                if i < n:
                    self.accepted[i] += 1
        probing, self.since_spec = self.since_spec > 0, 0
        if probing:
            g = self.gain(rows)
            self.probe = MIN_PROBE if g is not None and g >= 1.0 else min(2 * self.probe, MAX_PROBE)

    def observe_plain(self, rows: int, seconds: float) -> None:
        self.plain[rows] = _mean(self.plain.get(rows), seconds)
        self.since_spec += 1
        self._fade()

    def _fade(self) -> None:
        k = 0.5 ** (1 / HALF_LIFE)
        self.reached = [r * k for r in self.reached]
        self.accepted = [a * k for a in self.accepted]


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - COST_MEAN) * old + COST_MEAN * new
