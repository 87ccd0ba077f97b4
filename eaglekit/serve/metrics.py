"""Prometheus metrics under vLLM's names, so that `vllm bench serve` and existing dashboards read them.

Names, label names and buckets follow vllm/v1/metrics/loggers.py and buckets.py (vLLM 0.32): every series
carries model_name and engine="0" but eaglekit:requests_rejected (model_name and reason: a request it counts never
reached an engine); counters are exposed with the `_total` suffix (prometheus-client adds it), which is the form
`vllm bench serve` parses for the spec-decode counters:

    vllm:spec_decode_num_drafts_total                 verify steps that used a draft
    vllm:spec_decode_num_draft_tokens_total           draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total        draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}

mean accept length = 1 + accepted / drafts (SGLang's scale; also exposed as the gauge sglang:spec_accept_length).
Each server owns its registry (no process-global state), so several apps can live in one test process.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # as vLLM does: no `_created` series beside each counter and histogram

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


_LABELS = ("model_name", "engine")  # every series but eaglekit:requests_rejected carries both


class ServerMetrics:
    def __init__(self, model_name: str, speculative: bool, positions: int = 0):
        self.registry = CollectorRegistry()
        self._lv = (model_name, "0")
        # the exposition lists the series in the order they are made here
        self._add_queue_gauges()
        self._add_request_counters()
        self._add_latency_histograms()
        self.speculative = speculative
        if speculative:
            self._add_spec_metrics(positions)
        self.synthetic = Gauge(
            "eaglekit:synthetic_acceptance_rate",
            "Benchmark mode: the per-position rate at "
            "which draft tokens are accepted regardless of the target (0: off, output is the "
            "target's).",
            _LABELS,
            registry=self.registry,
        ).labels(*self._lv)
        # the engine's cumulative spec_stats at the last observe_spec: counts, a per-position list, a by-length dict
        self._last: dict[str, Any] = {
            "num_drafts": 0,
            "num_draft_tokens": 0,
            "num_accepted_tokens": 0,
            "accepted_per_pos": [],
            "switches_to_spec": 0,
            "switches_to_plain": 0,
            "plain_steps": 0,
            "spec_cycles": 0,
        }

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, [*_LABELS, *extra], registry=self.registry)

    def _add_queue_gauges(self) -> None:
        r, lv = self.registry, self._lv
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", _LABELS, registry=r
        ).labels(*lv)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", _LABELS, registry=r
        ).labels(*lv)

    def _add_request_counters(self) -> None:
        lv = self._lv
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*lv)
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*lv)
        self._success = self._counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        self.rejected = Counter(
            "eaglekit:requests_rejected",
            "Requests refused before reaching the engine.",
            ["model_name", "reason"],
            registry=self.registry,
        )

    def _add_latency_histograms(self) -> None:
        r, lv = self.registry, self._lv
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LABELS,
            buckets=E2E_BUCKETS,
            registry=r,
        ).labels(*lv)

    def _add_spec_metrics(self, positions: int) -> None:
        r, lv = self.registry, self._lv
        self.num_drafts = self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(*lv)
        self.num_draft_tokens = self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(
            *lv
        )
        self.num_accepted = self._counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(
            *lv
        )
        self._per_pos = self._counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", ("position",)
        )
        self.per_pos = [self._per_pos.labels(*lv, str(i)) for i in range(positions)]
        switches = Counter(
            "eaglekit:spec_switches",
            "Times the engine switched speculation on (to=spec) or off (to=plain), by its expected tokens per second.",
            [*_LABELS, "to"],
            registry=r,
        )
        self.switches = {to: switches.labels(*lv, to) for to in ("spec", "plain")}
        self.cycles = Counter(
            "eaglekit:spec_cycles",
            "Speculative cycles run, by draft length (the engine's policy picks the length per step).",
            [*_LABELS, "length"],
            registry=r,
        )
        self.plain_steps = self._counter("eaglekit:spec_plain_steps", "Engine steps decoded without the draft.").labels(
            *lv
        )
        self.accept_length = Gauge(
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding (1 + accepted / drafts).",
            _LABELS,
            registry=r,
        ).labels(*lv)

    def reject(self, reason: str) -> None:
        """A request refused before the engine saw it: bad_request (400) or queue_full (429)."""
        self.rejected.labels(self._lv[0], reason).inc()

    def finished(self, reason: str) -> None:
        """reason: stop | length | abort (vLLM's FinishReason values)."""
        self._success.labels(*self._lv, reason).inc()

    def observe_spec(self, stats: dict) -> None:
        """Add the growth of the engine's cumulative spec_stats since the last call (engine thread, after every step:
        a plain step moves one counter, so only what moved is touched; each inc takes a lock)."""
        if not self.speculative or not stats:
            return
        last = self._last
        plain = stats.get("plain_steps", 0)
        if plain != last["plain_steps"]:
            self.plain_steps.inc(plain - last["plain_steps"])
            last["plain_steps"] = plain
        for to in ("spec", "plain"):
            key = f"switches_to_{to}"
            n = stats.get(key, 0)
            if n != last[key]:
                self.switches[to].inc(n - last[key])
                last[key] = n
        cycles = stats.get("spec_cycles", 0)
        if cycles == last["spec_cycles"] and stats["num_drafts"] == last["num_drafts"]:
            return  # no cycle since the last call: the draft counters stand
        self.num_drafts.inc(stats["num_drafts"] - last["num_drafts"])
        self.num_draft_tokens.inc(stats["num_draft_tokens"] - last["num_draft_tokens"])
        self.num_accepted.inc(stats["num_accepted_tokens"] - last["num_accepted_tokens"])
        pos = list(stats.get("accepted_per_pos") or [])
        while len(self.per_pos) < len(pos):
            self.per_pos.append(self._per_pos.labels(*self._lv, str(len(self.per_pos))))
        for i, v in enumerate(pos):
            self.per_pos[i].inc(v - (last["accepted_per_pos"][i] if i < len(last["accepted_per_pos"]) else 0))
        if stats["num_drafts"]:
            self.accept_length.set(1 + stats["num_accepted_tokens"] / stats["num_drafts"])
        by, last_by = stats.get("cycles_by_length") or {}, last.get("cycles_by_length") or {}
        for j, n in by.items():
            if n != last_by.get(j, 0):
                self.cycles.labels(*self._lv, str(j)).inc(n - last_by.get(j, 0))
        last.update(
            spec_cycles=cycles,
            num_drafts=stats["num_drafts"],
            num_draft_tokens=stats["num_draft_tokens"],
            num_accepted_tokens=stats["num_accepted_tokens"],
            accepted_per_pos=pos,
            cycles_by_length=dict(by),
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
