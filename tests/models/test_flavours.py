"""Every draft flavour the engines accept: fc_norm, norm_before_fc, norm_before_residual, norm_output (EAGLE
3.1) and a sliding-window draft layer.

Each is checked three ways: our forward (cached extend and tree step) equals a float64 reference written
from the engines' own code (vLLM llama_eagle3.py / speculators Eagle3DraftModel, not from ours); the draft
decodes losslessly; and it survives a round trip through every layout we write (eaglekit, SGLang,
SpecForge, vLLM speculators) with the names each engine reads.
"""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglekit.capture import CaptureSpec
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import Eagle3Draft, load_draft, new_draft, save_draft
from eaglekit.draft.checkpoint import t2d_from_d2t
from eaglekit.errors import ContractError
from eaglekit.interop.export import export
from eaglekit.interop.inspect import inspect_folder
from eaglekit.models import load_target

FLAVOURS = {
    "fc_norm": dict(fc_norm=True),
    "norm_before_fc": dict(norm_before_fc=True),
    "norm_before_residual": dict(norm_before_residual=True),
    "norm_output": dict(norm_output=True),
    "eagle3.1": dict(fc_norm=True, norm_output=True, norm_before_residual=True),
    "sliding_window": dict(sliding_window=3),
    "both_fc_norms": dict(norm_before_fc=True, fc_norm=True),  # vLLM applies input_norm, then fc_norm
}


@pytest.fixture(scope="module")
def target(model_dirs):
    return load_target(model_dirs["llama"], backend="ours", dtype="float64")


def flavoured(target, seed=0, dvocab=48, **flags) -> Eagle3Draft:
    """A random draft with `flags`, every weight (norms included) random, a reduced vocabulary."""
    base = new_draft(target, capture=CaptureSpec((1, 3, 6)), draft_vocab_size=dvocab)
    d = Eagle3Draft(dataclasses.replace(base.config, **flags))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name == "embed_tokens.weight":
                p.copy_(target.embed_weight().float())
            elif "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        hot = torch.randperm(d.config.vocab_size, generator=g)[:dvocab].sort().values
        d.d2t.copy_(hot - torch.arange(dvocab))
        d.t2d.copy_(t2d_from_d2t(d.d2t, d.config.vocab_size))
    return d.to(torch.float64).eval()


# --- the reference: vLLM's Eagle3LlamaForCausalLM / speculators' Eagle3DraftModel, in float64 -------------
def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference(sd: dict, c, feats, own, ids, pos, inv_freq):
    """Rows of `feats` [T, C*Ht] go through vLLM's combine_hidden_states (input_norm if norm_before_fc,
    then one fc_norm per chunk, then fc); rows where `own` [T] is set take `feats[:, :H]` as the draft's own
    hidden instead. Then the first decoder layer (LlamaDecoderLayer.forward, layer_idx 0) with causal
    attention over these rows at positions `pos`, a key at position k visible from q when q - k < window.
    Returns (hidden fed to the next step, logits). The rope frequencies are the draft's (llama3 scaling is
    not what this file tests) and its angles are taken in float32, as vLLM's rotary cache is; RMSNorm
    statistics are float32 in eaglekit and in the engines, hence the 1e-5 tolerance below."""
    eps, H = c.rms_norm_eps, c.hidden_size
    x = feats
    if c.norm_before_fc:
        x = _rms(x, sd["input_norm.weight"], eps)
    if c.fc_norm:
        chunks = x.chunk(c.num_captures, dim=-1)
        x = torch.cat([_rms(ch, sd[f"fc_norm.{i}.weight"], eps) for i, ch in enumerate(chunks)], dim=-1)
    h = x @ sd["fc.weight"].T
    h = torch.where(own[:, None], feats[:, :H], h)
    emb = _rms(sd["embed_tokens.weight"][ids], sd["midlayer.input_layernorm.weight"], eps)
    if c.norm_before_residual:  # _norm_before_residual
        hs = _rms(h, sd["midlayer.hidden_norm.weight"], eps)
        residual = hs
    else:
        residual = h
        hs = _rms(h, sd["midlayer.hidden_norm.weight"], eps)
    x = torch.cat([emb, hs], -1)
    nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
    T = x.shape[0]
    q = (x @ sd["midlayer.self_attn.q_proj.weight"].T).view(T, nh, hd)
    k = (x @ sd["midlayer.self_attn.k_proj.weight"].T).view(T, nkv, hd)
    v = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(T, nkv, hd)
    ang = (pos.float()[:, None] * inv_freq.float()[None]).double()
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rope(t):  # neox style: rotate halves
        a, b = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat([-b, a], -1) * sin

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    allowed = pos[None, :] <= pos[:, None]  # causal in position (rows are in generation order)
    allowed &= torch.arange(T)[None, :] <= torch.arange(T)[:, None]
    if c.sliding_window is not None:
        allowed &= (pos[:, None] - pos[None, :]) < c.sliding_window
    att = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    att = att.masked_fill(~allowed[None], float("-inf")).softmax(-1)
    o = torch.einsum("hqk,khd->qhd", att, v).reshape(T, nh * hd) @ sd["midlayer.self_attn.o_proj.weight"].T
    h = residual + o
    m = _rms(h, sd["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(m @ sd["midlayer.mlp.gate_proj.weight"].T)
           * (m @ sd["midlayer.mlp.up_proj.weight"].T))
    h = h + mlp @ sd["midlayer.mlp.down_proj.weight"].T
    hn = _rms(h, sd["norm.weight"], eps)
    return (hn if c.norm_output else h), hn @ sd["lm_head.weight"].T


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_forward_equals_the_engines_reference(target, flavour):
    """Committed entries through the cached one-row extend (in two calls), then one tree level on the draft's own
    hidden: each equals the float64 reference of the same rows."""
    from helpers import extend, level

    d = flavoured(target, seed=1, **FLAVOURS[flavour])
    c, sd = d.config, {k: v.double() for k, v in d.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    N = 9
    feats = torch.randn(N, c.fc_in, generator=g, dtype=torch.float64) * 3
    ids = torch.randint(3, 96, (N,), generator=g)
    kv = d.row_cache(1, 32)
    extend(d, kv, feats[:5], ids[:5])
    h_last, logits_last = extend(d, kv, feats[5:], ids[5:])
    own = torch.zeros(N, dtype=torch.bool)
    ref_h, ref_logits = reference(sd, c, feats, own, ids, torch.arange(N), d.rotary.inv_freq)
    torch.testing.assert_close(h_last, ref_h[-1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits_last, ref_logits[-1].float(), rtol=1e-5, atol=1e-5)
    # a tree node at depth 1: the draft's own hidden, position N, written in the first pending slot
    tok = torch.tensor([7])
    mask = (torch.arange(32) <= N)[None]  # committed slots + its own slot
    h1, l1 = level(d, kv, h_last[None], tok, torch.tensor([N]), torch.tensor([N]), mask)
    own_feats = torch.cat([feats, torch.nn.functional.pad(h_last, (0, c.fc_in - c.hidden_size))[None]])
    ref_h, ref_logits = reference(sd, c, own_feats, torch.cat([own, torch.ones(1, dtype=torch.bool)]),
                                  torch.cat([ids, tok]), torch.arange(N + 1), d.rotary.inv_freq)
    torch.testing.assert_close(h1[0], ref_h[-1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(l1[0], ref_logits[-1].float(), rtol=1e-5, atol=1e-5)


def test_each_option_changes_the_function(target):
    """No flag is a no-op: a loader that dropped one would compute another function."""
    feats = torch.randn(1, 6, 3 * 64, dtype=torch.float64) * 3
    ids = torch.randint(3, 96, (1, 6))
    base = flavoured(target, seed=4)
    with torch.no_grad():
        h0, l0, _ = base(feats, ids, torch.arange(6))
    for name, flags in FLAVOURS.items():
        d = flavoured(target, seed=4, **flags)
        with torch.no_grad():
            h, logits, _ = d(feats, ids, torch.arange(6))
        assert not (torch.allclose(h, h0) and torch.allclose(logits, l0)), name


@pytest.mark.parametrize("flavour", ["fc_norm", "eagle3.1", "sliding_window", "both_fc_norms"])
@pytest.mark.parametrize("shape", [(3, 1, 4), (4, 2, 8)])
def test_flavoured_draft_decodes_losslessly(target, flavour, shape):
    d = flavoured(target, seed=5, **FLAVOURS[flavour])
    for prompt in ([3, 9, 27, 81], [5] * 12):
        want = Decoder(target).generate(prompt, 24, eos_ids=()).token_ids
        res = Decoder(target, d, TreeShape(*shape)).generate(prompt, 24, eos_ids=())
        assert res.token_ids == want


@pytest.mark.parametrize("shape", [(5, 1, 6), (4, 2, 8), (5, 3, 12)])
def test_a_sliding_window_draft_grows_each_rows_tree_as_alone(target, shape):
    """A sliding-window draft batches like any draft: three rows of different committed lengths in one row cache (the
    positions of their slots kept per row, RowKV.pos) extend and grow, in one call each, what each row extends and
    grows alone in a one-row cache (the window over that row's own slot positions, which
    test_forward_equals_the_engines_reference holds to vLLM's arithmetic), twice over (the second time over the first
    tree's pending slots). The window (2) is shorter than the trees, so a level's ancestors two levels up are masked
    by their position, which is not their slot where a level holds more than one node."""
    from eaglekit.decoding.tree import expand_rows, tree_row

    d = flavoured(target, seed=7, sliding_window=2)
    shape = TreeShape(*shape)
    g = torch.Generator().manual_seed(3)
    first, then = [4, 9, 13], [2, 1, 3]
    feats = torch.randn(3, 16, d.config.fc_in, generator=g, dtype=torch.float64)
    ids = torch.randint(3, 96, (3, 16), generator=g)
    root = torch.tensor([7, 8, 9])
    span = 48
    levels: list = []  # each tree level's logits, as the walk's step_rows returns them

    def recorded(step):
        return lambda *a: (out := step(*a), levels.append(out[1]))[0]

    d.step_rows = recorded(d.step_rows)
    kv = d.row_cache(3, span)
    assert kv.pos is not None and d.batched
    grown = []
    with torch.inference_mode():
        for lo, n in ((torch.zeros(3, dtype=torch.long), first), (torch.tensor(first), then)):
            E = max(n)
            at = lo[:, None] + torch.arange(E)
            h, logits = d.extend_rows(kv, feats.gather(1, at[:, :, None].expand(3, E, feats.shape[2]).clamp(max=15)),
                                      ids.gather(1, at.clamp(max=15)), torch.tensor(n), span)
            levels.clear()
            grown.append((h, logits, expand_rows(d, kv, h, logits, root, shape, span), list(levels)))
    fields = ("tokens", "parents", "depths", "mask")
    for b in range(3):
        one = d.row_cache(1, span)
        assert one.pos is not None
        with torch.inference_mode():
            for k, (lo, hi) in enumerate(((0, first[b]), (first[b], first[b] + then[b]))):
                hb, lb = d.extend_rows(one, feats[b:b + 1, lo:hi], ids[b:b + 1, lo:hi], torch.tensor([hi - lo]), span)
                levels.clear()
                alone = expand_rows(d, one, hb, lb, root[b:b + 1], shape, span)
                h, logits, rows, batched = grown[k]
                assert len(batched) == len(levels) == shape.steps - 1
                for got, want in zip(batched, levels):  # (float32: both steps hand float32 logits)
                    torch.testing.assert_close(got[b], want[0], rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(h[b], hb[0], rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(logits[b], lb[0])
                for f in fields:
                    assert torch.equal(getattr(tree_row(rows, b), f), getattr(tree_row(alone, 0), f)), (b, k, f)


def test_a_sliding_window_draft_serves_a_batch_losslessly(target):
    """The batch engine takes a sliding-window draft at more than one row (no one-row fallback, no E308): requests of
    different lengths decoded together give each one's greedy continuation alone, with cycles that drafted for
    several rows at once."""
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request

    d = flavoured(target, seed=5, sliding_window=2)
    prompts = [[3, 9, 27, 81], [5] * 12, [7, 1, 4, 4, 2, 9, 30]]
    eng = BatchEngine(target, d, EngineOptions(shape=TreeShape(4, 2, 8), max_batch=3, spec_max_batch=3))
    assert not eng.one_sequence
    for i, p in enumerate(prompts):
        eng.add(Request(f"r{i}", p, 24, eos_ids=()))
    got: dict = {f"r{i}": [] for i in range(len(prompts))}
    drafted_rows = []  # rows drafted for, each step
    while eng.has_work:
        evs = eng.step()
        drafted_rows.append(sum(ev.drafted is not None for ev in evs))
        for ev in evs:
            got[ev.rid] += ev.token_ids
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == Decoder(target).generate(p, 24, eos_ids=()).token_ids, i
    assert max(drafted_rows) >= 2


def _logits(d, feats, ids):
    with torch.no_grad():
        return d(feats, ids, torch.arange(ids.shape[1]))[1]


@pytest.mark.parametrize("fmt", ["eaglekit", "sglang", "specforge", "vllm"])
@pytest.mark.parametrize("flavour", ["fc_norm", "norm_before_fc", "eagle3.1", "sliding_window"])
def test_round_trip_through_every_layout(target, tmp_path, fmt, flavour):
    d = flavoured(target, seed=6, **FLAVOURS[flavour])
    before = dataclasses.asdict(d.config)
    out = tmp_path / fmt
    if fmt == "eaglekit":
        save_draft(d, out, dtype=torch.float64)
    else:
        export(d, out, fmt, target=target, dtype=torch.float64)
    assert dataclasses.asdict(d.config) == before, "saving changed the draft's config"
    w, cfg = load_file(out / "model.safetensors"), json.loads((out / "config.json").read_text())
    layer = "layers.0." if fmt == "vllm" else "midlayer."
    assert f"{layer}self_attn.q_proj.weight" in w
    if d.config.fc_norm:  # every engine's name: fc_norm.{i}.weight, one per capture, H_t wide
        assert [tuple(w[f"fc_norm.{i}.weight"].shape) for i in range(3)] == [(64,)] * 3 and cfg["fc_norm"] is True
    if d.config.norm_before_fc:  # vLLM's and speculators' name for the one norm over the fc input
        assert w["input_norm.weight"].shape == (192,) and cfg["norm_before_fc"] is True
    if d.config.norm_output:
        assert cfg["norm_output"] is True
    if d.config.sliding_window:
        lc = cfg["transformer_layer_config"] if fmt == "vllm" else cfg
        assert lc["layer_types"] == ["sliding_attention"] and lc["sliding_window"] == 3
    back = load_draft(out, dtype=torch.float64, embed_weight=target.embed_weight())
    for k in ("fc_norm", "norm_before_fc", "norm_before_residual", "norm_output", "sliding_window"):
        assert getattr(back.config, k) == getattr(d.config, k), k
    feats, ids = torch.randn(1, 7, 192, dtype=torch.float64), torch.randint(3, 96, (1, 7))
    torch.testing.assert_close(_logits(back, feats, ids), _logits(d, feats, ids))
    assert inspect_folder(out, target)["extra_tensors"] == []


def test_fc_norm_weights_without_the_flag_are_refused(target, tmp_path):
    d = flavoured(target, seed=7, fc_norm=True)
    save_draft(d, tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    del cfg["fc_norm"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ContractError) as e:
        load_draft(tmp_path / "d", embed_weight=target.embed_weight())
    assert e.value.code == "E218" and "fc_norm" in e.value.message


def test_old_eaglekit_name_of_the_fc_input_norm_still_reads(target, tmp_path):
    """eaglekit before this change wrote norm_before_fc's weight as fc_norm.weight (one tensor, C*H_t)."""
    d = flavoured(target, seed=8, norm_before_fc=True)
    save_draft(d, tmp_path / "d", dtype=torch.float64)
    w = load_file(tmp_path / "d" / "model.safetensors")
    w["fc_norm.weight"] = w.pop("input_norm.weight")
    save_file(w, tmp_path / "d" / "model.safetensors")
    back = load_draft(tmp_path / "d", dtype=torch.float64, embed_weight=target.embed_weight())
    feats, ids = torch.randn(1, 4, 192, dtype=torch.float64), torch.randint(3, 96, (1, 4))
    torch.testing.assert_close(_logits(back, feats, ids), _logits(d, feats, ids))


def test_speculators_norm_before_residual_defaults_as_vllm_reads_it(target, tmp_path):
    """vLLM's speculators reader takes a missing norm_before_residual as True; so do we."""
    d = flavoured(target, seed=9, norm_before_residual=True)
    export(d, tmp_path / "v", "vllm", target=target, dtype=torch.float64)
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    del cfg["norm_before_residual"]
    (tmp_path / "v" / "config.json").write_text(json.dumps(cfg))
    assert load_draft(tmp_path / "v", embed_weight=target.embed_weight()).config.norm_before_residual


# --- folders written by speculators' and SpecForge's own code (tests/fixtures/make_thirdparty.py) ---------
FIX = Path(__file__).resolve().parents[1] / "fixtures"
THIRD = {  # folder: (layout eaglekit reports, its ids convention, key prefix in thirdparty_ref.safetensors)
    "speculators_eagle3": ("vllm", "input_of", "speculators"),
    "specforge_eagle3": ("sglang", "output_of", "specforge"),
}


@pytest.mark.parametrize("name", THIRD)
def test_thirdparty_folder_computes_what_its_library_computed(target, name):
    """The library's own modules produced these logits when the fixture was written; our forward on the
    loaded folder must give the same (float32 there, float64 here)."""
    fmt, conv, key = THIRD[name]
    d = load_draft(FIX / name, dtype=torch.float64, embed_weight=target.embed_weight())
    assert (d.source_format.name, d.source_format.ids_convention) == (fmt, conv)
    assert d.config.capture == CaptureSpec((1, 3, 6)) and d.config.fc_norm
    if name.startswith("speculators"):  # one llama layer, "sliding_attention", window 4; norm_before_residual
        assert d.config.sliding_window == 4 and d.config.norm_before_residual
    ref = load_file(FIX / "thirdparty_ref.safetensors")
    feats, ids = ref[f"{key}.feats"].double(), ref[f"{key}.ids"]
    with torch.no_grad():
        _, logits, _ = d(feats, ids, torch.arange(ids.shape[1]))
    torch.testing.assert_close(logits.float(), ref[f"{key}.logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", THIRD)
def test_thirdparty_folder_decodes_losslessly_and_exports_back(target, tmp_path, name):
    d = load_draft(FIX / name, dtype=torch.float64, embed_weight=target.embed_weight())
    for prompt in ([3, 9, 27, 81, 5, 7], [11] * 9):
        want = Decoder(target).generate(prompt, 20, eos_ids=()).token_ids
        assert Decoder(target, d, TreeShape(3, 1, 4)).generate(prompt, 20, eos_ids=()).token_ids == want
    feats, ids = torch.randn(1, 9, 192, dtype=torch.float64), torch.randint(3, 96, (1, 9))
    for fmt in ("vllm", "sglang", "specforge"):
        export(d, tmp_path / fmt, fmt, target=target, dtype=torch.float32)
        back = load_draft(tmp_path / fmt, dtype=torch.float64, embed_weight=target.embed_weight())
        assert back.config.capture == d.config.capture and back.config.sliding_window == d.config.sliding_window
        torch.testing.assert_close(_logits(back, feats, ids), _logits(d, feats, ids), rtol=1e-5, atol=1e-5)


def test_a_draft_of_several_layers_is_refused_by_name(target, tmp_path):
    """speculators trains drafts of num_layers > 1 (layers.1.*); eaglekit's draft has one layer: say so."""
    import shutil

    shutil.copytree(FIX / "speculators_eagle3", tmp_path / "d")
    w = load_file(tmp_path / "d" / "model.safetensors")
    w["layers.1.post_attention_layernorm.weight"] = torch.ones(64)
    save_file(w, tmp_path / "d" / "model.safetensors")
    with pytest.raises(ContractError) as e:
        load_draft(tmp_path / "d", embed_weight=target.embed_weight())
    assert e.value.code == "E218" and "several decoder layers" in e.value.message


@pytest.mark.engine
@pytest.mark.parametrize("name", THIRD)
def test_thirdparty_folder_in_vllm_matches_eaglekit(tmp_path, name):
    """The fixture exported for vLLM: vLLM's greedy output and per-position acceptance equal eaglekit's."""
    import os
    import subprocess

    py = os.environ.get("EAGLEKIT_VLLM_PYTHON") or str(Path.home() / ".cache/eaglekit/vllm-venv/bin/python")
    if not Path(py).exists():
        pytest.skip("no vLLM python: set EAGLEKIT_VLLM_PYTHON (tests/engine/setup_venv.sh builds one)")
    repo = Path(__file__).resolve().parents[2]
    p = subprocess.run([py, str(FIX / "vllm_check_thirdparty.py"), name, str(tmp_path)], capture_output=True,
                       text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(repo)})
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    r = json.loads(lines[-1])
    assert r["outputs_equal"] and r["vllm_drafts"] == r["eaglekit_cycles"]
    assert r["vllm_per_pos"] == pytest.approx(r["eaglekit_per_pos"], abs=1e-9)
