"""The attention of eaglekit.models.layers: grouped query heads folded into query rows (sdpa_folded) computes SDPA's
enable_gqa attention, for one sequence and for rows of their own lengths, and cached decode calls on a GPU take it."""

import pytest
import torch
import torch.nn.functional as F

from eaglekit.models import layers
from eaglekit.models.layers import sdpa_folded

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _case(device, dtype, B, Bm, H, Hkv, T, S, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, 16, generator=g).to(device, dtype).transpose(1, 2)  # as Attention makes it: strided
    k, v = (torch.randn(B, Hkv, S, 16, generator=g).to(device, dtype) for _ in range(2))
    # per row: every slot below its own length, then a tree block over the last T slots
    lengths = torch.randint(1, S - T + 1, (Bm,), generator=g)
    block = torch.rand(Bm, T, T, generator=g) < 0.5
    block |= torch.eye(T, dtype=torch.bool)
    mask = torch.zeros(Bm, T, S, dtype=torch.bool)
    for b in range(Bm):
        mask[b, :, :lengths[b]] = True
        mask[b, :, lengths[b]:lengths[b] + T] = block[b]
    return q, k, v, mask[:, None].to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,Bm,H,Hkv,T", [(1, 1, 8, 2, 1), (1, 1, 8, 2, 6), (4, 4, 8, 2, 4), (3, 1, 6, 3, 5),
                                          (2, 2, 4, 4, 3)])
def test_folded_heads_compute_grouped_query_attention(device, B, Bm, H, Hkv, T):
    dtype = torch.float64 if device == "cpu" else torch.float32
    for seed in range(3):
        q, k, v, mask = _case(device, dtype, B, Bm, H, Hkv, T, 40, seed)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)
        got = sdpa_folded(q, k, v, mask)
        assert got.shape == want.shape == (B, H, T, 16)
        torch.testing.assert_close(got, want, atol=1e-5 if dtype == torch.float32 else 1e-12, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cached_decode_calls_on_a_gpu_fold_and_prompts_do_not(monkeypatch):
    """Trees and extends of up to FOLD_GQA_MAX_TOKENS tokens fold; one token a row and prompts keep enable_gqa."""
    att = layers.Attention(64, 8, 2, 8, 64).cuda()
    seen = []
    real = layers.sdpa_folded
    monkeypatch.setattr(layers, "sdpa_folded", lambda *a: seen.append(a[0].shape[2]) or real(*a))
    S = 128
    cache = tuple(torch.zeros(1, 2, S, 8, device="cuda") for _ in range(2))
    cos = torch.ones(1, 1, 8, device="cuda")
    sin = torch.zeros(1, 1, 8, device="cuda")
    for T in (1, 4, layers.FOLD_GQA_MAX_TOKENS + 1):
        x = torch.randn(1, T, 64, device="cuda")
        mask = torch.ones(1, T, S, dtype=torch.bool, device="cuda")
        att(x, cos, sin, kv=cache, slots=torch.arange(T, device="cuda"), mask=mask)
    assert seen == [4]


@pytest.mark.parametrize("dtype,folded", [(torch.bfloat16, [1, 4]), (torch.float32, [])])
def test_cached_decode_calls_on_a_cpu_fold_in_bfloat16_only(monkeypatch, dtype, folded):
    """On a CPU, bfloat16 cached calls of one token and of a few fold (torch's CPU SDPA with enable_gqa is slow on one
    bfloat16 row: D63); float32 keeps enable_gqa (its rounding is the float32 identity's, D60); so do calls past
    FOLD_GQA_MAX_TOKENS. The folded output is the enable_gqa one to rounding."""
    att = layers.Attention(64, 8, 2, 8, 64).to(dtype)
    seen = []
    real = layers.sdpa_folded
    monkeypatch.setattr(layers, "sdpa_folded", lambda *a: seen.append(a[0].shape[2]) or real(*a))
    S = 128
    cos, sin = torch.ones(1, 1, 8, dtype=dtype), torch.zeros(1, 1, 8, dtype=dtype)
    for T in (1, 4, layers.FOLD_GQA_MAX_TOKENS + 1):
        cache = tuple(torch.randn(1, 2, S, 8, generator=torch.Generator().manual_seed(T)).to(dtype) for _ in range(2))
        x = torch.randn(1, T, 64, generator=torch.Generator().manual_seed(T)).to(dtype)
        mask = torch.ones(1, T, S, dtype=torch.bool)
        with torch.inference_mode():
            got, _ = att(x, cos, sin, kv=cache, slots=torch.arange(T), mask=mask)
            monkeypatch.setattr(layers, "folds_gqa", lambda q, T: False)
            want, _ = att(x, cos, sin, kv=cache, slots=torch.arange(T), mask=mask)
            monkeypatch.undo()
            monkeypatch.setattr(layers, "sdpa_folded", lambda *a: seen.append(a[0].shape[2]) or real(*a))
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=0)
    assert seen == folded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_row", [False, True])
def test_q_and_k_rotated_together_are_the_two_rotations_bit_for_bit(dtype, per_row):
    """Attention._qkv rotates q and k in one pass over their heads side by side (half the ops of a step's rope): the
    result equals apply_rope on each alone, bit for bit, with cos/sin per token [T, hd], per row [B, T, hd] and already
    broadcast over the heads [B, 1, T, hd] (what LlamaModel passes for per-row positions)."""
    torch.manual_seed(0)
    B, T, H, Hkv, hd = 3, 5, 6, 2, 16
    att = layers.Attention(48, H, Hkv, hd, 48).to(dtype)
    att.fuse()
    rot = layers.Rotary(hd, layers.RopeConfig())
    positions = torch.randint(0, 500, (B, T)) if per_row else torch.arange(7, 7 + T)
    cos, sin = rot(positions, dtype)
    x = torch.randn(B, T, 48).to(dtype)
    qkv = F.linear(x, att.qkv_weight)
    q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1))
    want = (layers.apply_rope(q, cos, sin), layers.apply_rope(k, cos, sin), v)
    forms = [(cos, sin)] + ([(cos[:, None], sin[:, None])] if per_row else [])
    for c, s in forms:
        got = att._qkv(x, c, s)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.equal(g, w)
