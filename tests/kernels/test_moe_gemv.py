"""The routed experts' decode kernels (eaglekit.kernels.moe_gemv) in Triton's interpreter on the CPU: each token's
experts computed as Experts.gather computes them, the same bits for a token alone or among others, and the MoE module
taking them under mode "triton". fp16 here: the interpreter computes through numpy, which has no bfloat16."""

import pytest
import torch
from helpers import use_triton_interpreter

use_triton_interpreter()  # before triton is imported

from eaglekit.kernels import moe_gemv  # noqa: E402

# E experts, intermediate I, hidden D, k experts a token: I and D off the blocks (masked rows and columns)
SHAPES = [(8, 40, 300, 3), (6, 16, 256, 2)]


def _weights(E, I, D, seed):
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(E, 2 * I, D, generator=g) * D ** -0.5).half()
    down = (torch.randn(E, D, I, generator=g) * I ** -0.5).half()
    return g, gate_up, down


def _route(g, N, E, k):
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)])
    w = torch.rand(N, k, generator=g)
    return idx, w


@pytest.mark.parametrize("E,I,D,k", SHAPES)
def test_experts_equal_the_gathers_arithmetic_and_a_token_alone(E, I, D, k):
    g, gate_up, down = _weights(E, I, D, E + I)
    N = 5
    x = torch.randn(N, D, generator=g).half()
    idx, w = _route(g, N, E, k)
    y = moe_gemv.experts(x, gate_up, down, idx, w)
    want = moe_gemv.reference(x.double(), gate_up.double(), down.double(), idx, w.double())
    assert y.dtype == torch.float16 and y.shape == (N, D)
    torch.testing.assert_close(y.double(), want, atol=2e-3 * want.abs().max().item(), rtol=0)
    for n in range(N):  # a token's bits do not depend on the tokens beside it
        alone = moe_gemv.kernels().run(x[n:n + 1], gate_up, down, idx[n:n + 1], w[n:n + 1])
        assert torch.equal(alone[0], y[n]), n


def test_the_moe_module_takes_the_kernels_in_triton_mode():
    from eaglekit.models.moe import Experts

    class C:  # the config fields Experts reads
        n_routed_experts, moe_intermediate_size, hidden_size = 8, 40, 300

    ex = Experts(C())
    g, gate_up, down = _weights(8, 40, 300, 11)
    with torch.no_grad():
        ex.gate_up_proj.copy_(gate_up.float())
        ex.down_proj.copy_(down.float())
    ex.half()
    x = torch.randn(3, 300, generator=g).half()
    idx, w = _route(g, 3, 8, 2)
    ex.mode = "gather"
    ref = ex(x, idx, w)
    ex.mode = "triton"
    got = ex(x, idx, w)
    torch.testing.assert_close(got, ref, atol=2e-3 * ref.abs().max().item(), rtol=0)
    assert torch.equal(got, moe_gemv.experts(x, ex.gate_up_proj, ex.down_proj, idx, w))
    ex.float()  # float32: not the kernels' dtype, the per-call choice runs instead
    assert torch.equal(ex(x.float(), idx, w), Experts.gather(ex, x.float(), idx, w, fused=False))
