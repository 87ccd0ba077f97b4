"""How far to speculate: per step, a draft length (0 = a plain decode step) with the most expected tokens per second.

The engine can run its tree shape and shorter ones (`lengths`: the draft positions of each, TreeShape.shorter). A
cycle of length j over B padded rows costs `spec[B, j]` seconds and emits E(j) tokens per row,
E(j) = 1 + sum over draft positions i < j of prod_{m <= i} a_m, where a_m is the running rate at which position m is
accepted given that m - 1 was (per-position acceptance, as vLLM's spec-decode counters count it). A plain step costs
`plain[B]` and emits one token per row. The engine runs the j with the highest E(j) / spec[B, j], or a plain step
when 1 / plain[B] is higher: expected tokens per second, never a fixed batch-size threshold, so a draft that stops
paying (a hard prompt, an untrained draft) is switched off by its own figures, and a batch grown past where a long
verify stays memory-bound drafts fewer tokens instead of none.

The rates are shared by all lengths. For a chain that is exact (a shorter chain is a prefix of the longer one: the
same tokens at the same positions); a shallower tree of the same width spends its tokens on fewer levels, so it
accepts at least as often per position as the longest tree's rates say (the estimate errs towards the long tree).

The costs are the engine's own wall times of the last cycles at each (padded size, length) (a running mean that takes a
faster time at once, since interference only adds time; the step ends with the one host read, so its wall time is the
device time), refined as the engine runs. A cycle costs at least a plain step (its verify holds the step's row and
more), so a cycle timed below the plain figure counts at the plain figure: noise in either (a plain figure inflated by
one slow step) cannot make a draft that gets nothing accepted look faster than plain decoding, and speculation runs
only where the expected gain is above 1. Where the engine records CUDA graphs it times every length and the plain
step when it records a padded size (seed_costs: warm-up, not a serving step, pays for it); elsewhere a pair not yet
timed is tried once (the longest first, then a plain step, then each shorter length that could still win: a cycle
costs at least a plain step, so a length whose expected tokens do not beat the best gain so far is never timed).
Acceptance is counted with exponential decay by steps of any kind (half-life HALF_LIFE steps), from a weak prior: while
plain or short cycles run, old evidence fades, so a probe that finds the draft right again outweighs it within a few
probes.

Only the longest length sees every position, so while anything else runs its figures go stale: every `probe` steps one
cycle of the longest length runs anyway; a probe that still loses doubles the interval (up to probe_ceiling), one that
wins resets it. The ceiling is MAX_PROBE where a probe is cheap; a probe also pays the draft's catch-up over the plain
tokens since the last one (observe_catch_up), which on a GPU is launch-bound: ~4 ms, ten plain steps of a small target
(docs/performance.md#d31), so there the ceiling rises until probes cost PROBE_SHARE of the
plain steps between them, up to LONGEST_PROBE (a draft that pays again waits that much longer to be found). The plain
step's cost goes stale the same way while the engine speculates, and a stale plain cost is the one that can hold a
losing draft on: a burst of load raises the plain figure (the steps that ran during it), the load ends during a cycle,
whose figure takes the quiet time at once, and from then on every cycle beats the inflated plain figure while no plain
step runs to correct it (a draft that is never right ran at ~0.5x of plain decoding for as long as that lasted:
docs/performance.md#d32). So while speculating, every `plain_probe` steps one plain
step runs, with the same back-off and ceiling (the cycle after it pays a catch-up too): a plain step that still loses
doubles the interval, one that wins resets it. The rows keep their draft state through plain steps (the engine buffers
each plain token's captured features and the draft catches up before the next cycle), so switching back costs one draft
extend, not a new prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HALF_LIFE = 32.0  # steps: how fast old acceptance counts fade
PRIOR_RATE, PRIOR_WEIGHT = 0.6, 1.0  # before any cycle: a draft of middling quality, worth one observation
COST_MEAN = 0.3  # weight of the newest wall time in the running cost
# steps between probes. A probe costs its cycle and the draft's catch-up over the plain tokens since the last one (two
# to four steps' time on a CPU), so at MAX_PROBE an unpaying draft costs ~1-2% of plain decoding there
MIN_PROBE, MAX_PROBE = 16, 240
# where a probe costs more than PROBE_SHARE of MAX_PROBE plain steps, the back-off goes on up to LONGEST_PROBE steps;
# LONGEST_PROBE < the engine's catch-up window, whose features it keeps per row (decoding.state.CATCH_UP)
PROBE_SHARE, LONGEST_PROBE = 0.01, 1008


@dataclass
class SpecPolicy:
    positions: int  # draft positions of the longest shape's longest path (shape.path_len - 1)
    lengths: tuple[int, ...] = ()  # the draft lengths the engine can run (positions each); () = (positions,)
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    spec: dict[tuple[int, int], float] = field(default_factory=dict)  # (padded rows, length) -> s per cycle
    plain: dict[int, float] = field(default_factory=dict)  # padded rows -> seconds per plain step
    catch_up: dict[int, float] = field(default_factory=dict)  # padded rows -> seconds per catch-up before a cycle
    probe: int = MIN_PROBE
    since_full: int = 0  # steps since the last cycle at the longest length
    plain_probe: int = MIN_PROBE
    since_plain: int = 0  # steps since the last plain step
    length: int = -1  # the last choice (0: plain); -1 before the first

    def __post_init__(self):
        self.lengths = tuple(sorted(set(self.lengths) | {self.positions}, reverse=True))
        if self.lengths[-1] < 1 or self.lengths[0] != self.positions:
            raise ValueError(f"draft lengths must lie in 1..{self.positions}, got {self.lengths}")
        self.reached = [PRIOR_WEIGHT] * self.positions
        self.accepted = [PRIOR_WEIGHT * PRIOR_RATE] * self.positions

    # --- estimates ---------------------------------------------------------------------------------
    def rates(self) -> list[float]:
        return [a / r if r > 0 else 0.0 for a, r in zip(self.accepted, self.reached)]

    def _expected(self) -> list[float]:
        """E(j) for j = 0 .. positions from the running rates (E(0) = 1: the bonus alone); the rates read once."""
        out, run = [1.0], 1.0
        for a in self.rates():
            run *= a
            out.append(out[-1] + run)
        return out

    def expected_tokens(self, length: int | None = None) -> float:
        """Tokens a speculating row emits per cycle of `length` draft positions (default the longest), the bonus
        included, from the running rates."""
        return self._expected()[self.positions if length is None else length]

    def per_row(self, drafting: float = 1.0) -> dict[int, float]:
        """Tokens a row emits per cycle at each length, on average over rows of which the share `drafting` has its
        draft (a row without it emits one token a cycle)."""
        e = self._expected()
        return {j: drafting * e[j] + 1 - drafting for j in self.lengths}

    def best(self, rows: int, drafting: float = 1.0) -> tuple[int, float] | None:
        """(the timed length with the most expected tokens per second at this padded size, that figure in tokens per
        second of one row); None while no length is timed here."""
        return self._best(rows, self.per_row(drafting))

    def _best(self, rows: int, tokens: dict[int, float]) -> tuple[int, float] | None:
        """best() from per_row()'s tokens, read once by the caller."""
        timed = [(tokens[j] / self._cycle(rows, j), j) for j in self.lengths if (rows, j) in self.spec]
        if not timed:
            return None
        rate, j = max(timed)
        return j, rate

    def gain(self, rows: int, length: int | None = None, drafting: float = 1.0) -> float | None:
        """Expected tokens/s at `length` (default: the best timed one) over tokens/s plain at this padded size; None
        until both are timed."""
        if rows not in self.plain:
            return None
        if length is None:
            b = self.best(rows, drafting)
            return None if b is None else b[1] * self.plain[rows]
        if (rows, length) not in self.spec:
            return None
        return self.per_row(drafting)[length] * self.plain[rows] / self._cycle(rows, length)

    def _cycle(self, rows: int, length: int) -> float:
        """The cost a decision reads for a cycle: its running figure, and never below a plain step's (module
        docstring)."""
        return max(self.spec[rows, length], self.plain.get(rows, 0.0))

    # --- the choice --------------------------------------------------------------------------------
    def choose(self, rows: int, drafting: float = 1.0) -> tuple[int, str]:
        """-> (draft length, why) for a step over `rows` padded rows of which the share `drafting` has its draft;
        length 0 is a plain decode step."""
        full = self.positions
        if (rows, full) not in self.spec:
            return full, "first cycle at this batch size: timing it"
        plain = self.plain.get(rows)
        if plain is None:
            return 0, "first plain step at this batch size: timing it"
        # gain() and best() from one reading of the figures (this runs before every step: host time per step)
        tokens = self.per_row(drafting)
        picked = self._best(rows, tokens)
        assert picked is not None  # (the longest length is timed here)
        best, rate = picked
        g = rate * plain
        for j in self.lengths:
            # a cycle costs at least a plain step (its verify holds the step's row and more), so a length whose
            # expected tokens E(j) do not beat the best gain so far cannot win: it is not worth a timing cycle.
            # (Each length is timed at most once per size: an untrained draft's cost is bounded by that.)
            if (rows, j) not in self.spec and tokens[j] > max(1.0, g):
                return j, f"first cycle of draft length {j} at this batch size: timing it"
        j = best
        if (j != full or g <= 1.0) and self.since_full >= self.probe:
            return full, f"probe at draft length {full} after {self.since_full} steps (best: length {j}, x{g:.2f})"
        if g > 1.0:
            if self.since_plain >= self.plain_probe:
                return 0, f"probe: a plain step after {self.since_plain} steps (best: length {j}, x{g:.2f})"
            return j, f"draft length {j}: expected gain x{g:.2f}"
        return 0, f"expected gain x{g:.2f} <= 1 (best draft length {j})"

    def draft_pays(self, rows: int) -> bool:
        """Whether speculation would pay at this padded size if every row had its draft (the engine admits a row with
        its draft then): the best timed length's gain at full drafting, or, before both are timed here, whether the
        last choice speculated."""
        g = self.gain(rows, drafting=1.0)
        return self.speculating if g is None else g > 1.0

    def probe_within(self, steps: int) -> bool:
        """Whether a probe of the longest length can fall due in the next `steps` steps (a row that lives no longer is
        not needed as the probes' sentinel)."""
        return self.since_full + steps >= self.probe

    def switched(self, length: int) -> bool:
        """Record the choice made; True when speculation turns on or off (a switch: the engine counts them; a change
        of draft length while speculating is not one)."""
        changed = self.length >= 0 and (length > 0) != (self.length > 0)
        self.length = length
        return changed

    @property
    def speculating(self) -> bool:
        return self.length != 0

    # --- what happened -----------------------------------------------------------------------------
    def observe_cycle(self, rows: int, seconds: float, accepted: list[int], length: int | None = None) -> None:
        """A speculative cycle of `length` draft positions (default the longest) at `rows` padded rows took
        `seconds`; `accepted` holds each drafting row's count of accepted draft tokens (0 .. length)."""
        length = self.positions if length is None else length
        self.spec[rows, length] = _mean(self.spec.get((rows, length)), seconds)
        self.since_plain += 1
        self._fade()
        for n in accepted:
            for i in range(min(n + 1, length)):  # positions 0..n reached (those the cycle drafted); 0..n-1 accepted
                self.reached[i] += 1
                if i < n:
                    self.accepted[i] += 1
        if length != self.positions:
            self.since_full += 1
            return
        probing, self.since_full = self.since_full > 0, 0
        if probing:  # a probe: did the longest length (or speculation at all) win again?
            g, j = self.gain(rows, length), self.best(rows)
            won = g is not None and g > 1.0 and j is not None and j[0] == length
            self.probe = MIN_PROBE if won else min(2 * self.probe, self.probe_ceiling(rows))

    def observe_catch_up(self, rows: int, seconds: float) -> None:
        """The draft's catch-up before a cycle at `rows` padded rows took `seconds` (device time included)."""
        self.catch_up[rows] = _mean(self.catch_up.get(rows), seconds)

    def probe_ceiling(self, rows: int) -> int:
        """The longest interval between probes at this padded size: MAX_PROBE, or more where a probe (a catch-up, and
        a cycle of the longest length in place of a plain step) costs more than PROBE_SHARE of MAX_PROBE plain steps:
        the steps that make it PROBE_SHARE, up to LONGEST_PROBE."""
        plain, catch = self.plain.get(rows), self.catch_up.get(rows)
        if not plain or catch is None:
            return MAX_PROBE
        cost = catch + max(0.0, self.spec.get((rows, self.positions), plain) - plain)
        return int(min(LONGEST_PROBE, max(MAX_PROBE, cost / (PROBE_SHARE * plain))))

    def seed_costs(self, rows: int, plain: float, spec: dict[int, float]) -> None:
        """Costs timed before any step at this padded size (the engine's warm-up): the plain step's and each length's
        cycle's seconds. They count as the first observations: later ones refine them as any others do."""
        self.plain[rows] = plain
        for j, seconds in spec.items():
            self.spec[rows, j] = seconds

    def observe_plain(self, rows: int, seconds: float) -> None:
        self.plain[rows] = _mean(self.plain.get(rows), seconds)
        self.since_full += 1
        self._fade()
        if self.since_plain > 0:  # the first plain step after cycles (a probe, or a switch): did speculation still win?
            g = self.gain(rows)
            self.plain_probe = (
                min(2 * self.plain_probe, self.probe_ceiling(rows)) if g is not None and g > 1.0 else MIN_PROBE
            )
        self.since_plain = 0

    def summary(self) -> dict:
        """The policy's figures, for /server_info and benchmarks: rates, costs (ms) and gains per padded size. Safe
        to call from another thread than the engine's: it reads copies (a dict copy is one step under the GIL)."""
        snap = SpecPolicy(self.positions, self.lengths)  # (its __post_init__ sets the prior: the figures go in after)
        snap.reached, snap.accepted, snap.spec, snap.plain = (
            list(self.reached),
            list(self.accepted),
            dict(self.spec),
            dict(self.plain),
        )
        sizes = sorted({r for r, _ in snap.spec} | set(snap.plain))
        return {
            "rates": [round(a, 4) for a in snap.rates()],
            "lengths": list(snap.lengths),
            "sizes": {
                str(r): {
                    "plain_ms": _ms(snap.plain.get(r)),
                    "cycle_ms": {str(j): _ms(snap.spec.get((r, j))) for j in snap.lengths},
                    "best_length": (snap.best(r) or (None,))[0],
                    "gain": _round(snap.gain(r)),
                }
                for r in sizes
            },
        }

    def _fade(self) -> None:
        k = 0.5 ** (1 / HALF_LIFE)
        self.reached = [r * k for r in self.reached]
        self.accepted = [a * k for a in self.accepted]


def _mean(old: float | None, new: float) -> float:
    """The running cost: a faster time is taken at once, a slower one by COST_MEAN. A step's wall time is its work plus
    whatever else held the machine (another process, a first call's set-up), never less than its work, so one slow
    sample must not decide the next hundred steps (a first timing that catches a set-up would keep a paying draft off
    until the probes' back-off lets it back)."""
    if old is None or new <= old:
        return new
    return (1 - COST_MEAN) * old + COST_MEAN * new


def _ms(s: float | None) -> float | None:
    return None if s is None else round(1000 * s, 4)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
