"""eaglekit's DeepSeek-family decoder (models.deepseek: MLA over a latent cache, DeepSeek's MoE) against
transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM on tiny random configs, and speculative decoding on it.

The parity grid (ds_helpers.CONFIGS x seeds 0-2) covers V3 and V2 routing, q_lora on and off, YaRN with mscale, both
rope layouts, dense and MoE layers (7 layers, the first 2 dense). Two entries run in the default tier, the grid in
the slow tier (`pytest -m slow -s tests/models/test_deepseek.py -k parity` prints the table).
"""

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import sequence  # noqa: E402
from ds_helpers import CONFIGS, ds_oracle, make_ds_model  # noqa: E402

from eaglekit.capture import CaptureSpec  # noqa: E402
from eaglekit.decoding.decoder import Decoder  # noqa: E402
from eaglekit.decoding.tree import TreeShape  # noqa: E402
from eaglekit.draft import new_draft  # noqa: E402
from eaglekit.errors import ContractError, InputError  # noqa: E402
from eaglekit.models import load_target  # noqa: E402

_built: dict = {}


def _pair(tmp_path_factory, name, seed, dtype=torch.float32):
    """(transformers model, our target) for one grid entry, built once per session."""
    key = (name, seed, dtype)
    if key not in _built:
        family, opts = CONFIGS[name]
        d = tmp_path_factory.mktemp(f"{name}-{seed}")
        ref = make_ds_model(d, family, seed=seed, **opts)
        if dtype != torch.float32:  # (transformers' grouped_mm experts lack float64)
            from transformers import AutoModelForCausalLM

            ref = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, experts_implementation="eager").eval()
        _built[key] = (ref, load_target(d, dtype=dtype), d)
    return _built[key]


def _hf_greedy(ref, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


DEFAULT_GRID = {("v3-qlora", 0), ("v2-group-yarn", 0)}  # the rest of the grid in the slow tier
GRID = [pytest.param(n, s, marks=[] if (n, s) in DEFAULT_GRID else [pytest.mark.slow], id=f"{n}-seed{s}")
        for s in (0, 1, 2) for n in CONFIGS]
PARITY: dict = {}  # (config, seed) -> (greedy identical, max logit difference): printed by the last test


@pytest.mark.parametrize("name,seed", GRID)
def test_parity_with_transformers(tmp_path_factory, name, seed):
    ref, ours, _ = _pair(tmp_path_factory, name, seed)
    assert ours.backend == "deepseek" and type(ours).__name__ == "DeepSeekTarget"
    L = ours.info.num_layers
    ids = torch.randint(3, 96, (24,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = ref(ids[None], output_hidden_states=True)
    hs = out.hidden_states  # hs[i + 1]: the output of layer i (the last one normed by transformers)
    spec = CaptureSpec((-1, 1, 3, L - 2, L - 1))
    ours.reset(64)
    logits, feats = sequence.prefill(ours, ids, spec)
    diff = (logits - out.logits[0]).abs().max().item()
    torch.testing.assert_close(logits, out.logits[0], rtol=1e-4, atol=1e-4)
    H = ours.info.hidden_size
    f = feats.view(24, 5, H)
    for j, layer in enumerate(spec.after_layers[:-1]):
        torch.testing.assert_close(f[:, j], hs[layer + 1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.net.model.norm(f[:, -1]), hs[L][0], rtol=1e-5, atol=1e-5)
    # the decode form (absorbed attention, gathered experts) one token at a time
    ours.reset(64)
    sequence.prefill(ours, ids[:12])
    rows = torch.stack([sequence.step(ours, ids[i:i + 1]) for i in range(12, 24)])
    diff = max(diff, (rows - out.logits[0, 12:24]).abs().max().item())
    torch.testing.assert_close(rows, out.logits[0, 12:24], rtol=1e-4, atol=1e-4)
    # greedy: our plain decode (graphs off on a CPU) == transformers' argmax run
    prompt = ids[:8].tolist()
    want = _hf_greedy(ref, prompt, 16)
    got = Decoder(ours).generate(prompt, 16, eos_ids=()).token_ids
    PARITY[(name, seed)] = (got == want, diff)
    assert got == want


@pytest.mark.parametrize("name", ["v3-qlora", pytest.param("v2-group-yarn", marks=pytest.mark.slow)])
def test_tree_verify_equals_running_each_path(tmp_path_factory, name):
    """One tree-masked verify gives at every node the logits of prefix + that node's path (float64); keeping one
    path leaves a cache that continues like a plain sequence. Tolerance 1e-6, not float64's: the router runs in
    float32 (as transformers' does), so a 1e-16 difference of its input can move a routing weight by a float32 ulp."""
    ref, ours, _ = _pair(tmp_path_factory, name, 0, torch.float64)
    from helpers import assert_tree_verify_matches

    assert_tree_verify_matches(ours, ref, 1e-6)


def test_moe_paths_and_attention_forms_agree(tmp_path_factory):
    """The experts' four ways (gather, fused gather, loop, dense) and MLA's two forms (absorbed over the latent
    cache, expanded with SDPA) compute the same function (float64)."""
    from eaglekit.models import mla

    _, ours, _ = _pair(tmp_path_factory, "v3-qlora", 0, torch.float64)
    moe = ours.net.model.layers[4].mlp
    x = torch.randn(1, 9, ours.info.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    outs = {}
    for mode in ("gather", "fused", "loop", "dense"):
        moe.experts.mode = mode
        outs[mode] = moe(x)
    moe.experts.mode = None
    for mode in ("fused", "loop", "dense"):
        torch.testing.assert_close(outs[mode], outs["gather"], rtol=1e-10, atol=1e-10)
    ids = torch.randint(3, 96, (20,), generator=torch.Generator().manual_seed(1))
    ours.reset(32)
    want, _ = sequence.prefill(ours, ids)  # 20 tokens: absorbed (<= ABSORB_MAX_TOKENS)
    old, mla.ABSORB_MAX_TOKENS = mla.ABSORB_MAX_TOKENS, 0
    try:
        ours.reset(32)
        got, _ = sequence.prefill(ours, ids)  # expanded
    finally:
        mla.ABSORB_MAX_TOKENS = old
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_latent_cache_holds_the_latent_only(tmp_path_factory):
    """The cache stores kv_lora_rank + qk_rope_head_dim values per layer and token, not per-head keys and values."""
    _, ours, _ = _pair(tmp_path_factory, "v3-qlora", 0)
    ours.cache = None  # a fresh allocation (an earlier test's may be longer)
    ours.reset(40)
    c = ours.config
    assert ours.cache.kv.shape == (c.num_layers, 1, 41, c.kv_lora_rank + c.qk_rope_head_dim)
    sequence.prefill(ours, torch.arange(3, 13))
    layer = ours.net.model.layers[3].self_attn
    assert torch.isfinite(ours.cache.kv[:, 0, :10]).all() and not ours.cache.kv[:, 0, 10:].any()
    assert layer.kv_b_proj.weight.shape == (c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)


SHAPES = [(3, 1, 4), (5, 1, 6), (2, 2, 4), (3, 2, 6), (4, 3, 10), (5, 4, 16)]


@pytest.mark.parametrize("case", [c if c < 3 else pytest.param(c, marks=pytest.mark.slow) for c in range(12)])
def test_speculative_greedy_equals_target(tmp_path_factory, case):
    """Chains and trees, a random EAGLE-3 draft or a (noisy) oracle: the speculative output is the target's own
    greedy output, EOS inside accepted runs included (float64)."""
    rng = random.Random(case)
    name = ["v3-qlora", "v2-group-yarn", "v3-noqlora-yarn"][case % 3]
    _, target, _ = _pair(tmp_path_factory, name, 0, torch.float64)
    shape = TreeShape(*SHAPES[case % len(SHAPES)])
    prompt = [rng.randrange(3, 96) for _ in range(rng.randint(2, 20))]
    max_new = rng.randint(10, 24)
    free = Decoder(target).generate(prompt, max_new, eos_ids=()).token_ids
    eos = free[rng.randrange(3, len(free))] if case % 2 else None
    eos_ids = () if eos is None else (eos,)
    want = free if eos is None else free[:free.index(eos) + 1]
    kind = ["random", "oracle", "noisy"][case % 3 if case < 6 else (case + 1) % 3]
    if kind == "random":
        dec = Decoder(target, new_draft(target, seed=case, dtype=torch.float64), shape)
    else:
        dec = Decoder(target, None, shape)
        dec.capture = CaptureSpec.default(target.info.num_layers)
        dec.draft = ds_oracle(target, prompt[0], noise=0.4 if kind == "noisy" else 0.0, seed=case)
    res = dec.generate(prompt, max_new, eos_ids=eos_ids)
    assert res.token_ids == want, f"speculative output differs ({kind}, {shape}, eos={eos})"
    if kind == "oracle" and shape.topk == 1:
        assert all(a == shape.steps for a in res.metrics.accepted[:-1])


def test_batched_rows_equal_single_sequence(tmp_path_factory):
    """The batch engine (serve's path: per-row latent caches) emits each request's single-sequence greedy output."""
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request

    _, target, _ = _pair(tmp_path_factory, "v3-qlora", 0, torch.float64)
    draft = new_draft(target, seed=1, dtype=torch.float64)
    eng = BatchEngine(target, draft, EngineOptions(shape=TreeShape(3, 2, 6), max_batch=4, spec_max_batch=4))
    prompts = {f"r{i}": [3 + i, 17, 40 + 3 * i, 9][: 2 + i % 3] for i in range(5)}
    for rid, p in prompts.items():
        eng.add(Request(rid, p, 10, eos_ids=()))
    got = {rid: [] for rid in prompts}
    while eng.has_work:
        for ev in eng.step():
            got[ev.rid] += ev.token_ids
    for rid, p in prompts.items():
        assert got[rid] == Decoder(target).generate(p, 10, eos_ids=()).token_ids, rid


def _prompt_graph_tokens(target, draft, compile_them: bool):
    """Tokens of three prompts (15, 90, 40 tokens) eager, then with the prompt graphs (compile_them: inductor's; else
    the plain layer standing in), the token counts and `prompt` flags the graph was called with, and the graphs the
    later two prompts compiled."""
    from torch._dynamo.utils import counters

    from eaglekit.models.deepseek import DeepSeekLayer

    shape = TreeShape(3, 2, 6)
    prompts = [list(range(5, 20)), [5 + i % 80 for i in range(90)], list(range(30, 70))]

    def run(ps, n=12):
        return [Decoder(target, draft, shape).generate(p, n, eos_ids=()).token_ids for p in ps]

    ref = run(prompts[:1]) + run(prompts[1:])
    target.compile_prompts()
    draft.compile_prompts()
    fn = target.net.prompt_layer if compile_them else DeepSeekLayer.forward
    seen = []
    target.net.prompt_layer = lambda *a: (seen.append((a[1].shape[1], a[-1])), fn(*a))[1]
    got = run(prompts[:1])
    graphs = counters["stats"]["unique_graphs"]
    got += run(prompts[1:])
    target.compile_prompts(False)
    draft.compile_prompts(False)
    return ref, got, seen, counters["stats"]["unique_graphs"] - graphs


def test_prompt_graphs_take_every_prompt_with_the_experts_prompt_flag(tmp_path_factory):
    """--prompt-graphs on a DeepSeek-family target: every prompt of two tokens or more runs the prompt graph (here the
    plain layer standing in), told it is one (the routed experts' grouped-or-dense choice when compiled), with the
    eager tokens."""
    _, target, _ = _pair(tmp_path_factory, "v3-qlora", 0)
    ref, got, seen, _ = _prompt_graph_tokens(target, new_draft(target, seed=3), compile_them=False)
    assert got == ref
    L = target.info.num_layers
    assert [n for n, _ in seen[:2 * L]] == [2] * L + [65] * L and all(flag is True for _, flag in seen)
    assert [sum(n == k for n, _ in seen) for k in (15, 90, 40)] == [L, L, L]


@pytest.mark.slow
def test_compiled_prompt_graphs_give_the_eager_tokens(tmp_path_factory):
    """The prompt graphs compiled (inductor on the CPU, float32: the experts dense; ~40 s cold): the eager tokens,
    and prompts of new lengths compile nothing."""
    _, target, _ = _pair(tmp_path_factory, "v3-qlora", 0)
    ref, got, _, new_graphs = _prompt_graph_tokens(target, new_draft(target, seed=3), compile_them=True)
    assert got == ref and new_graphs == 0


def test_loading_conventions(tmp_path):
    """Per-expert checkpoint tensors are stacked; a multi-token-prediction layer past num_hidden_layers is not
    read; auto picks this decoder; an unimplemented rope type falls back to transformers (auto) or is refused
    (ours, E190); tensor parallelism is refused (E192); a missing expert is named (E107)."""
    import json

    from safetensors.torch import load_file, save_file

    d = tmp_path / "m"
    ref = make_ds_model(d, "deepseek_v3", seed=4, q_lora=True)
    sd = load_file(str(d / "model.safetensors"))
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in sd)  # transformers writes the checkpoint names
    sd["model.layers.7.self_attn.kv_a_layernorm.weight"] = torch.ones(32)  # an MTP layer: ignored
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    t = load_target(d)
    ids = torch.arange(3, 15)
    t.reset(16)
    lg, _ = sequence.prefill(t, ids)
    with torch.no_grad():
        torch.testing.assert_close(lg, ref(ids[None]).logits[0], rtol=1e-4, atol=1e-4)
    assert t.net.model.layers[2].mlp.gate.weight.dtype == torch.float32
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_target(d).backend == "hf"
    with pytest.raises(InputError) as e:
        load_target(d, backend="ours")
    assert e.value.code == "E190"
    bad = {k: v for k, v in sd.items() if ".mlp.experts.5." not in k or ".layers.3." not in k}
    save_file(bad, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as e:
        load_target(d)
    assert e.value.code == "E107" and "expert 5" in str(e.value)


def test_seeds_fault_embedding_capture_refused_and_four_ids_decoded(tmp_path_factory, tmp_path):
    """The seed's fault on this family: a draft trained on 3 captures run with a 4th (the embedding, -1) is refused
    when paired, naming both widths; a draft built for 4 captures is saved, read back and decodes losslessly."""
    from eaglekit.draft import check_pair, load_draft, save_draft

    _, target, _ = _pair(tmp_path_factory, "v3-qlora", 0)
    H, L = target.info.hidden_size, target.info.num_layers
    three = new_draft(target, seed=2)
    with pytest.raises(ContractError) as e:
        check_pair(three, target, CaptureSpec((-1,) + CaptureSpec.default(L).after_layers))
    assert e.value.code == "E202"
    assert f"{3 * H}" in str(e.value) and f"{4 * H}" in str(e.value)
    with pytest.raises(ContractError):
        Decoder(target, three, capture=CaptureSpec((-1, 1, 2, 3)))
    four = new_draft(target, seed=3, capture=CaptureSpec((1, 2, 3, 4)))
    assert four.fc.in_features == 4 * H
    save_draft(four, tmp_path / "d4")
    back = load_draft(tmp_path / "d4", embed_weight=target.embed_weight())
    assert back.config.capture.after_layers == (1, 2, 3, 4)
    prompt = [5, 9, 33, 41, 7]
    want = Decoder(target).generate(prompt, 16, eos_ids=()).token_ids
    assert Decoder(target, back, TreeShape(3, 2, 6)).generate(prompt, 16, eos_ids=()).token_ids == want


def test_zz_parity_table():
    """Prints the parity table of the grid entries this run covered (pytest -s shows it)."""
    if not PARITY:
        pytest.skip("run with test_parity_with_transformers")
    print("\nconfig              seed  greedy-identical  max|logit diff|")
    for (name, seed), (same, diff) in sorted(PARITY.items()):
        print(f"{name:<20}{seed:<6}{str(same):<18}{diff:.2e}")
    assert all(same for same, _ in PARITY.values())


def test_regeneration_batch_equals_each_prompt_alone(tmp_path_factory):
    """Regeneration's batches: prompts of different lengths decoded together continue exactly as each prompt alone."""
    from eaglekit.decoding.sampling import SamplingParams
    from eaglekit.train.regen import generate_batch

    _, target, _ = _pair(tmp_path_factory, "v2-group-yarn", 0, torch.float64)
    prompts = [[5, 9, 33], [7, 8, 9, 10, 11, 12], [40]]
    out = generate_batch(target, prompts, 8, SamplingParams(), 0, ())
    assert out == [Decoder(target).generate(p, 8, eos_ids=()).token_ids for p in prompts]


@pytest.mark.slow
def test_h200_benchmark_runs_end_to_end_tiny(tmp_path):
    """benchmarks/lab/deepseek_h200.py --tiny: every stage the GPU run has (bar the compiled step) runs on a CPU and
    the JSON is written, so the one GPU call is not spent on a typo."""
    import importlib.util
    import json

    root = Path(__file__).parents[2]
    spec = importlib.util.spec_from_file_location("deepseek_h200", root / "benchmarks" / "lab" / "deepseek_h200.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--tiny", "--out", str(tmp_path), "--reps", "2"]) == 0
    res = json.loads((tmp_path / "deepseek_h200.json").read_text())
    assert not res["errors"], res["errors"]
    assert {"copy_bandwidth", "build", "roofline", "step_eager_graph", "cycles", "transformers"} <= res["stages"].keys()
    assert res["stages"]["transformers"]["n_not_copied"] == 0
    # a verify's rows read more experts than a step's one row, never more than all of them
    raw = mod.v2_lite_raw(tiny=True)
    for key, v in res["stages"]["roofline"]["verify_roofline"].items():
        assert v["rows"] == int(key.split("_")[2]) and v["over_step"] > 1
        assert raw["num_experts_per_tok"] < v["distinct_experts"] <= raw["n_routed_experts"]
    assert res["stages"]["transformers"]["first_16_tokens_agree"] == res["stages"]["transformers"]["new_tokens"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_prompt_graphs_on_the_gpu(tmp_path_factory, dtype):
    """--prompt-graphs on a DeepSeek-family target on the GPU (the tiny v3 config; bf16 on sm_90 runs the routed
    experts grouped, float32 dense), graphed decoding: prompts of 2, 30, 65 and 90 tokens decode with the draft what
    the verify-shaped baseline decodes, no prompt length compiles a graph after the first generation, and in float32
    the tokens equal eager prompts'."""
    from torch._dynamo.utils import counters

    _, _, folder = _pair(tmp_path_factory, "v3-qlora", 0)
    target = load_target(folder, device="cuda", dtype=dtype)
    draft = new_draft(target, seed=3, dtype=dtype)
    prompts = [[5 + (7 * i + j) % 80 for j in range(n)] for i, n in enumerate((2, 30, 65, 90))]
    shape = TreeShape(3, 2, 6)

    def tokens(dec, baseline=False):
        return [dec.generate(p, 24, eos_ids=(), baseline=baseline).token_ids for p in prompts]

    eager = tokens(Decoder(target, draft, shape, graphs=True))
    target.compile_prompts()
    draft.compile_prompts()
    dec = Decoder(target, draft, shape, graphs=True)
    dec.generate(prompts[0], 4, eos_ids=())  # (the engines compile the prompt graphs before their first prefill)
    dec.generate(prompts[0], 4, eos_ids=(), baseline=True)
    graphs = counters["stats"]["unique_graphs"]
    got = tokens(dec)
    assert got == tokens(dec, baseline=True)
    assert counters["stats"]["unique_graphs"] == graphs
    if dtype == torch.float32:
        assert got == eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("experts", ["auto", "grouped", "triton"])
def test_speculative_decoding_with_each_experts_mode_on_the_gpu(tmp_path_factory, experts):
    """The tiny v3 config in bf16 on the GPU, decoding through CUDA graphs with each way of running the routed experts
    (`--experts`): a chain and a tree decode with a draft what the verify-shaped baseline decodes (in bf16 a row's
    bits depend on the rows computed with it, so the baseline is the verify-shaped one). Making `grouped` the default
    waits for this test on a GPU."""
    from eaglekit.pair import set_experts

    _, _, folder = _pair(tmp_path_factory, "v3-qlora", 0)
    target = load_target(folder, device="cuda", dtype=torch.bfloat16)
    set_experts(target, experts)
    draft = new_draft(target, seed=3, dtype=torch.bfloat16)
    prompts = [[5 + (7 * i + j) % 80 for j in range(n)] for i, n in enumerate((3, 17, 40))]
    for shape in (TreeShape(3, 1, 4), TreeShape(3, 2, 6)):
        dec = Decoder(target, draft, shape, graphs=True)
        for p in prompts:
            got = dec.generate(p, 24, eos_ids=()).token_ids
            assert got == dec.generate(p, 24, eos_ids=(), baseline=True).token_ids, (experts, shape, p)
