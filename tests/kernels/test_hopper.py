"""products "hopper" (eaglekit.kernels.hopper): where it runs and why not, its build (cache key, argument structs
against the CUDA source; a real nvcc build where one is found), and on an sm_90 GPU that every entry point is right
against torch (linear in its three epilogues, with the norm in it and its statistics; the norm statistics; q/k/v
with rotary and cache writes, with and without its norm; the attention, with the cache's keys and with this call's
keys apart), that a row's bits never depend on the rows beside it, and that a decoder of a shape it takes verifies a
tree with each row's logits bit-identical to the one-row baseline steps."""

import dataclasses
import random

import pytest
import sequence
import torch
from helpers import extend, grow, random_tree_paths

from eaglekit.errors import InputError
from eaglekit.kernels import hopper
from eaglekit.models.config import parse_target_config
from eaglekit.train.pretrain import LlamaShape, llama_config


def _cfg(**over):
    raw = llama_config(LlamaShape(8192, 2048, 2, 16, 4, 4096), max_pos=4096, tie=False, eos_id=1)
    return dataclasses.replace(parse_target_config(raw), **over)


def test_shapes_it_takes_and_the_reason_it_gives_otherwise():
    assert hopper.shape_reason(_cfg()) is None
    from eaglekit.demo import ASSETS
    from eaglekit.models.config import load_target_config

    assert "head_dim 64" in hopper.shape_reason(load_target_config(ASSETS / "target"))
    assert "q/k norms" in hopper.shape_reason(_cfg(qk_norm=True))
    assert "sliding-window" in hopper.shape_reason(_cfg(sliding_window=512))
    assert "multiples of 2048" in hopper.shape_reason(_cfg(intermediate_size=5000))
    assert "1, 2, 4 or 8" in hopper.shape_reason(_cfg(num_heads=16, num_kv_heads=1))
    assert hopper.reason(_cfg(), "cpu", torch.bfloat16) == "it runs on CUDA GPUs only"


def test_products_hopper_on_a_cpu_is_a_clear_error():
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair

    with pytest.raises(InputError, match="GPU kernel"):
        load_pair(ASSETS / "target", device="cpu", run=PairRuntime(products="hopper"))


def test_a_draft_keeps_sdpa_where_hopper_attention_cannot_run():
    from eaglekit.demo import ASSETS
    from eaglekit.pair import load_pair

    _, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cpu")
    assert d.set_attention("hopper") is False and d.attention == "sdpa"
    assert d.midlayer.self_attn.pending_kernel is None
    with pytest.raises(InputError, match="sdpa or hopper"):
        d.set_attention("flash")
    assert hopper.draft_reason(32, 8, 128, "cpu", torch.bfloat16) == "it runs on CUDA GPUs only"


def _pending_reference(calls):
    """hopper.pending_attention in torch (any device): the mask from (base, block), this call's keys written first."""
    def ref(q, k, v, kn, vn, base, block, first):
        calls.append(block.shape)
        T, (_, S, hd) = q.shape[0], k.shape
        f, b = int(first[0]), int(base[0])
        k[:, f:f + T], v[:, f:f + T] = kn.transpose(0, 1), vn.transpose(0, 1)
        mask = torch.zeros(T, S, dtype=torch.bool)
        mask[:, :b] = True
        mask[:, b:b + block.shape[1]] = block
        o = torch.nn.functional.scaled_dot_product_attention(
            q.view(T, -1, hd).transpose(0, 1)[None], k[None], v[None], attn_mask=mask[None, None], enable_gqa=True)
        return o[0].transpose(0, 1).reshape(T, -1)
    return ref


def test_the_drafts_pending_form_says_what_its_masks_say():
    """The (base, block) an extend, a tree level and a chain step hand the draft's attention (set_attention "hopper")
    name the same keys as their masks: with a torch stand-in for the kernel, the same logits and trees as SDPA's."""
    from eaglekit.decoding import tree
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair

    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cpu", run=PairRuntime(compile="off", products="aten"))
    prompt = torch.arange(3, 43)
    calls = []
    got = {}
    for kind in ("sdpa", "reference"):
        if kind == "reference":
            d.midlayer.self_attn.pending_kernel = _pending_reference(calls)
            d._one = torch.ones(1, 1, dtype=torch.bool)
        t.reset(200)
        kv = d.row_cache(1, 200)
        _, feats = sequence.prefill(t, prompt, d.config.capture)
        extend(d, kv, feats[:32], prompt[1:33])  # (32 rows: compiled or not, within the pending form's 64)
        h, logits = extend(d, kv, feats[32:], torch.cat([prompt[33:], prompt[:1]]))
        got[kind] = [logits] + [grow(d, kv, h, logits, prompt[0], tree.TreeShape(*s)).tokens
                                for s in ((4, 2, 6), (5, 4, 12), (4, 1, 5))]
    assert len(calls) == 2 + 3 + 4 + 3  # two extends, the trees' levels, the chain's steps
    assert torch.allclose(got["sdpa"][0], got["reference"][0], atol=1e-5)
    for a, b in zip(got["sdpa"][1:], got["reference"][1:]):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_the_compiled_draft_takes_a_pending_op_without_a_graph_break():
    """The draft compiled (as on a GPU) with a registered op in the pending form's place (a CPU stand-in of
    pending_attention: mutates the cache, reads no mask): no graph break (one broke the H200's chain graph at the
    op's registration), and the same logits and trees as the compiled SDPA draft."""
    from torch._dynamo.utils import counters
    from torch.library import custom_op

    from eaglekit.decoding import tree
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair

    ref = _pending_reference([])

    @custom_op("eaglekit_test::pending_cpu", mutates_args=("k", "v"))
    def stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kn: torch.Tensor, vn: torch.Tensor,
                 base: torch.Tensor, block: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        return ref(q, k, v, kn, vn, base, block, first)

    stand_in.register_fake(lambda q, *a: q.new_empty(q.shape))
    t, d = load_pair(ASSETS / "target", ASSETS / "draft", device="cpu", run=PairRuntime(compile="on", products="aten"))
    prompt = torch.arange(5, 53)
    got = {}
    for kind in ("sdpa", "op"):
        if kind == "op":
            d.midlayer.self_attn.pending_kernel = stand_in._opoverload
            d._one = torch.ones(1, 1, dtype=torch.bool)
        torch._dynamo.reset()
        counters.clear()
        t.reset(200)
        kv = d.row_cache(1, 200)
        _, feats = sequence.prefill(t, prompt, d.config.capture)
        extend(d, kv, feats[:40], prompt[1:41])
        h, logits = extend(d, kv, feats[40:], torch.cat([prompt[41:], prompt[:1]]))
        got[kind] = [logits] + [grow(d, kv, h, logits, prompt[0], tree.TreeShape(*s)).tokens
                                for s in ((4, 2, 6), (4, 1, 5))]
        assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.allclose(got["sdpa"][0], got["op"][0], atol=1e-5)
    for a, b in zip(got["sdpa"][1:], got["op"][1:]):
        assert torch.equal(a, b)


def _cache_in(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # (hopper's cache: tmp_path / "cuda")
    monkeypatch.setattr(hopper, "_LIB", None)


def test_no_nvcc_is_a_clear_error(monkeypatch, tmp_path):
    _cache_in(monkeypatch, tmp_path)
    monkeypatch.setattr(hopper, "find_nvcc", lambda: None)
    assert "no nvcc" in hopper.build_reason()
    with pytest.raises(hopper.Unavailable, match="nvcc"):
        hopper.library()
    assert not (tmp_path / "cuda").exists() or not any((tmp_path / "cuda").iterdir())  # nothing half-built


def test_without_nvcc_a_build_of_these_sources_in_the_cache_serves(monkeypatch, tmp_path):
    _cache_in(monkeypatch, tmp_path)
    monkeypatch.setattr(hopper, "find_nvcc", lambda: None)
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "hopper-0000000000000000-1111111111111111-sm90a.so").touch()  # another source's
    assert hopper.prebuilt() is None
    built = tmp_path / "cuda" / f"hopper-{hopper.source_digest()}-2222222222222222-sm90a.so"
    built.touch()
    assert hopper.prebuilt() == built and hopper.build_reason() is None


def _fake_nvcc(path, release: str) -> str:
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}'\n")
    path.chmod(0o755)
    return str(path)


def test_the_cache_key_holds_the_sources_and_the_nvcc_version(monkeypatch, tmp_path):
    """The library's name digests the sources and `nvcc --version`'s output: another compiler builds anew."""
    _cache_in(monkeypatch, tmp_path)
    a, b = _fake_nvcc(tmp_path / "nvcc-a", "12.4, V12.4.131"), _fake_nvcc(tmp_path / "nvcc-b", "13.0, V13.0.88")
    pa, pb = hopper.library_path(a), hopper.library_path(b)
    assert pa != pb and pa.parent == pb.parent == tmp_path / "cuda"
    assert pa.name.startswith(f"hopper-{hopper.source_digest()}-") and pa.name.endswith("-sm90a.so")
    assert hopper.library_path(_fake_nvcc(tmp_path / "nvcc-c", "12.4, V12.4.131")) == pa  # same output, same key
    src = tmp_path / "hopper.cu"
    src.write_text(hopper.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(hopper, "SOURCES", (src, hopper.SOURCES[1]))
    assert hopper.library_path(a) != pa


def test_an_install_without_the_cuda_source_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(hopper, "SOURCES", (tmp_path / "hopper.cu",))
    with pytest.raises(hopper.Unavailable, match="lacks hopper.cu"):
        hopper.source_digest()
    assert "lacks hopper.cu" in hopper.build_reason()


def _c_structs(src: str) -> dict[str, list[tuple[str, str]]]:
    """hopper.cu's `struct ek_hopper_*_args { type name; ... };` as {struct: [(type, name), ...]} (comments dropped)."""
    import re

    out = {}
    for name, body in re.findall(r"struct (ek_hopper_\w+_args) \{(.*?)\};", src, re.S):
        fields = [re.sub(r"//.*", "", line).strip() for line in body.splitlines()]
        out[name] = [re.fullmatch(r"(const void\*|void\*|int|float) (\w+);", f).groups() for f in fields if f]
    return out


def test_the_argument_structs_match_the_cuda_source():
    """Each entry point's ctypes.Structure (hopper.ENTRY_POINTS) against its C struct in hopper.cu: the same field
    names in the same order, a pointer for each `void*`, an int for each `int`, a float for each `float` (a mismatch
    is a crash or wrong bits on the GPU); each entry point takes a pointer to its struct alone; and no build variant
    is left (no EK_ macro: the library is one build)."""
    import ctypes
    import re

    src = hopper.SOURCE.read_text()
    structs = _c_structs(src)
    ctype = {"const void*": ctypes.c_void_p, "void*": ctypes.c_void_p, "int": ctypes.c_int, "float": ctypes.c_float}
    assert sorted(structs) == sorted(hopper.C_STRUCTS.values())
    for py, c in hopper.C_STRUCTS.items():
        assert [(n, t) for n, t in py._fields_] == [(n, ctype[t]) for t, n in structs[c]], c
    entries = dict(re.findall(r"^int (ek_hopper_\w+)\(const (ek_hopper_\w+_args)\* a\) \{", src, re.M))
    assert entries == {name: hopper.C_STRUCTS[args] for name, args in hopper.ENTRY_POINTS.items()}
    exported = set(re.findall(r"^\S.* \*?(ek_hopper_\w+)\(", src, re.M))
    assert exported == set(hopper.ENTRY_POINTS) | {"ek_hopper_error", "ek_hopper_sm_count"}
    assert "EK_" not in src and "ek_bulk" not in src


@pytest.mark.slow
@pytest.mark.skipif(hopper.find_nvcc() is None, reason="needs nvcc")
def test_nvcc_builds_the_library_and_its_entry_points_take_their_structs(monkeypatch, tmp_path):
    """A real build, as a first use does (atomically into the cache, under the nvcc-keyed name), loaded; each entry
    point refuses a shape it does not take before touching the GPU (-1, "bad arguments"), so this runs anywhere."""
    import ctypes

    _cache_in(monkeypatch, tmp_path)
    lib = hopper.library()
    assert hopper.library_path(hopper.find_nvcc()).exists() and hopper.BUILD_SECONDS > 0
    assert [p.name for p in (tmp_path / "cuda").iterdir()] == [hopper.library_path(hopper.find_nvcc()).name]
    refused = {"ek_hopper_linear": hopper.LinearArgs(epi=hopper.EPI_PLAIN, M=65, N=8, K=2048, ldx=2048),
               "ek_hopper_qkv": hopper.QkvArgs(M=1, K=2048, ldx=2048, H=32, Hkv=8, hd=64),
               "ek_hopper_rms": hopper.RmsArgs(M=1, K=4100),
               "ek_hopper_attn": hopper.AttnArgs(rep=4, rows=1, cols=65)}
    for name, args in refused.items():
        assert getattr(lib, name)(ctypes.byref(args)) == -1, name
    assert lib.ek_hopper_error(-1) == b"bad arguments"


sm90 = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                          reason="needs an sm_90 GPU")


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()


ROWS = (1, 2, 5, 7, 8, 9, 16, 17, 40, 64)


@pytest.mark.parametrize("epi,N,K", [(hopper.EPI_PLAIN, 6144, 4096), (hopper.EPI_PLAIN, 128256, 4096),
                                     (hopper.EPI_RESID, 4096, 14336), (hopper.EPI_SWIGLU, 28672, 4096),
                                     (hopper.EPI_PLAIN, 4096, 2048), (hopper.EPI_PLAIN, 4104, 2048)])  # 513 tiles: odd
@pytest.mark.gpu
@sm90
def test_products_right_and_row_invariant(epi, N, K):
    k = hopper.Kernels("cuda")
    w, x = _rand(N, K, seed=1, scale=K ** -0.5), _rand(64, K, seed=2)
    res = _rand(64, N, seed=3) if epi == hopper.EPI_RESID else None
    alone = None
    for M in ROWS:
        y = k.linear(x[:M], w, epi, res[:M] if res is not None else None)
        ref = x[:M].float() @ w.float().T
        if epi == hopper.EPI_RESID:
            ref = res[:M].float() + ref
        if epi == hopper.EPI_SWIGLU:
            ref = torch.nn.functional.silu(ref[:, :N // 2]) * ref[:, N // 2:]
        err = (y.float() - ref).abs().max() / ref.abs().max()
        assert err < 1e-2, (M, err)
        if alone is None:
            alone = torch.cat([k.linear(x[r:r + 1], w, epi, res[r:r + 1] if res is not None else None)
                               for r in range(64)])
        assert torch.equal(y, alone[:M]), M  # each row's bits as when it comes alone


@pytest.mark.gpu
@sm90
def test_norm_in_the_products():
    """A RESID product's statistics (y * g and the rows' partial sums of squares) and the next product taking the
    norm from them: y's bits as without them, and the next product as RMSNorm then the product in fp32; each row's
    bits as when it comes alone."""
    k = hopper.Kernels("cuda")
    N, K, N2, eps = 4096, 14336, 6144, 1e-5
    w, x, res = _rand(N, K, seed=1, scale=K ** -0.5), _rand(64, K, seed=2), _rand(64, N, seed=3)
    w2 = _rand(N2, N, seed=4, scale=N ** -0.5)
    g = (1 + 0.3 * _rand(N, seed=5).float()).bfloat16()
    first = None
    for M in ROWS:
        y, xg, ss = k.linear(x[:M], w, hopper.EPI_RESID, res[:M], stats=g)
        assert torch.equal(y, k.linear(x[:M], w, hopper.EPI_RESID, res[:M]))
        assert torch.equal(xg, (y.float() * g.float()).bfloat16())
        assert ss.shape == (M, N // 8)
        torch.testing.assert_close(ss.sum(1), y.float().pow(2).sum(1), rtol=1e-4, atol=0)
        z = k.linear(xg, w2, norm=(ss, eps))
        h = y.float() * torch.rsqrt(y.float().pow(2).mean(1, keepdim=True) + eps) * g.float()
        ref = h @ w2.float().T
        assert (z.float() - ref).abs().max() < 1e-2 * ref.abs().max(), M
        first = first or (ss[:1], z[:1])
        assert torch.equal(ss[:1], first[0]) and torch.equal(z[:1], first[1]), M
    # the first layer's: the norm kernel's statistics, each row's as alone
    xg1, ss1 = k.rms_stats(res, g)
    assert torch.equal(xg1, (res.float() * g.float()).bfloat16())
    torch.testing.assert_close(ss1[:, 0], res.float().pow(2).sum(1), rtol=1e-4, atol=0)
    for M in (1, 5, 16):
        xgm, ssm = k.rms_stats(res[:M].contiguous(), g)
        assert torch.equal(xgm, xg1[:M]) and torch.equal(ssm, ss1[:M]), M


@pytest.mark.gpu
@sm90
def test_a_shape_the_kernels_refuse_is_an_error_not_a_crash():
    """The library's shape check (-1) through Kernels' call: a RuntimeError naming the entry point."""
    k = hopper.Kernels("cuda")
    with pytest.raises(RuntimeError, match="ek_hopper_linear: bad arguments"):
        k._call("ek_hopper_linear", hopper.LinearArgs(epi=hopper.EPI_PLAIN, M=0, N=8, K=2048, ldx=2048))


@pytest.mark.gpu
@sm90
@pytest.mark.parametrize("norm", [False, True])
def test_qkv_rotates_and_writes_the_cache(norm):
    """q/k/v with rotary, q out and k, v into the cache at base + row; with `norm`, the RMSNorm before it in the
    product (the norm statistics from rms_stats, as a layer's first norm): as RMSNorm then the product."""
    from eaglekit.models.config import RopeConfig
    from eaglekit.models.layers import Rotary, apply_rope

    H, Hkv, hd, K, cap, eps = 32, 8, 128, 4096, 300, 1e-5
    k = hopper.Kernels("cuda")
    w, x = _rand((H + 2 * Hkv) * hd, K, seed=4, scale=K ** -0.5), _rand(64, K, seed=5)
    g = (1 + 0.3 * _rand(K, seed=6).float()).bfloat16()
    pos = torch.arange(100, 164, device="cuda")
    rotary = Rotary(hd, RopeConfig(theta=500000.0)).cuda()
    cos, sin = rotary(pos, torch.bfloat16)
    outs = {}
    for M in (1, 7, 64):
        kc, vc = torch.zeros(2, Hkv, cap, hd, device="cuda", dtype=torch.bfloat16)
        base = torch.tensor([100], device="cuda")
        if norm:
            xg, ss = k.rms_stats(x[:M].contiguous(), g)
            q = k.qkv(xg, w, (H, Hkv, hd), kc, vc, pos[:M].contiguous(), rotary.inv_freq, base, norm=(ss, eps))
            h = x[:M].float() * torch.rsqrt(x[:M].float().pow(2).mean(1, keepdim=True) + eps) * g.float()
        else:
            q = k.qkv(x[:M], w, (H, Hkv, hd), kc, vc, pos[:M].contiguous(), rotary.inv_freq, base)
            h = x[:M].float()
        ref = (h @ w.float().T).bfloat16()
        rq, rk, rv = ref.split([H * hd, Hkv * hd, Hkv * hd], -1)
        rq = apply_rope(rq.view(M, H, hd).transpose(0, 1).float(), cos[:M].float(), sin[:M].float())
        rk = apply_rope(rk.view(M, Hkv, hd).transpose(0, 1).float(), cos[:M].float(), sin[:M].float())
        assert (q.view(M, H, hd).transpose(0, 1).float() - rq).abs().max() < 0.05 * rq.abs().max()
        assert (kc[:, 100:100 + M].float() - rk).abs().max() < 0.05 * rk.abs().max()
        rv = rv.view(M, Hkv, hd).transpose(0, 1).float()
        assert (vc[:, 100:100 + M].float() - rv).abs().max() < 0.02 * rv.abs().max()
        assert not kc[:, :100].any() and not kc[:, 100 + M:].any() and not vc[:, 100 + M:].any()
        outs[M] = (q, kc[:, 100:100 + M], vc[:, 100:100 + M])
    for M in (7, 64):  # row 0's bits as alone
        assert all(torch.equal(a[..., :1, :] if a.dim() == 3 else a[:1], b[..., :1, :] if b.dim() == 3 else b[:1])
                   for a, b in zip(outs[M], outs[1]))


@pytest.mark.gpu
@sm90
@pytest.mark.parametrize("P,rep,T", [(40, 4, 10), (255, 4, 10), (700, 8, 10), (1500, 2, 10), (5000, 4, 10),
                                     (300, 1, 10), (100, 4, 64), (33, 8, 64)])  # 5000: parts fold chunks
def test_attention_tree_rows_equal_rows_alone(P, rep, T):
    """A tree row's bits equal the same token attended alone with its keys in consecutive slots (the baseline's
    layout: its ancestors committed), and both agree with an fp64 attention. The tree's calls of three tiles or more
    run two tiles a block, the others and every row alone one: the comparison spans both launches."""
    rng = random.Random(P)
    Hkv, hd = 4, 128
    H = Hkv * rep
    S = P + T + 5
    kb = hopper.Kernels("cuda")
    q, kc, vc = _rand(T, H * hd, seed=P), _rand(Hkv, S, hd, seed=P + 1), _rand(Hkv, S, hd, seed=P + 2)
    paths = random_tree_paths(T, rng)
    block = torch.zeros(T, T, dtype=torch.bool, device="cuda")
    for t, path in enumerate(paths):
        block[t, path] = True
    mask = torch.zeros(1, T, S, dtype=torch.bool, device="cuda")
    mask[..., :P] = True
    mask[0, :, P:P + T] = block
    base = torch.tensor([P], device="cuda")
    tree = kb.attn(q, kc, vc, base, block, (H, Hkv, hd), kb.scratch(T, S, Hkv, rep))
    qd = q.view(T, H, hd).transpose(0, 1)[None].double()
    ref = torch.nn.functional.scaled_dot_product_attention(
        qd, kc[None].double().repeat_interleave(rep, 1), vc[None].double().repeat_interleave(rep, 1),
        attn_mask=mask[:, None])
    assert (tree.view(T, H, hd).transpose(0, 1)[None].double() - ref).abs().max() < 2e-2
    for t, path in enumerate(paths):
        k1, v1 = kc.clone(), vc.clone()
        k1[:, P:P + len(path)] = kc[:, [P + a for a in path]]
        v1[:, P:P + len(path)] = vc[:, [P + a for a in path]]
        b1 = torch.tensor([P + len(path) - 1], device="cuda")  # its ancestors committed, itself this call's
        one = torch.ones(1, 1, dtype=torch.bool, device="cuda")
        alone = kb.attn(q[t:t + 1].contiguous(), k1, v1, b1, one, (H, Hkv, hd), kb.scratch(1, S, Hkv, rep))
        assert torch.equal(alone[0], tree[t]), (P, t)
    assert not kb.tickets.any()  # every merge left its ticket at zero


def _target(products, layers=2):
    from helpers import hopper_target

    return hopper_target(products, layers)


@pytest.mark.gpu
@sm90
def test_decoder_tree_rows_equal_one_row_steps():
    """The whole decoder through the hopper layers: a tree's logits, row by row, bit-identical to stepping that row's
    path one token at a time (the baseline); and close to products "invariant" (other summation orders)."""
    t, ref = _target("hopper"), _target("invariant")
    rng = random.Random(0)
    prompt = torch.randint(0, 8192, (40,), device="cuda")
    for T in (1, 6, 9, 20):
        paths = random_tree_paths(T, rng)
        ids = torch.randint(0, 8192, (T,), device="cuda")
        block = torch.zeros(T, T, dtype=torch.bool, device="cuda")
        for i, path in enumerate(paths):
            block[i, path] = True
        depths = torch.tensor([len(p) - 1 for p in paths], device="cuda")
        outs = {}
        for name, tg in (("hopper", t), ("invariant", ref)):
            tg.reset(128)
            sequence.prefill(tg, prompt)
            outs[name] = sequence.verify(tg, ids, depths, block)[0]
        err = (outs["hopper"] - outs["invariant"]).abs().max() / outs["invariant"].abs().max()
        assert err < 0.05, (T, err)
        for i, path in enumerate(paths):
            t.reset(128)
            sequence.prefill(t, prompt)
            for a in path:
                logits = sequence.step(t, ids[a].view(1))
            assert torch.equal(logits, outs["hopper"][i]), (T, i)


def _pending_case(P, C, T, rep, seed):
    """A draft tree level: P committed slots, C pending columns of which this call's T are the last (slots
    P + C - T ..), the earlier ones in the cache and this call's only in kn/vn (the cache holds junk there)."""
    Hkv, hd = 2, 128
    H = Hkv * rep
    S = P + C + 3
    q = _rand(T, H * hd, seed=seed)
    kc, vc = _rand(Hkv, S, hd, seed=seed + 1), _rand(Hkv, S, hd, seed=seed + 2)
    # this call's keys as the draft's layer has them: k a transposed view, v a slice of a wider row
    kn = _rand(Hkv, T, hd, seed=seed + 3).transpose(0, 1)
    vn = _rand(T, Hkv * hd + 64, seed=seed + 4)[:, 32:32 + Hkv * hd].view(T, Hkv, hd)
    g = torch.Generator().manual_seed(seed)
    block = torch.rand(T, C, generator=g) < 0.5
    block[:, C - T:] = torch.eye(T, dtype=torch.bool)  # each row sees itself, not its siblings
    return q, kc, vc, kn, vn, block.cuda(), (H, Hkv, hd)


@pytest.mark.gpu
@sm90
@pytest.mark.parametrize("P,C,T,rep", [(40, 16, 4, 4), (517, 16, 4, 4), (700, 1, 1, 4), (3000, 8, 8, 8), (9, 6, 6, 2)])
def test_pending_attention_reads_this_calls_keys_apart(P, C, T, rep):
    """hopper.pending_attention (the draft's attention): this call's keys from kn/vn, every other from the cache, the
    same bits as the kernel with those keys written into the cache first, and an fp64 attention's values; and the
    op leaves them written into the cache, nothing else changed."""
    q, kc, vc, kn, vn, block, heads = _pending_case(P, C, T, rep, seed=P + C)
    H, Hkv, hd = heads
    base, first = torch.tensor([P], device="cuda"), torch.tensor([P + C - T], device="cuda")
    k1, v1 = kc.clone(), vc.clone()
    k1[:, P + C - T:P + C], v1[:, P + C - T:P + C] = kn.transpose(0, 1), vn.transpose(0, 1)
    got = hopper.pending_attention(q, kc, vc, kn, vn, base, block, first)
    assert torch.equal(kc, k1) and torch.equal(vc, v1)
    kb = hopper.kernels_for("cuda")
    want = kb.attn(q, k1, v1, base, block.contiguous(), heads, kb.scratch(T, kc.shape[1], Hkv, rep))
    assert torch.equal(got, want)
    mask = torch.zeros(T, kc.shape[1], dtype=torch.bool, device="cuda")
    mask[:, :P] = True
    mask[:, P:P + C] = block
    qd = q.view(T, H, hd).transpose(0, 1)[None].double()
    ref = torch.nn.functional.scaled_dot_product_attention(
        qd, k1[None].double().repeat_interleave(rep, 1), v1[None].double().repeat_interleave(rep, 1),
        attn_mask=mask[None, None])
    assert (got.view(T, H, hd).transpose(0, 1)[None].double() - ref).abs().max() < 2e-2
    assert not kb.tickets.any()


@pytest.mark.gpu
@sm90
def test_pending_attention_compiled_before_the_cache_write():
    """Under torch.compile, with the cache a narrowed view whose span is symbolic (as the draft's layer gets it):
    the compiled function's output and cache equal the eager one's, for two spans."""
    from torch._dynamo import maybe_mark_dynamic

    def layer(q, kc, vc, kn, vn, base, block, slots):
        out = hopper.pending_attention(q * 1, kc, vc, kn * 1, vn, base, block, slots[:1])  # (producers, as the layer's)
        return out * 1  # (an op after it, as o_proj is)

    compiled = torch.compile(layer, fullgraph=True)
    for P in (300, 301):
        C, T, rep = 16, 4, 4
        q, kc, vc, kn, vn, block, heads = _pending_case(P, C, T, rep, seed=7)
        base = torch.tensor([P], device="cuda")
        slots = torch.arange(P + C - T, P + C, device="cuda")
        caches = [(kc.clone(), vc.clone()) for _ in range(2)]
        views = [(k[:, :P + C], v[:, :P + C]) for k, v in caches]
        for t in views[1]:
            maybe_mark_dynamic(t, 1)
        eager = layer(q, *views[0], kn, vn, base, block, slots)
        got = compiled(q, *views[1], kn, vn, base, block, slots)
        assert torch.equal(eager, got)
        assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
        assert torch.equal(caches[1][0][:, P + C - T:P + C], kn.transpose(0, 1))
