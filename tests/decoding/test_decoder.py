"""The one-request Decoder (eaglekit.decoding.decoder) beyond plain greedy equality: stops inside accepted runs, the
oracle, the transformers adapter on DeepSeek-V3 (the architecture of the story), metrics bookkeeping."""

import pytest
import sequence
import torch
from helpers import OracleDraft, extend, grow

from eaglekit.capture import CaptureSpec
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import new_draft
from eaglekit.models import load_target
from eaglekit.observe.metrics import GenerationMetrics, aggregate


def _oracle_decoder(target, prompt, shape):
    dec = Decoder(target, None, shape)
    dec.capture = CaptureSpec.default(target.info.num_layers)
    dec.draft = OracleDraft(target, prompt[0])
    return dec


def test_oracle_accepts_every_drafted_token(model_dirs):
    t = load_target(model_dirs["qwen2"], dtype="float64")
    prompt = [4, 8, 15, 16, 23, 42]
    for steps in (1, 2, 4, 6):
        res = _oracle_decoder(t, prompt, TreeShape(steps, 1, steps + 1)).generate(prompt, 40, eos_ids=())
        m = res.metrics
        assert all(a == steps for a in m.accepted[:-1]) and m.per_position[0] == 1.0
        assert res.token_ids == Decoder(t).generate(prompt, 40, eos_ids=()).token_ids


def test_stop_string_inside_an_accepted_run(model_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dirs["llama"]))
    t = load_target(model_dirs["llama"], dtype="float64")
    prompt = tok("def add(a, b):")["input_ids"]
    base = Decoder(t).generate(prompt, 40, tokenizer=tok, eos_ids=())
    hits = 0
    for k in range(6, len(base.text) - 3, 5):
        stop = base.text[k:k + 2]
        if not stop.strip():
            continue
        want = Decoder(t).generate(prompt, 40, stop_strings=[stop], tokenizer=tok, eos_ids=())
        got = _oracle_decoder(t, prompt, TreeShape(5, 1, 6)).generate(prompt, 40, stop_strings=[stop],
                                                                        tokenizer=tok, eos_ids=())
        assert got.token_ids == want.token_ids and got.text == want.text
        assert want.stop_reason == "stop_string" and want.text.endswith(stop)
        assert want.text.find(stop) + len(stop) == len(want.text)  # stopped at the first occurrence
        hits += 1
    assert hits >= 3


def test_max_new_tokens_inside_a_run(model_dirs):
    t = load_target(model_dirs["mistral"], dtype="float64")
    prompt = [9, 9, 8]
    for n in range(1, 14):
        got = _oracle_decoder(t, prompt, TreeShape(6, 1, 7)).generate(prompt, n, eos_ids=())
        assert len(got.token_ids) == n and got.stop_reason == "length"
        assert got.token_ids == Decoder(t).generate(prompt, n, eos_ids=()).token_ids


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "deepseek_v3", vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, max_position_embeddings=256, bos_token_id=1,
        eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" not in n:
                p.normal_(0, 0.5 / max(p.shape[-1], 1) ** 0.5)
    d = tmp_path_factory.mktemp("dsv3")
    m.save_pretrained(d)
    return d


def test_deepseek_v3_through_the_transformers_adapter(deepseek_dir):
    from transformers import AutoModelForCausalLM

    t = load_target(deepseek_dir, backend="hf", dtype="float64")  # auto picks models.deepseek (tests/models)
    assert type(t).__name__ == "HFTarget" and t.info.family == "deepseek_v3" and t.info.num_layers == 8
    ref = AutoModelForCausalLM.from_pretrained(deepseek_dir, dtype=torch.float64,
                                               experts_implementation="eager").eval()
    d = new_draft(t, seed=5, dtype=torch.float64, num_heads=4, intermediate_size=96)
    assert d.config.capture == CaptureSpec((1, 3, 4))
    prompt = [7, 3, 9, 27, 5]
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, 5:].tolist()
        hs = ref(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    for shape in (TreeShape(3, 1, 4), TreeShape(3, 3, 8)):
        res = Decoder(t, d, shape).generate(prompt, 24, eos_ids=())
        assert res.token_ids == want
    # the hooks capture the residual stream after layers 1, 3, 4 (= inputs of layers 2, 4, 5)
    t.reset(16)
    _, feats = sequence.prefill(t, torch.tensor(prompt), CaptureSpec((1, 3, 4)))
    torch.testing.assert_close(feats, torch.cat([hs[2][0], hs[4][0], hs[5][0]], -1))


def test_metrics_conventions():
    m = GenerationMetrics(new_tokens=11, elapsed_s=1.0, draft_tokens=4, accepted=[3, 0, 2, 3], depths=[3, 3, 3, 3])
    assert m.accept_length == (8 + 4) / 4  # tokens per verify, bonus included (SGLang scale)
    assert m.accept_rate == 8 / (4 * 3)
    assert m.per_position == [3 / 4, 3 / 4, 2 / 4]
    assert m.histogram == [1, 0, 1, 2]
    agg = aggregate([m, GenerationMetrics(new_tokens=3, elapsed_s=1.0, draft_tokens=4, accepted=[1], depths=[2])])
    assert agg.verify_count == 5 and agg.new_tokens == 14 and agg.tokens_per_s == 7.0
    assert agg.per_position[:2] == [4 / 5, 3 / 5] and agg.per_position[2] == 2 / 4


@pytest.mark.slow
def test_compiled_layers_give_the_same_tokens(model_dirs):
    """torch.compile of the decoder and draft layers (inductor on the CPU here; ~30 s) changes nothing."""
    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=3)
    prompt = list(range(5, 20))
    ref = Decoder(t, d, TreeShape(3, 2, 6)).generate(prompt, 24, eos_ids=()).token_ids
    long_prompt = [5 + i % 80 for i in range(90)]
    long_ref = Decoder(t, d, TreeShape(3, 2, 6)).generate(long_prompt, 40, eos_ids=()).token_ids
    t.compile()
    d.compile()
    assert Decoder(t, d, TreeShape(3, 2, 6)).generate(prompt, 24, eos_ids=()).token_ids == ref
    assert Decoder(t).generate(prompt, 24, eos_ids=()).token_ids == ref
    for shape in ((5, 4, 8), (5, 1, 6)):  # a deeper tree and a chain: compiled bookkeeping, accept and chain graph
        assert Decoder(t, d, TreeShape(*shape)).generate(prompt, 24, eos_ids=()).token_ids == ref
    # a longer generation (another span; its prompt runs the plain layers) compiles nothing new: the span is symbolic
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    assert Decoder(t, d, TreeShape(3, 2, 6)).generate(long_prompt, 40, eos_ids=()).token_ids == long_ref
    assert counters["stats"]["unique_graphs"] == before


def _prompt_runs(model_dirs, compile_them: bool):
    """The llama target and a draft, tokens of three prompts (15, 90, 40 tokens) with the draft (and the last two
    without), eager and then with the prompt graphs of compile_prompts() (compile_them: inductor's; else the
    plain functions they compile stand in, the same code) and no decode graphs. -> (eager tokens, prompt-graph
    tokens, the token counts each prompt graph was called with, the graphs the later two prompts compiled, layers)."""
    from torch._dynamo.utils import counters

    from eaglekit.draft.model import Eagle3Draft
    from eaglekit.models.llama import DecoderLayer

    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=3)
    shape = TreeShape(3, 2, 6)
    prompts = [list(range(5, 20)), [5 + i % 80 for i in range(90)], list(range(30, 70))]

    def tokens():
        return [(Decoder(t, d, shape).generate(p, 12, eos_ids=()).token_ids,
                 Decoder(t).generate(p, 12, eos_ids=()).token_ids) for p in prompts[1:]]

    def first():  # (a span of 64 slots would do for it: the engine makes room for the warm-up's 65 tokens)
        return Decoder(t, d, shape).generate(prompts[0], 12, eos_ids=()).token_ids

    ref = [first()] + tokens()
    t.compile_prompts()
    d.compile_prompts()
    assert t.compiled_prompts and d.compiled_prompt is not None
    if not compile_them:
        t.net.prompt_layer, d.compiled_prompt = DecoderLayer.forward, Eagle3Draft._whole
    seen = {"target": [], "draft": []}

    def counted(fn, who, at):  # (the call's token count: dim 1 of its argument `at`)
        return lambda *a: (seen[who].append(a[at].shape[1]), fn(*a))[1]

    t.net.prompt_layer = counted(t.net.prompt_layer, "target", 1)  # (layer, x [B, T, H], ...)
    d.compiled_prompt = counted(d.compiled_prompt, "draft", 2)
    got = [first()]
    graphs = counters["stats"]["unique_graphs"]
    got += tokens()
    return ref, got, seen, counters["stats"]["unique_graphs"] - graphs, t.info.num_layers


def test_prompt_graphs_run_every_prompt_after_a_warm_up(model_dirs):
    """compile_prompts() (--prompt-graphs): the target's prefill and the draft's extend over a prompt run the prompt
    graphs (here the plain functions they compile stand in), for every prompt length, with the same tokens; the
    engine calls them at 2 and COMPILE_MAX_TOKENS + 1 tokens before its first prefill (where they compile)."""
    from eaglekit.models.layers import COMPILE_MAX_TOKENS

    ref, got, seen, _, L = _prompt_runs(model_dirs, compile_them=False)
    assert got == ref
    warm = [2] * L + [COMPILE_MAX_TOKENS + 1] * L
    # each engine warms once (the draft's, the plain one); a plain engine's prompts capture nothing and skip the draft
    assert seen["target"][:2 * L] == warm and seen["draft"][:2] == [2, COMPILE_MAX_TOKENS + 1]
    assert seen["target"].count(90) == 2 * L and seen["target"].count(40) == 2 * L
    assert seen["draft"].count(90) == 1 and seen["draft"].count(40) == 1


@pytest.mark.slow
def test_compiled_prompts_give_the_same_tokens(model_dirs):
    """The prompt graphs compiled (inductor on the CPU here; ~35 s from a cold cache): the same tokens, and
    prompts of new lengths compile nothing (one graph for every length, compiled at the engine's warm-up)."""
    ref, got, seen, new_graphs, L = _prompt_runs(model_dirs, compile_them=True)
    assert got == ref
    assert new_graphs == 0
    assert seen["target"].count(90) == 2 * L


@pytest.mark.slow
def test_prompt_graphs_serve_every_row_compiled_at_warm_up(model_dirs):
    """A 4-row engine with the prompt graphs compiled (inductor on the CPU here): six requests of 20-85 tokens,
    prefilled into every row, decode the eager engine's tokens, and none compiles a graph after warm_up."""
    from torch._dynamo.utils import counters

    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request

    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=3)
    shape = TreeShape(3, 2, 6)
    prompts = [[5 + (i * 7 + j) % 80 for j in range(20 + 13 * i)] for i in range(6)]

    def run(eng):
        for i, p in enumerate(prompts):
            eng.add(Request(f"r{i}", p, 20, eos_ids=()))
        out = {}
        while eng.has_work:
            for ev in eng.step():
                out.setdefault(ev.rid, []).extend(ev.token_ids)
        return out

    ref = run(BatchEngine(t, d, EngineOptions(shape=shape, max_batch=4, adaptive=False)))
    t.compile_prompts()
    d.compile_prompts()
    eng = BatchEngine(t, d, EngineOptions(shape=shape, max_batch=4, adaptive=False))
    eng.warm_up(256)
    graphs = counters["stats"]["unique_graphs"]
    assert run(eng) == ref
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_catch_ups_of_every_length_run_the_prompt_graph_compiled_at_warm_up(model_dirs):
    """The draft's catch-up over a window of plain tokens runs its prompt graph (one row): windows of 3 to 70 tokens,
    on both sides of the row limit, compile nothing after warm_up and decode the target's tokens. (The window is a
    slice of the engine's buffer, with its row stride, and duck sizing would tie a length to another size of the first
    call: either would compile graphs of their own, seconds each on a GPU.)"""
    from torch._dynamo.utils import counters

    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request

    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=3)
    prompt = [5 + (7 * j) % 80 for j in range(30)]
    want = Decoder(t).generate(prompt, 140, eos_ids=()).token_ids
    t.compile_prompts()
    d.compile_prompts()
    eng = BatchEngine(t, d, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=1))
    eng.warm_up(256)
    script = [0] * 3 + [3] + [0] * 17 + [3] + [0] * 40 + [3] + [0] * 70 + [3] * 10  # plain runs, each a catch-up
    eng.policy.choose = lambda rows, drafting=1.0: (script.pop(0) if script else 3, "scripted")
    eng.policy.draft_pays = lambda rows: True  # (scripted: the row keeps its draft whatever the timings say)
    catch = []
    inner = eng._catch_up
    eng._catch_up = lambda c: (catch.append(max(s.lag for s in eng.rows)), inner(c))
    graphs = counters["stats"]["unique_graphs"]
    eng.add(Request("r", prompt, 140, eos_ids=()))
    out = []
    while eng.has_work:
        for ev in eng.step():
            out.extend(ev.token_ids)
    assert out == want and catch == [3, 17, 40, 70]
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_compiled_whole_tree_builds_the_rows_walks_trees(model_dirs):
    """A compiled draft grows a one-row tree as one graph (Eagle3Draft.tree_rows: its levels, picks and bookkeeping):
    the same trees as the same walk run eagerly and as the engine's walk over step_rows, for several shapes and
    seeds."""
    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=3)
    d.compile()
    kv = d.row_cache(1, 96)
    g = torch.Generator().manual_seed(0)
    extend(d, kv, torch.randn(20, d.fc.in_features, generator=g),
           torch.randint(0, d.config.vocab_size, (20,), generator=g))
    for shape in (TreeShape(3, 2, 6), TreeShape(4, 3, 12), TreeShape(2, 4, 9)):
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            h = torch.randn(d.hidden_size, generator=g)
            logits = torch.randn(d.draft_vocab_size, generator=g) * 3
            root = torch.tensor(7)
            whole = grow(d, kv, h, logits, root, shape)  # the whole tree one graph
            kept, d.walks.tree_graph = d.walks.tree_graph, None
            try:
                eager = grow(d, kv, h, logits, root, shape)  # the same walk, eagerly
            finally:
                d.walks.tree_graph = kept
            rows = grow(d, kv, h, logits, root, shape, own_walk=False)
            for field in ("tokens", "parents", "depths", "mask"):
                assert torch.equal(getattr(whole, field), getattr(rows, field)), (shape, seed, field)
                assert torch.equal(getattr(eager, field), getattr(rows, field)), (shape, seed, field, "eager")


def test_tree_tokens_and_step_inputs_are_target_ids(model_dirs, monkeypatch):
    """A tree's tokens and what its levels feed the draft are target ids (d2t applied): a chain maps its picks and
    puts the root first inside the draft's walk, a tree's levels and its selection inside their bookkeeping. With
    a draft vocabulary mapped past its own range (d2t an offset c >= its size), every id a draft step receives and
    every node's token lies in [c, c + Vd), plain and compiled, and the draft's own walks give the engine's walk's
    trees."""
    from eaglekit.draft.model import Eagle3Draft

    t = load_target(model_dirs["llama"])
    V = t.info.vocab_size
    Vd = V // 4
    d = new_draft(t, seed=3, draft_vocab_size=Vd)
    c = V - Vd
    d.d2t.fill_(c)
    fed = []
    step = Eagle3Draft.step_rows
    monkeypatch.setattr(Eagle3Draft, "step_rows",
                        lambda self, kv, h, ids, *a: (fed.append(ids.clone()), step(self, kv, h, ids, *a))[1])
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(12, d.fc.in_features, generator=g)
    for compiled in (False, True):
        if compiled:
            d.compile()
        kv = d.row_cache(1, 96)
        extend(d, kv, feats, torch.randint(0, V, (12,), generator=g))
        h, logits = torch.randn(d.hidden_size, generator=g), torch.randn(Vd, generator=g) * 3
        root = torch.tensor(7)
        for shape in (TreeShape(5, 1, 6), TreeShape(4, 3, 10)):
            fed.clear()
            rows = grow(d, kv, h, logits, root, shape, own_walk=False)  # the levels over step_rows
            assert rows.tokens[0] == 7 and ((rows.tokens[1:] >= c) & (rows.tokens[1:] < V)).all(), (compiled, shape)
            assert len(fed) == shape.steps - 1 and all(((ids >= c) & (ids < V)).all() for ids in fed), compiled
            fed.clear()
            own = grow(d, kv, h, logits, root, shape)  # the draft's one-row walk (step_rows not called)
            assert not fed and all(torch.equal(a, b) for a, b in zip(vars(own).values(), vars(rows).values()))
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    kv = d.row_cache(1, 160)  # another span: the compiled walks take it without compiling again
    extend(d, kv, feats, torch.randint(0, V, (12,), generator=g))
    again = grow(d, kv, h, logits, root, TreeShape(4, 3, 10))
    assert counters["stats"]["unique_graphs"] == before and again.tokens.shape == (10,)


@pytest.mark.slow
def test_a_compiled_draft_runs_whole_unless_traced(model_dirs):
    """compile() compiles the draft's fc, embedding and rotary with its layer (one graph a call), and a chain's steps,
    picks and masks as one graph: the same tokens, the same draft proposals as the plain chain, and the whole graphs
    are what runs; with tracing on, the layer-only path runs and its records still appear."""
    from eaglekit.observe import trace

    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=3)
    prompt = list(range(5, 20))
    ref = {s: Decoder(t, d, TreeShape(*s)).generate(prompt, 16, eos_ids=()).token_ids for s in ((3, 1, 4), (3, 2, 6))}
    d.compile()
    calls = []
    for obj, attr, name in ((d, "compiled_whole", "compiled_whole"), (d.walks, "chain_graph", "compiled_chain"),
                            (d.walks, "tree_graph", "compiled_tree")):
        fn = getattr(obj, attr)
        setattr(obj, attr, lambda *a, fn=fn, name=name: (
            calls.append((name, a[7] if name == "compiled_whole" else None)), fn(*a))[1])
    for s, tokens in ref.items():
        assert Decoder(t, d, TreeShape(*s)).generate(prompt, 16, eos_ids=()).token_ids == tokens
    # the extends (target features), the chains, the trees (their steps inside the tree's graph)
    assert {("compiled_whole", True), ("compiled_chain", None), ("compiled_tree", None)} <= set(calls)
    assert ("compiled_whole", False) not in calls
    kv = d.row_cache(1, 64)
    g = torch.Generator().manual_seed(1)
    extend(d, kv, torch.randn(9, d.fc.in_features, generator=g),
           torch.randint(0, d.config.vocab_size, (9,), generator=g))
    m = kv.length.clone()
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        h, logits = torch.randn(d.hidden_size, generator=g), torch.randn(d.draft_vocab_size, generator=g) * 3
        whole = grow(d, kv, h, logits, torch.tensor(7), TreeShape(5, 1, 6)).tokens
        assert torch.equal(kv.length, m)  # pending entries only
        levels = grow(d, kv, h, logits, torch.tensor(7), TreeShape(5, 1, 6), own_walk=False).tokens
        assert torch.equal(whole, levels), seed
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    kv = d.row_cache(1, 160)  # another span: the compiled chain's span is symbolic, nothing compiles again
    extend(d, kv, torch.randn(9, d.fc.in_features, generator=g),
           torch.randint(0, d.config.vocab_size, (9,), generator=g))
    assert torch.equal(grow(d, kv, h, logits, torch.tensor(7), TreeShape(5, 1, 6)).tokens,
                       grow(d, kv, h, logits, torch.tensor(7), TreeShape(5, 1, 6), own_walk=False).tokens)
    assert counters["stats"]["unique_graphs"] == before
    calls.clear()
    sink: list = []
    trace.configure(enabled=True, sink=sink, stream=open("/dev/null", "w"))
    try:
        assert Decoder(t, d, TreeShape(3, 1, 4)).generate(prompt, 16, eos_ids=()).token_ids == ref[(3, 1, 4)]
    finally:
        trace.configure(enabled=False)
    assert not calls and {"draft.input.features", "draft.input.embedding"} <= {r["point"] for r in sink}


def test_decoders_sharing_a_target_keep_their_own_capture():
    """Issue 13.1: a second Decoder on the same target with another CaptureSpec must not change what the first
    one feeds its draft (the capture used to be written onto the shared target)."""
    from eaglekit.demo import ASSETS
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    t, d = load_pair(ASSETS / "target", ASSETS / "draft", "auto", "cpu", None)
    tok = load_tokenizer(ASSETS / "target")
    prompts = [encode(tok, p) for p in read_prompts(ASSETS / "prompts.jsonl")[:3]]
    shape = TreeShape.make()
    first = Decoder(t, d, shape)

    def run(dec):  # 32 tokens a prompt (64 took 9 s): the shifted capture's accept length differs already
        return aggregate([dec.generate(p, 32).metrics for p in prompts]).accept_length

    before = run(first)
    other = Decoder(t, d, shape, capture=first.capture.shifted(+1))
    shifted = run(other)
    assert run(first) == before
    assert first.capture != other.capture and shifted != before  # the shift is real: it changes acceptance


def test_row_padded_baseline_step_keeps_its_token_and_commits_one(model_dirs):
    """sequence.step(target, token, rows): the token is row 0 of a `rows`-token chain, the other rows are never
    committed. In float32 on a CPU the logits match the one-row step and the greedy outputs are the same."""
    t = load_target(model_dirs["llama"], backend="ours")
    prompt = torch.tensor([1, 5, 9, 14, 3])
    out = {}
    for rows in (1, 4, 6):
        t.reset(32)
        logits, _ = sequence.prefill(t, prompt)
        tok, seq = logits[-1].argmax(), []
        for _ in range(8):
            before = sequence.length(t)
            step_logits = sequence.step(t, tok.view(1), rows)
            assert sequence.length(t) == before + 1 and step_logits.shape == (t.info.vocab_size,)
            seq.append(step_logits)
            tok = step_logits.argmax()
        out[rows] = torch.stack(seq)
    assert torch.allclose(out[4], out[1], atol=1e-5) and torch.allclose(out[6], out[1], atol=1e-5)
    d = new_draft(t, seed=0)
    base = Decoder(t, d, TreeShape(3, 1, 4)).generate([1, 5, 9], 12, baseline=True).token_ids
    assert Decoder(t, d, TreeShape(3, 1, 4), baseline_rows=4).generate([1, 5, 9], 12, baseline=True).token_ids == base


def test_baseline_rows_resolution_and_the_comparison_it_makes(model_dirs):
    from eaglekit.decoding.compare import compare
    from eaglekit.errors import GenerationError

    t = load_target(model_dirs["llama"], backend="ours")
    d = new_draft(t, seed=0)
    assert Decoder(t, d, TreeShape(5, 1, 6)).baseline_rows == 1  # float32 on a CPU: one row is the verify's
    assert Decoder(t, d, TreeShape(5, 1, 6), baseline_rows=6).baseline_rows == 6
    with pytest.raises(GenerationError) as e:
        Decoder(t, d, baseline_rows=0)
    assert e.value.code == "E300"
    dec = Decoder(t, d, TreeShape(3, 1, 4), baseline_rows=4)
    c = compare(dec, [[1, 5, 9], [2, 7]], 8)
    s = c.summary()
    # identity against the 4-row reference, speed against the plain one-row decode (decoded too)
    assert s["baseline_rows"] == 4 and c.plain is not None and s["identical_one_row"] == 2 and c.identical
    assert s["baseline_tokens_per_s"] == round(c.plain.metrics.tokens_per_s, 2)


def test_a_chain_keeps_in_place_and_extends_its_last_entry_only(model_dirs):
    """A chain's accepted path is its first n nodes: committed in place (the row's length moved, nothing copied) it
    leaves the cache as RowKV.keep(arange) does; the extend sends only its last entry through the norm and the lm_head
    (head_at): h is the same bits as the full forward's row, the logits agree to rounding."""
    t = load_target(model_dirs["llama"])
    prompt = torch.arange(5, 25)
    caches = []
    for in_place in (False, True):
        t.reset(64)
        sequence.prefill(t, prompt)
        sequence.verify(t, torch.tensor([3, 4, 5, 6]), torch.arange(4), torch.ones(4, 4, dtype=torch.bool).tril())
        sequence.keep(t, torch.arange(4), torch.tensor(3), in_place=in_place)
        caches.append((sequence.length(t), t.cache.k[..., :23, :].clone(), t.cache.v[..., :23, :].clone()))
    assert caches[0][0] == caches[1][0] == 23
    assert torch.equal(caches[0][1], caches[1][1]) and torch.equal(caches[0][2], caches[1][2])

    d = new_draft(t, seed=3)
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(6, d.fc.in_features, generator=g)
    ids = torch.randint(0, d.config.vocab_size, (6,), generator=g)
    h_all, logits_all, _ = d(feats[None], ids[None], torch.arange(6), d.row_cache(1, 32).layer(0), torch.arange(6),
                             torch.ones(1, 6, 32, dtype=torch.bool).tril(), from_target=True)
    for n in (1, 4, 6):
        kv = d.row_cache(1, 32)
        h, logits = extend(d, kv, feats, ids, n)
        assert kv.length.tolist() == [n]
        assert torch.equal(h, h_all[0, n - 1])
        torch.testing.assert_close(logits, logits_all[0, n - 1].float(), rtol=1e-5, atol=1e-5)


def test_prompt_calls_never_reach_the_compiled_graphs(model_dirs):
    """The compiled decode functions hold one graph per token count: a prompt's prefill, the draft's extend over it
    and a catch-up window change their count from call to call, so they run the plain code (each new prompt length
    compiled a graph inside the timed generation). Stand-ins that record the token count of every compiled call
    (and run the plain code) show that only decode shapes reach them, in the Decoder and the batched engine."""
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request
    from eaglekit.draft.model import Eagle3Draft
    from eaglekit.models.llama import DecoderLayer

    t = load_target(model_dirs["llama"])
    d = new_draft(t, seed=3)
    seen = []
    t.net.compiled_layer = lambda layer, x, *a: seen.append(("target", x.shape[1])) or DecoderLayer.forward(layer, x,
                                                                                                             *a)
    d.compiled_whole = lambda self, hidden, ids, *a: seen.append(("draft", ids.shape[1])) or Eagle3Draft._whole(
        self, hidden, ids, *a)
    shape = TreeShape(3, 1, 4)
    prompts = [list(range(5, 5 + n)) for n in (7, 11, 13)]  # lengths no decode call has
    for p in prompts:
        Decoder(t, d, shape).generate(p, 12, eos_ids=())
        Decoder(t, d, shape).generate(p, 12, eos_ids=(), baseline=True)
    eng = BatchEngine(t, d, EngineOptions(shape=shape, max_batch=2))
    for i, p in enumerate(prompts):
        eng.add(Request(f"r{i}", p, 12, eos_ids=()))
    while eng.has_work:
        eng.step()
    counts = {n for _, n in seen}
    assert seen and {"target", "draft"} <= {who for who, _ in seen}
    assert not counts & {7, 11, 13}, sorted(counts)
    # a plain step, and each draft length's verify and extend (the batched engine's policy runs shorter chains too)
    assert counts <= {1} | {n for s in shape.shorter() for n in (s.draft_tokens, s.path_len)}, sorted(counts)
