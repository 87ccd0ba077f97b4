"""The doctor's typed results: findings, one row per probed wiring, and the report (to_json for the CLI).

The JSON shape is the one `eaglekit doctor --json` has printed since the first version (verdict, fault,
findings, probe, probe_prompts, trace, profile_ms, seconds), extended with `conclusive`, each finding's
`evidence`, each probe row's paired comparison with the configured wiring, `fingerprint` and `rounds`, and
the three-way `status` (clean / fault / cannot_tell), its `exit_code` and, when it cannot tell, `decide`: what
would decide it.
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

    @property
    def status(self) -> str:
        return status_of(self.fault, self.conclusive)

    @property
    def exit_code(self) -> int:
        return EXIT[self.status]

    def to_json(self) -> dict:
        out = {"status": self.status, "exit_code": self.exit_code, "decide": self.decide,
               "verdict": self.verdict, "fault": self.fault, "conclusive": self.conclusive,
               "findings": [asdict(f) for f in self.findings], "probe": [r.to_json() for r in self.probe],
               "probe_prompts": self.probe_prompts, "trace": self.trace, "profile_ms": self.profile_ms,
               "rounds": self.rounds, "seconds": self.seconds}
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        return out
