"""eaglekit.kernels.products: the CPU's oneDNN products are right, never use a stale pack, and the pick at load
times real forwards and says what it chose."""

import pytest
import torch
import torch.nn.functional as F

from eaglekit.demo import ASSETS
from eaglekit.errors import InputError
from eaglekit.kernels.products import OneDNN, onednn_available, pick_cpu
from eaglekit.options import PairRuntime
from eaglekit.pair import load_pair

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN")


@needs_onednn
def test_onednn_products_match_f_linear_and_fall_back_when_they_must():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    b = torch.randn(96, generator=g)
    x = torch.randn(2, 6, 64, generator=g)
    p = OneDNN([w])
    assert id(w) in p.packed
    y = p.linear(x, w, b)
    assert y.shape == (2, 6, 96) and torch.allclose(y, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        w.mul_(2)  # changed in place after packing: the pack is stale and must not be used
    assert torch.equal(p.linear(x, w, b), F.linear(x, w, b))
    other = torch.randn(96, 64, generator=g)
    assert torch.equal(p.linear(x, other), F.linear(x, other))  # never packed
    w64 = torch.randn(8, 4, dtype=torch.float64)
    assert id(w64) not in OneDNN([w64]).packed  # oneDNN has no fp64: F.linear
    v = torch.randn(96, 64, requires_grad=True)
    y = OneDNN([v]).linear(x, v)
    y.sum().backward()  # a product that needs gradients takes F.linear, so training through it works
    assert v.grad is not None


@needs_onednn
def test_onednn_claims_row_invariance_in_float32_only():
    """A row's float32 product is the same bits alone and among five others; bf16 packs make no such claim (oneDNN's
    bf16 kernels round a row by the block it falls in), so the decoder never takes a bf16 CPU run as lossless."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(256, 576, generator=g), torch.randn(6, 576, generator=g)
    p = OneDNN([w])
    assert p.batch_invariant
    many = p.linear(x, w)
    assert all(torch.equal(p.linear(x[i:i + 1], w)[0], many[i]) for i in range(6))
    assert not OneDNN([w.bfloat16()]).batch_invariant
    assert not OneDNN([w, w.bfloat16()]).batch_invariant


def test_pick_cpu_times_both_paths_and_sets_the_faster():
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cpu", dtype="float32",
                     run=PairRuntime(products="aten"))
    assert t.products == "aten" and t.net.products.name == "aten"
    res = pick_cpu(t, reps=3, again=True)
    want = ["aten", "onednn"] if onednn_available() else ["aten"]
    assert sorted(res["ms"]) == want and res["rows"] == 6
    assert res["products"] == min(res["ms"], key=lambda k: sum(res["ms"][k])) == t.products


def test_load_pair_products_auto_picks_on_cpu_and_checks_names():
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cpu", dtype="float32")
    assert t.products == t.products_pick["products"] and d.products.name == t.products
    with pytest.raises(InputError, match="products"):
        load_pair(ASSETS / "target", ASSETS / "draft", device="cpu", run=PairRuntime(products="fast"))
    for kind in ("invariant", "hopper"):
        with pytest.raises(InputError, match="GPU kernel") as e:
            load_pair(ASSETS / "target", ASSETS / "draft", device="cpu", run=PairRuntime(products=kind))
        assert e.value.code == "E108" and "--device cuda" in e.value.fix


def test_pick_cpu_leaves_out_onednn_when_its_packs_would_not_fit(monkeypatch):
    """The packs are a second copy of the weights: a machine without the memory for it keeps F.linear."""
    from eaglekit.kernels import products

    t, _ = load_pair(ASSETS / "target", None, device="cpu", dtype="float32", run=PairRuntime(products="aten"))
    monkeypatch.setattr(products, "available_memory", lambda: 1024)
    res = pick_cpu(t, reps=2, again=True)
    assert list(res["ms"]) == ["aten"] and t.products == "aten" and "free memory" in res["onednn_skipped"]


def test_onednn_and_compiled_layers_do_not_mix():
    """torch.compile cannot trace oneDNN's packed weights: auto keeps F.linear for compiled layers, and asking for
    both is refused with the fix instead of failing inside inductor at the first step."""
    t, _ = load_pair(ASSETS / "target", None, device="cpu", dtype="float32", run=PairRuntime(compile="on"))
    assert t.products == "aten" and t.products_pick is None
    if onednn_available():
        with pytest.raises(InputError, match="--compile"):
            load_pair(ASSETS / "target", None, device="cpu", dtype="float32",
                      run=PairRuntime(compile="on", products="onednn"))


def test_onednn_and_prompt_graphs_do_not_mix():
    """The prompt graphs (--prompt-graphs) have symbolic sizes, which oneDNN's packs cannot take: auto keeps F.linear
    on a CPU, with the reason; asking for both is refused with the fix; a target other than our decoder refuses
    the flag."""
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cpu", dtype="float32",
                     run=PairRuntime(prompt_graphs=True))
    assert t.compiled_prompts and d.compiled_prompt is not None
    assert t.products == "aten" and "prompt graphs" in t.products_choice.reason
    if onednn_available():
        with pytest.raises(InputError, match="--prompt-graphs") as e:
            load_pair(ASSETS / "target", None, device="cpu", dtype="float32",
                      run=PairRuntime(prompt_graphs=True, products="onednn"))
        assert e.value.code == "E108" and "--products aten" in e.value.fix
    with pytest.raises(InputError, match="--prompt-graphs") as e:
        load_pair(ASSETS / "target", None, backend="hf", device="cpu", dtype="float32",
                  run=PairRuntime(prompt_graphs=True))
    assert e.value.code == "E108"


def test_auto_is_invariant_for_half_precision_on_a_gpu_only(monkeypatch):
    """products='auto' on a GPU (eaglekit.kernels.products.choose, the one chooser): the batch-invariant kernels for
    bf16/fp16 (hopper's where they take the model, invariant's elsewhere), draft or not (so speculative output is
    the plain decode's, bit for bit, across runs; serve's batches: invariant at every size), F.linear for float32
    and foreign targets; every choice with its reason. The decision alone is checked here (the kernels:
    tests/kernels/test_invariant_attention.py, tests/gpu/test_gpu.py)."""
    from eaglekit.kernels import invariant_gemm, products
    from eaglekit.kernels.products import choose

    monkeypatch.setattr(invariant_gemm, "HAVE_TRITON", True)
    t, _ = load_pair(ASSETS / "target", None, device="cpu", dtype="bfloat16", run=PairRuntime(products="aten"))
    monkeypatch.setattr(products, "hopper_reason", lambda target: "it needs an sm_90 GPU")
    assert choose(t, "cuda").kind == choose(t, "cuda:1").kind == "invariant"  # draft or not (--baseline)
    assert "sm_90" in choose(t, "cuda").reason
    # serve: batch-invariant at every batch size (a request's bits do not depend on what shares the batch)
    assert choose(t, "cuda", batched=True).kind == "invariant" and "batch" in choose(t, "cuda", batched=True).reason
    # ... within the invariant kernels' 64 rows a forward; past them the same kernels for every forward they take
    # (a server's plain steps are those of a server without a draft) and F.linear for the larger verifies, whose
    # tokens are not batch-invariant: the reason says so
    assert choose(t, "cuda", batched=True, rows=64).kind == "invariant"
    wide = choose(t, "cuda", batched=True, rows=65)
    assert wide.kind == "invariant" and "not batch-invariant" in wide.reason and "64" in wide.reason
    assert "--products aten" in wide.reason
    assert choose(t, "cpu").kind == "pick"
    t32, _ = load_pair(ASSETS / "target", None, device="cpu", dtype="float32", run=PairRuntime(products="aten"))
    assert choose(t32, "cuda").kind is None and "float32" in choose(t32, "cuda").reason
    t32.tp = object()  # a tensor-parallel rank keeps its own products
    assert choose(t32, "cuda").kind is None and choose(t32, "cpu").kind is None
    # where the hopper kernels take the model (bf16, sm_90, nvcc, its shapes): hopper, the same guarantee, for the
    # baseline and every tree alike
    monkeypatch.setattr(products, "hopper_reason", lambda target: None)
    assert choose(t, "cuda").kind == "hopper" and choose(t, "cuda", batched=True).kind == "invariant"
    monkeypatch.setattr(products, "hopper_reason", lambda target: "no nvcc found")
    assert choose(t, "cuda").kind == "invariant" and "no nvcc found" in choose(t, "cuda").reason
    monkeypatch.setattr(invariant_gemm, "HAVE_TRITON", False)
    assert choose(t, "cuda").kind is None and "Triton" in choose(t, "cuda").reason


def test_the_choice_and_its_reason_are_kept_on_the_target():
    t, _ = load_pair(ASSETS / "target", None, device="cpu", dtype="float32")
    assert t.products_choice.kind == t.products and "timed here" in t.products_choice.reason
    t, _ = load_pair(ASSETS / "target", None, device="cpu", dtype="float32", run=PairRuntime(products="aten"))
    assert t.products_choice.kind == "aten" and "asked for" in t.products_choice.reason
