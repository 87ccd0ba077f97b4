"""The shipped demo pair: present, within the size limits, lossless, and actually accepting."""

import json
from pathlib import Path

import pytest
import torch

from eaglekit.cli import main
from eaglekit.demo import ASSETS


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    """The demo keeps its chain pick under the user's cache dir: here the test's own, never the real home."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_pair_files_fit_the_repository_limits():
    files = [p for p in ASSETS.rglob("*") if p.is_file()]
    assert all(p.stat().st_size < 16 * 2**20 for p in files)
    assert sum(p.stat().st_size for p in files) < 40 * 2**20
    corpus = json.loads((ASSETS / "corpus.json").read_text())
    held = set(corpus["heldout"]["files"])
    assert held and not held & set(corpus["train"]["files"])  # held-out files were never trained on
    assert len(corpus["train"]["sha256"]) == 64


def test_the_processor_names_the_kernels_when_capped(monkeypatch):
    """The demo's table names the CPU and its instruction set, and the level torch's kernels run at when it is below
    the CPU's (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine: the README's AVX2 figures were measured so)."""
    from eaglekit import demo

    cpuinfo = "model name\t: Some EPYC\nflags\t\t: fpu sse avx2 avx512f\n"
    monkeypatch.setattr(demo.Path, "read_text", lambda self, *a, **k: cpuinfo)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert demo.processor_name(torch.device("cpu")) == "Some EPYC (AVX-512)"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert demo.processor_name(torch.device("cpu")) == "Some EPYC (AVX-512; torch's kernels AVX2)"
    cpuinfo = cpuinfo.replace("avx512f", "amx_tile avx512f")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert demo.processor_name(torch.device("cpu")) == "Some EPYC (AMX)"


def test_demo_json(capsys, monkeypatch, tmp_path):
    from eaglekit.tune import chainpick

    # the timing rounds generate 12 tokens here, not 24, within the smallest budget (2 s: one round past it):
    # the test checks that the pick follows its measurements, not how well so few rank the chains
    cycle_ratios = chainpick.cycle_ratios
    monkeypatch.setattr(chainpick, "cycle_ratios", lambda *a, **k: cycle_ratios(*a, **{**k, "tokens": 12}))
    args = ["demo", "--prompts", "2", "--max-new-tokens", "24", "--json", "--pick-budget", "2"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"accept_length", "per_position", "baseline_tokens_per_s", "eagle_tokens_per_s", "speedup",
            "identical"} <= res.keys()
    assert res["identical"] is True and res["baseline_rows"] == 1  # float32 on a CPU: the plain decode is the check
    assert res["processor"] and res["processor"] != "?"  # the CPU model: the speedup depends on it
    assert res["accept_length"] > 1.5  # a trained draft, not random weights
    assert len(res["per_position"]) == res["tree"]["steps"]
    # on a CPU, with no tree given, the chain is picked here: the fastest of the measured candidates
    picked = res["tree"]["picked"]
    assert [c["steps"] for c in picked["candidates"]] == [2, 3, 4, 5, 6] and res["tree"]["topk"] == 1
    best = max(picked["candidates"], key=lambda c: c["speedup"])
    assert res["tree"]["steps"] == best["steps"] == picked["chain"] and res["tree"]["draft_tokens"] == best["steps"] + 1
    assert picked["why"].startswith(f"chain {best['steps']}:") and picked["rounds"] >= 1 and picked["seconds"] > 0
    assert picked["cached"] is False and picked["budget_s"] == 2.0
    # ...and kept for this machine under the cache dir (the test's own: XDG_CACHE_HOME), with what it predicted
    assert picked["cache_file"] == str(tmp_path / "cache" / "eaglekit" / "chain_pick.json")
    chk = res["pick_check"]
    assert chk["predicted_speedup"] == picked["speedup"] and chk["achieved_speedup"] == res["speedup"]
    assert chk["achieved_tokens_per_s"] == res["eagle_tokens_per_s"] and isinstance(chk["far_below"], bool)
    assert res["load_average"]["cores"] >= 1
    if res["threads_pick"]:  # (more than one thread to choose from)
        assert res["threads"] == res["threads_pick"]["threads"] and len(res["threads_pick"]["step_ms"]) == 2
    assert res["compiled"] is False and res["warm_up_s"] >= 0  # the CPU default: uncompiled
    # and the products' path is chosen here too, by timing a step and a verify with each candidate
    pick = res["products_pick"]
    assert res["products"] == pick["products"] == min(pick["ms"], key=lambda k: sum(pick["ms"][k]))
    assert "aten" in pick["ms"] and all(a > 0 and b > 0 for a, b in pick["ms"].values())
    # ...and the choice is reported with its reason (eaglekit.kernels.products.choose), and the decoder that ran
    assert res["products_choice"]["kind"] == res["products"] and "timed here" in res["products_choice"]["reason"]
    assert res["backend"] == "ours"
    # a second run on this machine reuses the pick, and says so (the key holds the thread count and the products,
    # which are timed each run: a run that chose others picks anew)
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    if (again["threads"], again["products"]) == (res["threads"], res["products"]):
        cached = again["tree"]["picked"]
        assert cached["cached"] is True and cached["chain"] == picked["chain"] == again["tree"]["steps"]
        assert cached["seconds"] == picked["seconds"] and cached["picked_at"]
        assert again["pick_check"]["predicted_speedup"] == picked["speedup"]


def test_repick_needs_a_chain_to_pick(capsys):
    assert main(["demo", "--steps", "3", "--topk", "1", "--repick"]) == 2  # (before anything loads)
    assert "E316" in capsys.readouterr().err


def test_the_table_says_where_the_pick_came_from_and_how_the_run_met_it(capsys, monkeypatch):
    from eaglekit.demo import print_demo

    monkeypatch.setenv("COLUMNS", "400")  # (rich wraps a cell's text at the terminal's width)
    cand = [{"steps": n, "accept_length": 2.0 + n / 4, "cycle_steps": 1 + n / 5, "speedup": 1.5, "tokens_per_s": 90.0}
            for n in (2, 3, 4, 5, 6)]
    picked = {"chain": 2, "by": "model", "seconds": 14.2, "budget_s": 20.0, "prompts": 32, "model_prompts": 16,
              "rounds": 5, "speedup": 1.8, "tokens_per_s": 90.0, "baseline_tokens_per_s": 50.0, "candidates": cand,
              "why": "chain 2: accept length 2.36 over a cycle of 1.31 target steps = 1.80x predicted", "cached": False}
    res = {"prompts": 32, "new_tokens": 4096, "device": "cpu", "processor": "P", "threads": 1,
           "threads_pick": {"threads": 1, "step_ms": {"2": 300.0, "1": 20.0}}, "tree": {
               "steps": 2, "topk": 1, "draft_tokens": 3, "picked": picked}, "baseline_tokens_per_s": 18.4,
           "eagle_tokens_per_s": 19.9, "speedup": 1.08, "accept_length": 2.3, "per_position": [0.7, 0.5],
           "identical": True, "warm_up_s": 0.3, "load_average": {"start": 4.1, "end": 4.3, "cores": 2},
           "pick_check": {"predicted_speedup": 1.8, "achieved_speedup": 1.08, "predicted_tokens_per_s": 90.0,
                          "achieved_tokens_per_s": 19.9, "predicted_baseline_tokens_per_s": 50.0,
                          "achieved_baseline_tokens_per_s": 18.4, "achieved_over_predicted": 0.6, "far_below": True}}
    print_demo(res)
    out = " ".join(capsys.readouterr().out.split())
    assert "picked on this machine in 14 s of a 20 s budget" in out and "16/32 prompts" in out
    assert "1 thread (the faster target step here now: 300.0 ms with 2, 20.0 ms with 1)" in out
    assert "FAR BELOW" in out and "60% of the prediction" in out and "load average 4.1" in out
    picked.update(cached=True, picked_at="2026-12-04 05:00:00", cache_file="/c/chain_pick.json")
    res["pick_check"].update(achieved_over_predicted=0.95, far_below=False)
    print_demo(res)
    out = " ".join(capsys.readouterr().out.split())
    assert "from its cache /c/chain_pick.json" in out and "--repick" in out and "(cached)" in out
    assert "95% of the prediction" in out and "FAR BELOW" not in out
    # the products that ran, on a line of their own with the chooser's reason
    res["products_choice"] = {"kind": "onednn", "reason": "timed here (a step + a 6-row verify): aten 9.0 + 20.0 ms"}
    print_demo(res)
    lines = [" ".join(x.split()) for x in capsys.readouterr().out.splitlines()]
    assert "products: onednn (timed here (a step + a 6-row verify): aten 9.0 + 20.0 ms)" in lines


def test_demo_table(capsys):
    assert main(["demo", "--prompts", "1", "--max-new-tokens", "16", "--steps", "3", "--topk", "1"]) == 0
    out = capsys.readouterr().out
    assert "with EAGLE-3" in out and "speedup" in out and "identical" in out
    assert "picked" not in out and "uncompiled layers" in out  # a given tree is run as given
    assert "products: " in out and "a 6-row verify" in out  # the products' path, and what chose it
    line = next(x for x in out.splitlines() if x.startswith("products: "))
    assert line.split()[1] in ("aten", "onednn") and "(timed here" in line


def test_compile_flags_are_checked():
    from eaglekit.errors import InputError
    from eaglekit.options import ModelOptions, PairRuntime
    from eaglekit.pair import compiled, load_pair

    assert ModelOptions().compile_mode == "auto" and ModelOptions(no_compile=True).compile_mode == "off"
    with pytest.raises(InputError, match="contradict"):
        ModelOptions(compile=True, no_compile=True).compile_mode  # noqa: B018 -- the property raises
    with pytest.raises(InputError, match="not one of auto, on, off"):
        load_pair(ASSETS / "target", None, device="cpu", run=PairRuntime(compile="maybe"))
    t, _ = load_pair(ASSETS / "target", None, device="cpu")
    assert not compiled(t)  # 'auto' compiles on a GPU only


def test_recipe_tiny_end_to_end(tmp_path, capsys):
    """The recipe that built the shipped pair, at toy scale: every stage runs and the pair decodes."""
    out = tmp_path / "r"
    assert main(["recipe", "demo", "--out", str(out), "--preset", "tiny", "--device", "cpu"]) == 0
    for f in ("corpus.json", "target/config.json", "target/tokenizer.json", "draft/config.json", "prompts.jsonl",
              "eval.json", "recipe.json"):
        assert (out / f).is_file(), f
    ev = json.loads(Path(out / "eval.json").read_text())
    assert all(v["identical_to_baseline"] for v in ev.values())
    capsys.readouterr()
    assert main(["demo", "--target", str(out / "target"), "--draft", str(out / "draft"), "--prompt-file",
                 str(out / "prompts.jsonl"), "--prompts", "1", "--max-new-tokens", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"]


def test_compile_comes_after_the_thread_pick(capsys, monkeypatch):
    """`demo --compile` on a CPU picks the thread count with the layers uncompiled and compiles after it: compiled CPU
    code holds one thread count, and the pick's steps at the other would compile it a second time."""
    from eaglekit.draft.model import Eagle3Draft
    from eaglekit.models.llama import LlamaTarget
    from eaglekit.tune import chainpick

    torch.set_num_threads(max(2, torch.get_num_threads()))  # (the pick runs where there is a count to choose)
    order = []

    def pick(target, draft, prompt, counts, **kw):
        order.append(("pick", target.net.compiled_layer is None, draft.compiled_layer is None))
        return {"threads": counts[0], "step_ms": {}, "seconds": 0.0}

    monkeypatch.setattr(chainpick, "pick_threads", pick)
    monkeypatch.setattr(LlamaTarget, "compile", lambda self, options=None: order.append(("target",)))
    monkeypatch.setattr(Eagle3Draft, "compile", lambda self, options=None: order.append(("draft",)))
    args = ["demo", "--prompts", "1", "--max-new-tokens", "4", "--steps", "2", "--topk", "1", "--compile", "--json"]
    assert main(args) == 0
    json.loads(capsys.readouterr().out)
    assert order == [("pick", True, True), ("target",), ("draft",)]
