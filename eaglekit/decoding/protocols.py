"""What a server drives, as a type: `Engine` is what eaglekit.serve reads and calls, met by BatchEngine and by
serve.lockstep.Lockstep around one (every tensor-parallel rank takes the same step). The server reads these members
directly instead of probing for them; `missing(engine)` names what an object lacks, so that a stand-in handed to
build_app fails at once with the member named, not at its first request."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Engine(Protocol):
    spec_stats: dict | None  # the speculation counters (EngineStats.spec; /metrics and /server_info); None: none kept
    synthetic: float | None  # the synthetic acceptance rate (benchmark mode); None: real acceptance
    policy: object | None  # the speculation policy (adaptive.SpecPolicy: its summary() for /server_info); None: off
    shape: object  # the draft tree (tree.TreeShape)
    spec_max_batch: int  # above this many running rows, plain steps

    @property
    def has_work(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    def validate(self, req) -> None: ...

    def add(self, req): ...

    def cancel(self, rid: str) -> None: ...

    def step(self) -> list: ...

    def profile(self, since: dict | None = None) -> dict | None: ...


MEMBERS = (
    "spec_stats",
    "synthetic",
    "policy",
    "shape",
    "spec_max_batch",
    "has_work",
    "num_running",
    "num_waiting",
    "validate",
    "add",
    "cancel",
    "step",
    "profile",
)


def missing(engine) -> list[str]:
    """The members of Engine that `engine` lacks (empty: it is one)."""
    return [m for m in MEMBERS if not hasattr(engine, m)]
