"""The small-M product kernel (eaglekit.kernels.invariant_gemm) in Triton's interpreter on the CPU: right products, and
the same bits for a row whether it comes alone or among up to 15 others (what makes bf16 verify lossless).
fp16 here: the interpreter computes through numpy, which has no bfloat16 (the GPU tests cover bf16)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import use_triton_interpreter

use_triton_interpreter()  # before triton is imported

from eaglekit.kernels import invariant_gemm  # noqa: E402
from eaglekit.kernels.products import Invariant  # noqa: E402
from eaglekit.models.layers import MLP, set_products  # noqa: E402

CONFIGS = [(64, 128, 1, 4, 4), (32, 128, 2, 4, 4), (16, 64, 4, 4, 4), (128, 64, 8, 4, 4)]


def _ref(x, w):
    return F.linear(x.double(), w.double())


# 130, 200: blocks past N are masked. The default tier runs config 2 (16-column blocks, K in 4 slices: the most
# programs, 4-15 s each in the interpreter) at 130 x 512 only (masked and sliced), config 1 (K in 2 slices) at 96 and
# 130 x 512, and 200 x 1024 with configs 0 and 3; the rest in the slow tier
SLOW = {(96, 512, 2), (200, 1024, 2), (200, 1024, 1)}


@pytest.mark.parametrize("N,K,cfg", [pytest.param(N, K, cfg, id=f"{N}-{K}-cfg{i}",
                                                  marks=[pytest.mark.slow] if (N, K, i) in SLOW else [])
                                     for N, K in [(96, 512), (200, 1024), (130, 512)] for i, cfg in enumerate(CONFIGS)])
def test_products_are_right_and_rows_do_not_interact(cfg, N, K):
    if K % (cfg[1] * cfg[2]):
        pytest.skip("the slices must tile K")
    g = torch.Generator().manual_seed(N + K + cfg[0])
    w = (torch.randn(N, K, generator=g) * 0.05).half()
    x = torch.randn(16, K, generator=g).half()
    run = invariant_gemm.kernels().run
    full = run(x, w, cfg)
    ref = _ref(x, w)
    assert full.dtype == torch.float16 and full.shape == (16, N)
    assert (full.double() - ref).abs().max() <= 2e-3 * ref.abs().max()
    for M in (1, 2, 5, 16):
        part = run(x[:M], w, cfg)
        assert torch.equal(part, full[:M]), f"rows 0..{M - 1} round differently next to {16 - M} other rows"
    other = x.clone()
    other[1:] = torch.randn(15, K, generator=g).half()  # row 0 again, with other neighbours
    assert torch.equal(run(other, w, cfg)[0], full[0])
    more = torch.cat([x, torch.randn(21, K, generator=g).half()])  # 37 rows: three 16-row tiles
    assert torch.equal(run(more, w, cfg)[:16], full)


@pytest.mark.parametrize("cfg", [(32, 128, 1, 4, 4), (32, 128, 2, 4, 4)])  # epilogue in the product; in the sum
@pytest.mark.parametrize("gated,residual", [(True, False), (False, True), (True, True)])
def test_fused_epilogue_is_right_and_rows_do_not_interact(cfg, gated, residual):
    """The SwiGLU gate and the residual add done by the product's kernel (one slice of K) or by the kernel that sums
    the slices: right against float64, and each row the same bits alone or among others."""
    N, K = 96, 512
    g = torch.Generator().manual_seed(int(gated) + 2 * int(residual) + cfg[2])
    w = (torch.randn(2 * N if gated else N, K, generator=g) * 0.05).half()
    x = torch.randn(16, K, generator=g).half()
    r = torch.randn(16, N, generator=g).half() if residual else None
    run = invariant_gemm.kernels().run
    full = run(x, w, cfg, residual=r, gated=gated)
    assert full.shape == (16, N)
    ref = invariant_gemm.epilogue(_ref(x, w), r.double() if residual else None, gated)
    assert (full.double() - ref).abs().max() <= 4e-3 * ref.abs().max()
    if residual and not gated:  # rounded as the unfused ops round: the product in fp16, then the add
        assert torch.equal(full, (run(x, w, cfg).float() + r.float()).half())
    for M in (1, 5):
        part = run(x[:M], w, cfg, residual=r[:M] if residual else None, gated=gated)
        assert torch.equal(part, full[:M])


@pytest.mark.parametrize("block_n", [16, 32])
def test_rotary_in_the_product_is_right_and_rows_do_not_interact(block_n):
    """q/k/v product with the rotary embedding of q and k done by its kernel (v passes through): right against the
    float64 product rotated by layers.apply_rope, each row the same bits alone or among others."""
    from eaglekit.models.layers import apply_rope

    hd, H, Hkv, K = 64, 4, 2, 256
    N = (H + 2 * Hkv) * hd
    g = torch.Generator().manual_seed(block_n)
    w = (torch.randn(N, K, generator=g) * 0.05).half()
    x = torch.randn(16, K, generator=g).half()
    ang = torch.rand(16, hd // 2, generator=g, dtype=torch.float64) * 6
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rope = (cos.half(), sin.half(), (H + Hkv) * hd)
    run = invariant_gemm.kernels().run
    full = run(x, w, (block_n, 128, 1, 4, 4), rope=rope)
    y = _ref(x, w).view(16, H + 2 * Hkv, hd).transpose(0, 1)  # [heads, rows, hd]
    c, s = rope[0].double(), rope[1].double()
    ref = torch.cat([apply_rope(y[:H + Hkv], c, s), y[H + Hkv:]]).transpose(0, 1).reshape(16, N)
    assert (full.double() - ref).abs().max() <= 4e-3 * ref.abs().max()
    assert torch.equal(full[:, (H + Hkv) * hd:], run(x, w, (2 * block_n, 128, 1, 4, 4))[:, (H + Hkv) * hd:])
    for M in (1, 5):
        assert torch.equal(run(x[:M], w, (block_n, 128, 1, 4, 4), rope=(rope[0][:M], rope[1][:M], rope[2])),
                           full[:M])
    with pytest.raises(ValueError, match="rotary"):
        run(x, w, (block_n, 128, 2, 4, 4), rope=rope)


def test_invariant_policy_fuses_the_mlp_epilogue_and_keeps_rows_apart():
    """An MLP under the invariant policy: gate and residual in the kernels (what the policy does by default), right
    against the same policy with the epilogue in torch, and each row the same bits alone or among six."""
    from eaglekit.kernels.products import Invariant

    torch.manual_seed(1)
    m = MLP(128, 256).half()
    m.fuse()
    policy = Invariant()
    set_products([m], policy)
    x, r = torch.randn(1, 6, 128).half(), torch.randn(1, 6, 128).half()
    calls = []
    op = invariant_gemm.kernels().op
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(invariant_gemm.kernels(), "op", lambda *a: calls.append(a[2:4]) or op(*a))
        many = m(x, residual=r)
    assert [(res is not None, gated) for res, gated in calls] == [(False, True), (True, False)]
    with torch.no_grad():
        for i in range(6):
            assert torch.equal(m(x[:, i:i + 1], residual=r[:, i:i + 1]), many[:, i:i + 1])
        policy.fuses = False
        try:
            apart = m(x, residual=r)
        finally:
            policy.fuses = True
    assert (apart.double() - many.double()).abs().max() < 1e-2 * many.double().abs().max()


def test_linear_routes_by_dtype_rows_and_flag():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(64, 256, generator=g) * 0.05).half()
    b = torch.randn(64, generator=g).half()
    x = torch.randn(2, 3, 256, generator=g).half()
    assert invariant_gemm.usable(x, w)
    y = invariant_gemm.linear(x, w, b)
    assert y.shape == (2, 3, 64)
    assert (y.double() - (_ref(x, w) + b.double())).abs().max() < 5e-2
    assert invariant_gemm.usable(torch.randn(17, 256).half(), w)  # two tiles
    assert not invariant_gemm.usable(torch.randn(65, 256).half(), w)  # more rows than MAX_ROWS
    assert not invariant_gemm.usable(x.float(), w.float())  # fp32: tensor cores would round to tf32
    assert not invariant_gemm.usable(x, w.t().contiguous().t())  # columns not contiguous
    assert torch.equal(invariant_gemm.linear(x.float(), w.float()), F.linear(x.float(), w.float()))
    assert torch.equal(invariant_gemm.linear(x, w, enabled=False), F.linear(x, w))


def test_mlp_rows_are_batch_invariant_with_small_m():
    """An MLP (fused gate/up, down) routed through invariant_gemm gives each row the same bits alone or among 6 rows;
    routed through F.linear on the CPU that is not promised, so the test is about the routing, not luck."""
    torch.manual_seed(0)
    m = MLP(128, 256).half()
    m.fuse()
    set_products([m], Invariant())
    x = torch.randn(1, 6, 128).half()
    with torch.no_grad():
        many = m(x)
        for i in range(6):
            assert torch.equal(m(x[:, i:i + 1]), many[:, i:i + 1])
    set_products([m], None)
    with torch.no_grad():
        assert (m(x).double() - many.double()).abs().max() < 1e-2


def test_config_depends_on_the_weight_only_and_tiles_k():
    for N, K in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (32000, 4096),
                 (4096, 12288), (96, 512)]:
        block_n, block_k, split, warps, stages = invariant_gemm.config(N, K)
        assert K % (block_k * split) == 0 and block_n * block_k <= 128 * 256
        block_n, block_k, split, warps, stages = invariant_gemm.int8_rule(N, K)
        assert K % (block_k * split) == 0 and block_n * block_k <= 128 * 256
    # the H200 sweep's winners for the 8B draft (quant_probe.py), the o product's within 1%
    assert [invariant_gemm.int8_rule(N, K) for N, K in [(6144, 8192), (28672, 4096), (4096, 14336), (32000, 4096)]] == [
        (64, 256, 4, 4, 3), (128, 256, 1, 4, 3), (64, 256, 4, 4, 3), (128, 256, 1, 4, 3)]


def test_config_is_traced_without_a_graph_break_once_the_table_is_read(monkeypatch, tmp_path):
    """invariant_gemm.config runs inside every compiled layer. Its tuned table is read from disk once, before any trace
    (kernels() reads it); a read inside the trace (a stat of the file) would break the graph at each product, as
    the functools cache it replaced did on the GPU."""
    import json

    table = tmp_path / "invariant_gemm.json"
    table.write_text(json.dumps({"64x32": [32, 128, 1, 4, 3]}))
    monkeypatch.setattr(invariant_gemm, "_read_table", lambda: json.loads(table.read_text()) if table.exists() else {})

    def layer(x):
        y = (x * 2).sin()
        return (y * 3).cos() + invariant_gemm.config(64, 32)[0]

    def breaks():
        torch._dynamo.reset()
        return torch._dynamo.explain(layer)(torch.randn(4)).graph_break_count

    monkeypatch.setattr(invariant_gemm, "_TABLE", None)
    assert breaks() == 1  # the test can fail: reading inside the trace breaks the graph
    monkeypatch.setattr(invariant_gemm, "_TABLE", None)
    invariant_gemm.kernels()  # what the products policy calls before compiling
    assert invariant_gemm._TABLE == {"64x32": [32, 128, 1, 4, 3]}
    assert breaks() == 0
    torch._dynamo.reset()


@pytest.mark.parametrize("cfg", [(32, 256, 1, 4, 4), (32, 128, 2, 4, 4)])  # epilogue in the product; in the sum
@pytest.mark.parametrize("gated,residual", [(False, False), (True, False), (False, True)])
def test_int8_weights_are_widened_and_scaled_in_the_kernel(cfg, gated, residual):
    """An int8 weight with a scale per row (eaglekit.kernels.int8, the draft's --draft-quant int8): the kernel widens
    its tiles and scales each column's sum, epilogues included; right against float64 over the dequantized weight,
    for 1 to 16 rows."""
    from eaglekit.kernels import int8

    N, K = 96, 512
    g = torch.Generator().manual_seed(int(gated) + 2 * int(residual) + cfg[2])
    w = torch.randn(2 * N if gated else N, K, generator=g) * 0.05
    q, s = int8.quantize(w)
    x = torch.randn(16, K, generator=g).half()
    r = torch.randn(16, N, generator=g).half() if residual else None
    run = invariant_gemm.kernels().run
    full = run(x, q, cfg, residual=r, gated=gated, scale=s)
    ref = invariant_gemm.epilogue(_ref(x, q.double() * s.double()[:, None]), r.double() if residual else None, gated)
    assert full.shape == (16, N)
    assert (full.double() - ref).abs().max() <= 4e-3 * ref.abs().max()
    # the test can fail: a scale left out is far off
    unscaled = invariant_gemm.epilogue(_ref(x, q.double()), None, gated)
    assert (unscaled - invariant_gemm.epilogue(_ref(x, q.double() * s.double()[:, None]), None, gated)).abs().max() > 1
    for M in (1, 5):
        part = run(x[:M], q, cfg, residual=r[:M] if residual else None, gated=gated, scale=s)
        assert (part.double() - ref[:M]).abs().max() <= 4e-3 * ref.abs().max()
    y = invariant_gemm.linear(x[None, :3], q, residual=r[None, :3] if residual else None, gated=gated, scale=s)
    assert y.shape == (1, 3, N) and (y[0].double() - ref[:3]).abs().max() <= 4e-3 * ref.abs().max()
    with pytest.raises(ValueError, match="int8"):
        invariant_gemm.linear(x, q)  # an int8 weight without its scale


def test_int8_rule_takes_a_k_no_tile_divides():
    """An int8 weight whose K no 128-column tile divides still gets a config (one slice; the kernel masks K), and
    the product is right."""
    from eaglekit.kernels import int8

    assert invariant_gemm.int8_rule(96, 200) == (64, 128, 1, 4, 3)
    g = torch.Generator().manual_seed(3)
    q, s = int8.quantize(torch.randn(96, 200, generator=g) * 0.05)
    x = torch.randn(2, 200, generator=g).half()
    y = invariant_gemm.linear(x, q, scale=s)
    ref = _ref(x, q.double() * s.double()[:, None])
    assert (y.double() - ref).abs().max() <= 4e-3 * ref.abs().max()


@pytest.mark.parametrize("kind", ["plain", "split", "gated_residual", "rope", "int8"])
def test_shared_tiles_give_each_row_its_own_bits(kind):
    """Programs of 2 or 4 16-row tiles against one read of the weight tile (tiles_for, $EAGLEKIT_GEMM_TILES), their
    column blocks narrowed: every row the bits it has with one tile a program, and alone, for 64 and 37 rows (masked
    tiles), through every epilogue: the gate and residual, the rotary, the int8 scale, partial sums over K slices."""
    from eaglekit.kernels import int8

    g = torch.Generator().manual_seed(7)
    N, K = 96, 512
    kw, cfg = {}, (64, 128, 1, 4, 4)
    w = (torch.randn(N, K, generator=g) * 0.05).half()
    x = torch.randn(64, K, generator=g).half()
    if kind == "split":
        cfg = (32, 128, 2, 4, 4)
    elif kind == "gated_residual":
        w = (torch.randn(2 * N, K, generator=g) * 0.05).half()
        kw = {"gated": True, "residual": torch.randn(64, N, generator=g).half()}
    elif kind == "rope":
        hd = 64  # q, k, v heads of 64 columns: the rotary below column 128
        w = (torch.randn(3 * hd, K, generator=g) * 0.05).half()
        ang = torch.rand(64, hd // 2, generator=g, dtype=torch.float64) * 6
        kw = {"rope": (torch.cat([ang, ang], -1).cos().half(), torch.cat([ang, ang], -1).sin().half(), 2 * hd)}
        cfg = (32, 128, 1, 4, 4)  # rope_config's: block_n of half a head
    elif kind == "int8":
        w, s = int8.quantize(torch.randn(N, K, generator=g) * 0.05)
        kw = {"scale": s}
    run = invariant_gemm.kernels().run

    def rows(lo, hi):
        return {k: (v[lo:hi] if isinstance(v, torch.Tensor) and k != "scale" else
                    (v[0][lo:hi], v[1][lo:hi], v[2]) if k == "rope" else v) for k, v in kw.items()}

    one = run(x, w, cfg, tiles=1, **kw)
    assert invariant_gemm.tiles_for(64, cfg[0], 4) == (4, max(16, cfg[0] // 4))
    for tiles in (2, 4):
        assert torch.equal(run(x, w, cfg, tiles=tiles, **kw), one), tiles
        assert torch.equal(run(x[:37], w, cfg, tiles=tiles, **rows(0, 37)), one[:37]), tiles
    assert torch.equal(run(x[5:6], w, cfg, tiles=4, **rows(5, 6))[0], one[5])
    with pytest.raises(ValueError, match="tiles"):
        invariant_gemm.tiles_for(64, 64, 3)


@pytest.mark.parametrize("most", [1, 4])
def test_a_graph_compiled_for_every_length_reads_no_row_count_for_its_tiles(most):
    """A prompt graph (compiling.compile_prompt: dynamic sizes) runs the products for every token count: tiles_for of a
    symbolic M picks its tiles without reading M, so one graph serves 2 to 60 rows (reading it would compile a graph
    per tile count, seconds each on a GPU). The choice never changes a row's bits
    (test_shared_tiles_give_each_row_its_own_bits)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    fn = torch.compile(lambda x: x * invariant_gemm.tiles_for(x.shape[0], 64, most)[0], dynamic=True, backend=counter)
    torch._dynamo.reset()
    for m in (2, 20, 40, 60):
        assert torch.equal(fn(torch.ones(m)), torch.full((m,), float(most)))
    assert counter.frame_count == 1
    assert invariant_gemm.tiles_for(20, 64, most)[0] == min(most, 2)  # a real M still picks the fewest tiles
    torch._dynamo.reset()
