"""`eaglekit trace diff` on traces written by eaglekit itself (fast; the vLLM side is in test_vllm.py)."""

import json

import pytest
import torch

from eaglekit.cli import main
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import new_draft
from eaglekit.models import load_target
from eaglekit.observe import trace
from eaglekit.observe.tracediff import diff


def _trace(path, target, draft, capture, prompt, k=3):
    trace.configure(enabled=True, file=str(path), stream=open("/dev/null", "w"))
    try:
        Decoder(target, draft, TreeShape.make(k, 1, k + 1), capture=capture,
                allow_other_target=True).generate(prompt, 12)
    finally:
        trace.configure(enabled=False)


@pytest.fixture(scope="module")
def pair(model_dirs):
    t = load_target(model_dirs["llama"])
    return t, new_draft(t, seed=3)


def test_same_run_agrees_and_a_shifted_capture_parts_at_the_capture(pair, tmp_path, capsys):
    t, d = pair
    prompt = list(range(3, 20))
    spec = d.config.capture
    _trace(tmp_path / "a.jsonl", t, d, spec, prompt)
    _trace(tmp_path / "b.jsonl", t, d, spec, prompt)
    _trace(tmp_path / "c.jsonl", t, d, spec.shifted(-1), prompt)
    assert main(["trace", "diff", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "agree" in out and "in full" in out
    assert main(["trace", "diff", str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl")]) == 1
    out = capsys.readouterr().out
    lo = list(spec.after_layers)
    assert f"PART at cycle 0 target.capture (the target capture): layers (after_layers) {lo} vs " \
           f"{[i - 1 for i in lo]}" in out


def test_statistics_beyond_tolerance_part_and_chunked_prefill_is_merged(pair, tmp_path):
    t, d = pair
    _trace(tmp_path / "a.jsonl", t, d, d.config.capture, list(range(3, 20)))
    recs = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    # B: the same records, the prefill capture split in two chunks (as vLLM's chunked prefill would) -> agree
    cap = next(r for r in recs if r["point"] == "target.capture" and r["cycle"] == 0)
    feats = torch.randn(cap["shape"][0], cap["shape"][1], generator=torch.Generator().manual_seed(0))
    s_all, s1, s2 = trace.stats(feats), trace.stats(feats[:7]), trace.stats(feats[7:])
    a = [dict(r, **s_all) if r is cap else r for r in recs]
    b = []
    for r in a:
        if r["point"] == "target.capture" and r["cycle"] == 0:
            b += [dict(r, **s1, tokens=7), dict(r, **s2, cycle=1, tokens=cap["shape"][0] - 7)]
        else:  # the draft runs after the last chunk: everything after moves one cycle on
            b.append(dict(r, cycle=r["cycle"] + 1))
    for name, rs in (("a", a), ("b", b)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rs))
    res = diff(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert res["agree"] and "2 chunks" in res["merged"], res
    assert [0, "draft.input.fc"] in res["pairs"] and [1, "target.capture"] in res["pairs"]
    # C: one statistic off by 1% at a draft point of cycle 0 -> parts there, naming the field
    c = [dict(r, std=r["std"] * 1.01) if r["point"] == "draft.input.fc" and r["cycle"] == 0 else r for r in a]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in c))
    res = diff(tmp_path / "a.jsonl", tmp_path / "c.jsonl")
    assert not res["agree"] and res["first"]["point"] == "draft.input.fc" and res["first"]["cycle"] == 0
    assert res["first"]["differences"][0].startswith("std ")


def test_unreadable_trace_exits_2(tmp_path, capsys):
    (tmp_path / "x.jsonl").write_text("not json\n")
    assert main(["trace", "diff", str(tmp_path / "x.jsonl"), str(tmp_path / "x.jsonl")]) == 2
    assert "E105" in capsys.readouterr().err
