"""The engine's counters: speculation statistics (what /metrics and /server_info report, vLLM's names), the
profiler's phase times (observe.profile.Profiler: CUDA events on a GPU) and the steps' wall time on the host, with the
per-step report of them."""

from __future__ import annotations

from typing import Any

from ..observe.profile import Profiler

# the steps' wall seconds by what each step did (EngineStats.stepped), and the parts of them the speculation policy
# was told (EngineStats.seen: the figures its choice compares)
WALL = ("prefill", "cycle", "plain", "other", "policy_cycle", "policy_plain", "policy_catch_up")


class EngineStats:
    """`spec`: drafts, draft tokens, accepted tokens (in all and per position), cycles (in all and by draft length),
    plain steps and the policy's switches (`positions`: the whole tree's draft length; `lengths`: every length a cycle
    may have); `prefills`: requests admitted (each one prefill); `keeping_plain`: plain steps that captured features
    for a row keeping its draft (the others, in an engine with a draft, ran the quiet step); `profiler`: phase times
    where `profile` is on (`ranges`: torch.profiler / NVTX ranges too); `wall`: the steps' wall seconds (WALL), kept
    where the profiler is on (two clock reads a step, no device synchronisation)."""

    def __init__(self, positions: int, lengths, profile: bool, device, ranges: bool = False):
        self.spec: dict[str, Any] = {
            "num_drafts": 0,
            "num_draft_tokens": 0,
            "num_accepted_tokens": 0,
            "accepted_per_pos": [0] * positions,
            "spec_cycles": 0,
            "plain_steps": 0,
            "switches_to_plain": 0,
            "switches_to_spec": 0,
            "cycles_by_length": {j: 0 for j in sorted(lengths)},
        }
        self.profiler = Profiler(profile, device, ranges=ranges)
        self.prefills = 0
        self.keeping_plain = 0
        self.wall = dict.fromkeys(WALL, 0.0)

    def cycle(self, length: int) -> None:
        """A speculative cycle of `length` draft positions ran."""
        self.spec["spec_cycles"] += 1
        self.spec["cycles_by_length"][length] += 1

    def plain(self, keeping: bool = False) -> None:
        """A plain step ran (one token a row, no draft); `keeping`: it captured features for a row keeping its draft."""
        self.spec["plain_steps"] += 1
        self.keeping_plain += keeping

    def drafted(self, drafted: int, accepted: int) -> None:
        """One drafting row's verify: `drafted` draft tokens proposed, the first `accepted` of them taken."""
        st = self.spec
        st["num_drafts"] += 1
        st["num_draft_tokens"] += drafted
        st["num_accepted_tokens"] += accepted
        for i in range(accepted):
            st["accepted_per_pos"][i] += 1

    def switched(self, to_spec: bool) -> None:
        self.spec["switches_to_spec" if to_spec else "switches_to_plain"] += 1

    def stepped(self, kind: str | None, seconds: float) -> None:
        """One step's wall seconds (BatchEngine.step, under the engine's lock: from its start to its return), under
        what it did: "prefill" (it admitted rows: their prefills; it decoded nothing), "cycle" (a speculative cycle,
        its choice, catch-up and emission included), "plain" (a plain step, its choice and emission included); None:
        "other" (neither: it returned the events of cancelled or earlier admitted requests only)."""
        if self.profiler.enabled:
            self.wall[kind or "other"] += seconds

    def seen(self, kind: str, seconds: float) -> float:
        """`seconds`, the figure the policy is told of a "cycle", a "plain" step or a "catch_up", counted -> seconds
        (for the policy)."""
        if self.profiler.enabled:
            self.wall["policy_" + kind] += seconds
        return seconds

    def reading(self) -> tuple[dict, dict, dict]:
        """-> (each phase's seconds so far, the steps they were spent over, the steps' wall seconds): read under the
        engine's lock."""
        steps = {
            "cycles": self.spec["spec_cycles"],
            "plain_steps": self.spec["plain_steps"],
            "keeping_plain_steps": self.keeping_plain,
            "prefills": self.prefills,
        }
        return self.profiler.totals(), steps, dict(self.wall)

    @staticmethod
    def report(totals: dict, steps: dict, wall: dict, since: dict | None = None) -> dict:
        """The phases' times in ms in all, per step (per speculative cycle, per plain step for `decode`, per request
        for `prefill`, per step of either kind for `host_sync`) and as shares of their total, and the steps' wall time
        in ms (`wall_ms`: WALL); since `since` (an earlier report) where given. On a GPU the phases' times are the
        device's (CUDA events) and the wall time is the host's: a step's wall time holds its device time only where
        the host waits for it (the one host read, a synchronisation), and host work the device never waits on
        (prefill bookkeeping, the choice, emission) shows in the wall time alone."""
        if since is not None:
            steps = {k: v - since[k] for k, v in steps.items()}
            totals = {p: v - since["ms"].get(p, 0.0) / 1e3 for p, v in totals.items()}
            wall = {k: v - since.get("wall_ms", {}).get(k, 0.0) / 1e3 for k, v in wall.items()}
        everything = sum(totals.values()) or 1.0
        # what each phase is counted per: a prefill per admitted request, the host read per step of either kind
        count = {
            "decode": steps["plain_steps"],
            "prefill": steps["prefills"],
            "host_sync": steps["cycles"] + steps["plain_steps"],
        }
        per = {p: count.get(p, steps["cycles"]) for p in totals}
        return {
            **steps,
            "ms": {p: round(1e3 * v, 3) for p, v in totals.items()},
            "ms_per_step": {p: round(1e3 * v / per[p], 4) if per[p] else None for p, v in totals.items()},
            "share": {p: round(v / everything, 4) for p, v in totals.items()},
            "wall_ms": {k: round(1e3 * v, 3) for k, v in wall.items()},
        }
