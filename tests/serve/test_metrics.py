"""ServerMetrics: the spec-decode counters follow the engine's cumulative spec_stats, whatever mix of plain steps,
cycles and switches came between two calls."""

import random

from eaglekit.serve.bench import parse_prometheus
from eaglekit.serve.metrics import ServerMetrics


def _totals(m: ServerMetrics) -> dict:
    out = {}
    for (name, labels), v in parse_prometheus(m.exposition().decode()).items():
        extra = tuple((k, x) for k, x in labels if k not in ("model_name", "engine"))
        out[(name, extra)] = v
    return out


def test_spec_counters_equal_the_engines_cumulative_stats():
    rng = random.Random(0)
    m = ServerMetrics("demo", speculative=True, positions=3)
    st = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": [0, 0, 0],
          "switches_to_spec": 0, "switches_to_plain": 0, "plain_steps": 0, "spec_cycles": 0,
          "cycles_by_length": {1: 0, 2: 0, 3: 0}}
    for _ in range(400):
        # the engine's own bookkeeping (decoding.engine): a step is a plain step or a cycle over 1-4 drafting rows,
        # and the scheduler reads the stats after some steps only (several steps may pass between two calls)
        if rng.random() < 0.7:
            st["plain_steps"] += 1
        else:
            j = rng.choice((1, 2, 3))
            st["spec_cycles"] += 1
            st["cycles_by_length"][j] += 1
            for _ in range(rng.randint(1, 4)):
                n = rng.randint(0, j)
                st["num_drafts"] += 1
                st["num_draft_tokens"] += j
                st["num_accepted_tokens"] += n
                for i in range(n):
                    st["accepted_per_pos"][i] += 1
        if rng.random() < 0.05:
            st["switches_to_spec" if rng.random() < 0.5 else "switches_to_plain"] += 1
        if rng.random() < 0.6:
            m.observe_spec(st)
    m.observe_spec(st)
    got = _totals(m)
    assert got["eaglekit:spec_plain_steps", ()] == st["plain_steps"]
    assert got["vllm:spec_decode_num_drafts", ()] == st["num_drafts"]
    assert got["vllm:spec_decode_num_draft_tokens", ()] == st["num_draft_tokens"]
    assert got["vllm:spec_decode_num_accepted_tokens", ()] == st["num_accepted_tokens"]
    for i, v in enumerate(st["accepted_per_pos"]):
        assert got["vllm:spec_decode_num_accepted_tokens_per_pos", (("position", str(i)),)] == v
    for to in ("spec", "plain"):
        assert got["eaglekit:spec_switches", (("to", to),)] == st[f"switches_to_{to}"]
    for j, n in st["cycles_by_length"].items():
        assert got["eaglekit:spec_cycles", (("length", str(j)),)] == n
    assert abs(got["sglang:spec_accept_length", ()] - (1 + st["num_accepted_tokens"] / st["num_drafts"])) < 1e-9


def test_a_server_without_a_draft_has_no_spec_counters():
    m = ServerMetrics("demo", speculative=False)
    m.observe_spec({"plain_steps": 5, "num_drafts": 0})
    assert not any(name.startswith(("vllm:spec_decode", "eaglekit:spec_")) for name, _ in _totals(m))
