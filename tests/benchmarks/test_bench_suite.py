"""The benchmark suite's plumbing (benchmarks/): the registry lists its suites, a result is written in the one schema
and read back, compare and table print two results side by side and one as markdown, and a tiny case runs end to
end through the command line. Timings are not checked: only that they are there, in their units."""

import json

import pytest

from benchmarks import registry, schema
from benchmarks.__main__ import main
from benchmarks.report import compare_lines, markdown_table


def _result(speedup: float) -> dict:
    res = schema.new_result("cpu-demo", "a test")
    res["cases"].append({"case": "demo-decode", "params": {"prompts": 2},
                         "metrics": {"speedup": schema.stats([speedup, speedup * 1.1, speedup * 0.9], "x"),
                                     "tokens_per_s": schema.value(100.0, "tok/s")},
                         "identity": {"greedy_output_equals_target": True}})
    return res


def test_the_registry_lists_the_suites():
    registry.load()
    for name in ("cpu-demo", "cpu-cycle", "h200", "h200-batch", "cpu-serve-demo", "h200-serve-demo",
                 "cpu-policy-burst", "cpu-poison"):
        assert name in registry.SUITES
        for case, _ in registry.SUITES[name].cases:
            assert case in registry.CASES


def test_stats_and_the_schema_round_trip(tmp_path):
    m = schema.stats([3.0, 1.0, 2.0, 4.0, 5.0], "ms")
    assert (m["median"], m["n"], m["unit"]) == (3.0, 5, "ms")
    assert 1.0 <= m["p10"] <= m["median"] <= m["p90"] <= 5.0
    res = _result(1.5)
    for key in ("cpu", "torch", "transformers", "gpu"):
        assert key in res["machine"]
    path = schema.write(tmp_path / "r.json", res)
    back = schema.read(path)
    assert back == json.loads(json.dumps(res))
    assert back["schema"] == "eaglekit-bench/1" and back["cases"][0]["metrics"]["speedup"]["median"] == 1.5


def test_files_of_other_shapes_are_refused(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"baseline_8b": {"tokens_per_s": 200}}))
    with pytest.raises(schema.SchemaError, match="not an eaglekit-bench/1 result"):
        schema.read(p)
    bad = _result(1.0)
    del bad["cases"][0]["metrics"]["speedup"]["p90"]
    with pytest.raises(schema.SchemaError, match="p90"):
        schema.validate(bad)


def test_compare_and_table(tmp_path, capsys):
    a, b = _result(1.5), _result(1.8)
    lines = "\n".join(compare_lines(a, b))
    assert "speedup" in lines and "1.200" in lines  # B / A of the medians
    md = markdown_table(a, link="benchmarks/results/x.json")
    assert "| [demo-decode](benchmarks/results/x.json) | speedup (x) | 1.5 |" in md
    schema.write(tmp_path / "a.json", a)
    schema.write(tmp_path / "b.json", b)
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert "1.200" in capsys.readouterr().out


def test_a_tiny_case_runs_through_the_command_line(tmp_path):
    out = tmp_path / "cycle.json"
    rc = main(["run", "cpu-cycle", "--quick", "--out", str(out), "--param", "reps=2", "--param", "shapes=3,1,4",
               "--param", "products=aten", "--param", "context=16", "--notes", "test"])
    assert rc == 0
    res = schema.read(out)
    (c,) = res["cases"]
    assert c["case"] == "demo-cycle" and "error" not in c
    assert c["metrics"]["step_ms"]["n"] == 2 and c["metrics"]["cycle_ms_3_1_4"]["unit"] == "ms"
    assert res["notes"] == "test" and res["command"].endswith("--notes test")


@pytest.mark.slow
def test_the_served_pair_case_runs_three_servers(tmp_path):
    """serve-demo end to end on the smallest load: three real servers (no draft, the demo draft, an untrained
    draft), every request answered, each draft's ratio to no draft and its plain-step share reported. (Four requests
    of 48 tokens: the demo draft's first few tokens after a prompt are rarely accepted, and a policy that has seen only
    those switches it off, as it should, probing again after 16 steps, then 32; two requests of 32 tokens left the
    draft 3 probe cycles, all rejected, in half the runs.)"""
    out = tmp_path / "serve.json"
    rc = main(["run", "cpu-serve-demo", "--quick", "--out", str(out), "--param", "concurrency=1", "--param",
               "num_prompts=4", "--param", "max_tokens=48"])
    assert rc == 0
    (c,) = schema.read(out)["cases"]
    assert "error" not in c, c.get("error")
    m = c["metrics"]
    for v in ("no_draft", "draft", "random_draft"):
        assert m[f"failed_c1_{v}"]["median"] == 0 and m[f"output_tok_s_c1_{v}"]["median"] > 0
    for v in ("draft", "random_draft"):
        assert m[f"speedup_c1_{v}"]["unit"] == "x" and 0 <= m[f"plain_share_c1_{v}"]["median"] <= 1
    assert m["accept_length_c1_draft"]["median"] > 1  # the trained draft's tokens were accepted
    assert "profile" not in c["details"] and not any(k.startswith("engine_busy_share") for k in m)  # (profile off)
    # `variants` leaves servers out (no_draft stays: every ratio's base); `profile` keeps each level's profile
    rc = main(["run", "cpu-serve-demo", "--quick", "--out", str(out), "--param", "concurrency=1", "--param",
               "num_prompts=2", "--param", "max_tokens=8", "--param", "variants=no_draft,random_draft", "--param",
               "profile=true"])
    assert rc == 0
    (c,) = schema.read(out)["cases"]
    assert "error" not in c, c.get("error")
    m = c["metrics"]
    assert "speedup_c1_random_draft" in m and not any(k.endswith("_c1_draft") for k in m)
    assert set(c["details"]["rounds"]) == set(c["details"]["profile"]) == {"no_draft", "random_draft"}
    (prof,) = c["details"]["profile"]["random_draft"]["c1"]  # (one round)
    assert prof["prefills"] >= 2 and prof["loop_ms"]["in_step"] > 0 and prof["wall_ms"]["prefill"] > 0
    for v in ("no_draft", "random_draft"):
        assert 0 < m[f"engine_busy_share_c1_{v}"]["median"] <= 1.05  # (the level's clock is the client's)
        assert 0 < m[f"prefill_wall_share_c1_{v}"]["median"] <= 1
    assert 0 < m["policy_seen_share_c1_random_draft"]["median"] <= 1 and "policy_seen_share_c1_no_draft" not in m


@pytest.mark.slow
def test_the_policy_burst_case_loads_the_machine_then_times_the_quiet_requests(tmp_path):
    """policy-burst on its smallest load: the busy processes come and go (none is left running), each draft's ratio
    to no draft and its share of cycles are reported, and the policy's figures are kept beside them."""
    out = tmp_path / "burst.json"
    rc = main(["run", "cpu-policy-burst", "--quick", "--out", str(out), "--param", "burst=1", "--param", "timed=1",
               "--param", "hogs=1", "--param", "new_tokens=8"])
    assert rc == 0
    (c,) = schema.read(out)["cases"]
    assert "error" not in c, c.get("error")
    m = c["metrics"]
    for v in ("draft", "random_draft"):
        assert m[f"speedup_{v}"]["unit"] == m[f"speedup_cpu_time_{v}"]["unit"] == "x"
        assert 0 <= m[f"cycle_share_{v}"]["median"] <= 1
    assert set(c["details"]["policy"]) == {"draft", "random_draft"}
    from pathlib import Path

    cmdlines = []
    for f in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmdlines.append(f.read_bytes())
        except OSError:  # (a process that ended while listed)
            pass
    assert not any(b"while True: pass" in x for x in cmdlines)


def test_the_prefill_split_times_each_part_of_a_served_prefill(tmp_path):
    """prefill-split (--quick): for each prompt length, an admit with and without the draft and the target's forward
    with and without the capture and the draft's extend alone, n samples each, and the profiled admit's aten calls."""
    out = tmp_path / "prefill.json"
    rc = main(["run", "cpu-prefill", "--quick", "--out", str(out), "--param", "lengths=3,9"])
    assert rc == 0
    (c,) = schema.read(out)["cases"]
    assert "error" not in c, c.get("error")
    m = c["metrics"]
    for T in (3, 9):
        for part in ("admit_draft", "admit_no_draft", "target_capture", "target_plain", "draft_extend"):
            assert m[f"{part}_ms_T{T}"]["n"] == 5 and m[f"{part}_ms_T{T}"]["median"] > 0
        assert m[f"admit_aten_calls_T{T}"]["median"] > 100  # (the demo target's 12 layers, op by op)
        assert f"admit_kernels_T{T}" not in m  # (kernels are counted on a GPU only)
    assert set(c["details"]["profile"]) == {"T3", "T9"}
