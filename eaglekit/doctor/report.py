"""The doctor's typed results: findings, one row per probed wiring, and the report (to_json for the CLI).

The JSON shape is the one `eaglekit doctor --json` has printed since the first version (verdict, fault,
findings, probe, probe_prompts, trace, profile_ms, seconds), extended with `conclusive`, each finding's
`evidence`, each probe row's paired comparison with the configured wiring, `fingerprint` and `rounds`, and
the `status` (clean / fault / cannot_tell, or could_not_run where a file of the pair could not be read), its
`exit_code`, when it cannot tell `decide` (what would decide it), and `pair`: what ran (the target's backend,
device, dtype, and the products kind with the reason it was chosen).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import EaglekitError


@dataclass
class Finding:
    code: str
    severity: str  # error | warning | info
    message: str
    fix: str | None = None
    evidence: dict = field(default_factory=dict)

    @classmethod
    def of(cls, e: EaglekitError, severity: str = "error") -> Finding:
        return cls(e.code, severity, e.message, e.fix)


@dataclass
class WiringRow:
    """One wiring's teacher-forced acceptance over the probe, and its paired comparison with the configured one
    over the same positions: `diff` = the configured wiring's mean accepted run per position minus this one's
    (positive: the configured wiring is better), `se` its standard error (clustered by sequence: positions of
    one sequence are not independent), `z` = diff / se; `only_configured` / `only_this` count the positions
    accepted at position 1 by one wiring and not the other (McNemar's discordant pairs)."""

    wiring: str
    after_layers: list[int]
    refused: str | None = None
    accept_length: float | None = None  # simulated, SGLang scale
    per_position: list[float] | None = None
    positions: int | None = None
    mean_run: float | None = None
    diff: float | None = None
    se: float | None = None
    z: float | None = None
    only_configured: int | None = None
    only_this: int | None = None
    decided: bool | None = None  # |z| >= Z: this probe tells it apart from the configured wiring
    decoded_accept_length: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


# exit status of `eaglekit doctor`: 0 clean, 1 a fault found, 2 the doctor could not run, 3 cannot tell
EXIT = {"clean": 0, "fault": 1, "could_not_run": 2, "cannot_tell": 3}

# the codes that say a file of the pair could not be read at all (missing, truncated, not JSON, not a draft, a field
# of the wrong type): the doctor then says nothing of the wiring, and it is the same "could not run" for the draft
# as for the target. A pair whose files read but do not fit (E107: the weights against the config, E2xx) is a fault.
UNREADABLE = frozenset(
    {
        "E101",
        "E102",
        "E105",
        "E106",
        "E110",
        "E112",
        "E116",
        "E117",
        "E118",
        "E150",
        "E151",
        "E152",
        "E153",
        "E154",
        "E155",
    }
)


def unreadable(findings) -> list:
    """The error findings (Finding or its JSON) that say a file of the pair could not be read."""

    def get(f, k):
        return f.get(k) if isinstance(f, dict) else getattr(f, k)

    return [f for f in findings if get(f, "severity") == "error" and get(f, "code") in UNREADABLE]


def status_of(fault: bool, conclusive: bool) -> str:
    """The three verdicts: a fault found; clean only when the evidence shows the configured pair right; else
    cannot tell (never reported as clean)."""
    return "fault" if fault else "clean" if conclusive else "cannot_tell"


@dataclass
class DoctorReport:
    verdict: str
    fault: bool
    conclusive: bool
    findings: list[Finding] = field(default_factory=list)
    probe: list[WiringRow] = field(default_factory=list)
    probe_prompts: str | None = None
    trace: list[dict] = field(default_factory=list)
    profile_ms: dict = field(default_factory=dict)
    fingerprint: list[dict] | None = None
    rounds: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    decide: list[str] = field(default_factory=list)  # cannot tell: what would decide it
    # what ran: {"target_backend", "device", "dtype", "products": {"kind", "reason"} or None before the draft loaded}
    pair: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "could_not_run" if unreadable(self.findings) else status_of(self.fault, self.conclusive)

    @property
    def exit_code(self) -> int:
        return EXIT[self.status]

    def to_json(self) -> dict:
        status = self.status
        verdict = self.verdict if status != "could_not_run" else f"doctor could not run: {self.verdict}"
        out = {
            "status": status,
            "exit_code": self.exit_code,
            "decide": self.decide,
            "verdict": verdict,
            "fault": status == "fault",
            "conclusive": self.conclusive and status != "could_not_run",
            "pair": self.pair,
            "findings": [asdict(f) for f in self.findings],
            "probe": [r.to_json() for r in self.probe],
            "probe_prompts": self.probe_prompts,
            "trace": self.trace,
            "profile_ms": self.profile_ms,
            "rounds": self.rounds,
            "seconds": self.seconds,
        }
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        return out
