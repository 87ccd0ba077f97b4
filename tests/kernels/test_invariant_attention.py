"""Batch-invariant decode attention (eaglekit.kernels.invariant_attention) and the "invariant" products policy, in
Triton's interpreter on the CPU: right results against float64 SDPA, a tree row's bits equal to the same token attended
alone with its keys in consecutive slots (what the baseline step sees), and a model whose decode runs every
product and attention through the kernels. fp16 and fp32 here (the interpreter has no bfloat16; tests/gpu/test_gpu.py
runs bf16 on the GPU)."""

import random

import pytest
import torch
import torch.nn.functional as F
from helpers import use_triton_interpreter

use_triton_interpreter()  # before triton is imported

import sequence  # noqa: E402

from eaglekit.kernels import invariant_attention  # noqa: E402


def _tree(rng, T):
    """Random parents (node 0 the root, a parent before its child), as the engine lays trees out."""
    return [-1] + [rng.randrange(0, i) for i in range(1, T)]


def _ancestry(parents, t):
    path = []
    while t >= 0:
        path.append(t)
        t = parents[t]
    return path[::-1]


def _case(seed, T, P, S, H, Hkv, hd, dtype, B=1):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, hd, generator=g).to(dtype)
    k = torch.randn(B, Hkv, S + 1, hd, generator=g).to(dtype)
    v = torch.randn(B, Hkv, S + 1, hd, generator=g).to(dtype)
    parents = [_tree(rng, T) for _ in range(B)]
    mask = torch.zeros(B, T, S, dtype=torch.bool)
    mask[:, :, :P] = True
    for b in range(B):
        for t in range(T):
            mask[b, t, [P + a for a in _ancestry(parents[b], t)]] = True
    return q, k, v, mask, parents


def _ref(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    S = mask.shape[-1]
    kk = k[:, :, :S].double().repeat_interleave(rep, 1)
    vv = v[:, :, :S].double().repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q.double(), kk, vv, attn_mask=mask[:, None])


def test_visible_lists_each_rows_slots_in_order():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 5, 37, generator=g) < 0.4
    mask[..., 0] = True
    slots, count, old = invariant_attention.visible(mask)
    assert old is None  # no base: nothing is read apart from the cache
    base = torch.tensor([11, 30])
    _, _, old = invariant_attention.visible(mask, base)
    for b in range(2):
        for t in range(5):
            want = mask[b, t].nonzero().flatten()
            assert int(count[b, t]) == want.numel()
            assert torch.equal(slots[b, t, :want.numel()].long(), want)
            assert int(old[b, t]) == int((want < base[b]).sum())  # the leading ones held by the cache


# parts: the interpreter runs programs one by one, each part of each row a program, so 16 parts of a 1-chunk prefix
# cost 16 times 2 parts (a part's arithmetic does not depend on how many there are). 300 keys over 2 parts: part 0
# takes chunks 0 and 2, a part of several chunks checked against SDPA; 600 keys over the real 16 parts
@pytest.mark.parametrize("dtype,H,Hkv,hd,P,parts", [(torch.float16, 4, 2, 64, 5, 2), (torch.float32, 4, 4, 32, 300, 2),
                                                     (torch.float16, 8, 2, 80, 600, 16)])  # 80: head_dim padded
def test_attention_is_right(monkeypatch, dtype, H, Hkv, hd, P, parts):
    monkeypatch.setattr(invariant_attention, "PARTS", parts)
    T, S = 7, P + 20
    q, k, v, mask, _ = _case(P + hd, T, P, S, H, Hkv, hd, dtype, B=2)
    out = invariant_attention.attend(q, k[:, :, :S], v[:, :, :S], *invariant_attention.visible(mask))
    assert out.dtype == dtype and out.shape == q.shape
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    assert (out.double() - _ref(q, k, v, mask)).abs().max() < tol


# parts as above: the default tier runs 3 keys over 2 parts (16 cost 5 times the time), 127 (crossing a chunk
# boundary) over the real 16, and 300 over 2 parts, where a part takes chunks 0 and 2 as it does past
# PARTS * CHUNK = 2048 keys with 16 (prefix 2100, 26 s in the interpreter). Seeds 1, 3 and 4 over 16 parts in the
# slow tier: the default one took 940 s on an AVX2-only 2-core machine, over its 10 minutes
@pytest.mark.parametrize("seed,dtype,parts", [(0, torch.float16, 2),
                                              pytest.param(1, torch.float32, 16, marks=pytest.mark.slow),
                                              (2, torch.float16, 16), (3, torch.float16, 2),
                                              pytest.param(3, torch.float16, 16, marks=pytest.mark.slow),
                                              pytest.param(4, torch.float32, 16, marks=pytest.mark.slow)])
def test_a_tree_row_has_the_bits_of_the_token_attended_alone(monkeypatch, seed, dtype, parts):
    """Row t of a verify tree sees the prefix, its ancestors and itself at scattered slots; the baseline sees the
    same keys in consecutive slots, one query row. The kernel must give both the same bits, also across
    chunk boundaries (prefixes past 256 keys) and with a mask of batch 1 shared by every row."""
    monkeypatch.setattr(invariant_attention, "PARTS", parts)
    rng = random.Random(seed)
    T, P = rng.randint(2, 12), [3, 120, 127, 300, 2100][seed]  # 2100: past PARTS * CHUNK keys
    S = P + T + rng.randint(0, 40)
    q, k, v, mask, parents = _case(seed, T, P, S, 8, 2, 64, dtype)
    tree = invariant_attention.attend(q, k[:, :, :S], v[:, :, :S], *invariant_attention.visible(mask))
    # as in a decode call: the tree's own keys come from k_new/v_new (not yet in the cache, whose slots from P on
    # hold other values here), the committed ones from the cache: the same bits
    junk_k, junk_v = k.clone(), v.clone()
    junk_k[:, :, P:], junk_v[:, :, P:] = -k[:, :, P:], 2 * v[:, :, P:]
    new = (k[:, :, P:P + T], v[:, :, P:P + T], torch.tensor([P]))
    vis = invariant_attention.visible(mask, new[2])
    assert torch.equal(invariant_attention.attend(q, junk_k[:, :, :S], junk_v[:, :, :S], *vis, new=new), tree)
    with pytest.raises(ValueError, match="old"):  # which keys the cache holds must come with the new ones
        invariant_attention.attend(q, junk_k[:, :, :S], junk_v[:, :, :S], *invariant_attention.visible(mask), new=new)
    for t in range(T):
        path = _ancestry(parents[0], t)
        k1, v1 = k.clone(), v.clone()
        k1[:, :, P:P + len(path)] = k[:, :, [P + a for a in path]]
        v1[:, :, P:P + len(path)] = v[:, :, [P + a for a in path]]
        m1 = torch.zeros(1, 1, S, dtype=torch.bool)
        m1[..., :P + len(path)] = True
        alone = invariant_attention.attend(q[:, :, t:t + 1], k1[:, :, :S], v1[:, :, :S],
                                           *invariant_attention.visible(m1))
        assert torch.equal(alone[:, :, 0], tree[:, :, t]), f"row {t} (depth {len(path) - 1}) rounds differently"


@pytest.fixture
def few_parts(monkeypatch):
    """The tests from here on run the attention with 2 parts instead of 16: the interpreter runs programs one by
    one, and the kernel tests above cover the 16 parts (a part's arithmetic does not depend on how many there are)."""
    monkeypatch.setattr(invariant_attention, "PARTS", 2)


def test_strided_views_of_the_qkv_product_are_read_in_place_with_the_same_bits(monkeypatch, few_parts):
    """A verify's q, k_new and v_new are transposed views of one [B, T, (H + 2 Hkv) hd] product output: the kernel
    reads them through their strides (no copy: `contiguous` is never called on them) with the bits of contiguous
    copies, and its output transposed back to [B, T, H, hd] is contiguous (the caller's reshape is a view)."""
    B, T, P, S, H, Hkv, hd = 2, 6, 40, 50, 8, 2, 64
    q, k, v, mask, _ = _case(3, T, P, S, H, Hkv, hd, torch.float16, B=B)
    qkv = torch.cat([q.transpose(1, 2).reshape(B, T, H * hd), k[:, :, P:P + T].transpose(1, 2).reshape(B, T, -1),
                     v[:, :, P:P + T].transpose(1, 2).reshape(B, T, -1)], -1)
    qs, ks, vs = (t.view(B, T, -1, hd).transpose(1, 2) for t in qkv.split([H * hd, Hkv * hd, Hkv * hd], -1))
    assert not (qs.is_contiguous() or ks.is_contiguous() or vs.is_contiguous())
    base = torch.tensor([P])
    vis = invariant_attention.visible(mask, base)
    want = invariant_attention.attend(q, k[:, :, :S], v[:, :, :S], *vis, new=(ks.contiguous(), vs.contiguous(), base))
    copies = []
    real = torch.Tensor.contiguous

    def spy(t, *a, **kw):
        copies.append(t.data_ptr() in (qs.data_ptr(), ks.data_ptr(), vs.data_ptr()) and not t.is_contiguous())
        return real(t, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "contiguous", spy)
    got = invariant_attention.attend(qs, k[:, :, :S], v[:, :, :S], *vis, new=(ks, vs, base))
    monkeypatch.undo()
    assert not any(copies)
    assert torch.equal(got, want)
    assert got.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("hole", [1, 130])
def test_rows_that_see_the_whole_prefix_skip_the_slot_table_with_the_same_bits(monkeypatch, few_parts, hole):
    """A row that sees every committed key (old == base) reads key j at slot j without the slot table (DIRECT);
    the bits must be the table's. A row with a hole in its prefix (a hidden slot) must take the table: sequence 0
    of the batch goes direct, sequence 1 (the hole) through the table, in one call."""
    T, P, S = 5, 200, 230
    q, k, v, mask, _ = _case(7, T, P, S, 4, 2, 64, torch.float16, B=2)
    mask[1, :, hole] = False  # sequence 1 only: in one call, one sequence direct and one not
    new = (k[:, :, P:P + T], v[:, :, P:P + T], torch.tensor([P]))
    junk_k, junk_v = k.clone(), v.clone()
    junk_k[:, :, P:], junk_v[:, :, P:] = -k[:, :, P:], 2 * v[:, :, P:]
    vis = invariant_attention.visible(mask, new[2])
    direct = invariant_attention.attend(q, junk_k[:, :, :S], junk_v[:, :, :S], *vis, new=new)
    monkeypatch.setattr(invariant_attention, "DIRECT", False)
    table = invariant_attention.attend(q, junk_k[:, :, :S], junk_v[:, :, :S], *vis, new=new)
    assert torch.equal(direct, table)
    assert (direct.double() - _ref(q, k, v, mask)).abs().max() < 2e-3


def _invariant_target(model_dirs, family):
    from eaglekit.models import load_target

    t = load_target(model_dirs[family], backend="ours", dtype="float16")
    t.set_products("invariant")
    return t


def test_invariant_decode_runs_only_the_kernels(tmp_path, monkeypatch, few_parts):
    """Every product, attention and norm of a decode call goes through the Triton kernels (none falls back to
    F.linear or SDPA), and a token's logits are the same bits stepped alone or as row 0 of a 5-row chain."""
    from helpers import make_hf_model

    from eaglekit.kernels import invariant_gemm, invariant_norm

    # the test llama with 2 layers instead of 8 (17 s in the interpreter): every layer runs the same calls, and the
    # counts below are per layer
    make_hf_model(tmp_path, "llama", seed=10, layers=2)
    t = _invariant_target({"llama": tmp_path}, "llama")
    calls = {"attend": 0, "linear": 0, "norm": 0}
    attend_op, linear_op, norm_op = (invariant_attention.kernels().op, invariant_gemm.kernels().op,
                                     invariant_norm.kernels().op)

    def count(name, fn):
        def f(*a):
            calls[name] += 1
            return fn(*a)
        return f

    monkeypatch.setattr(invariant_attention.kernels(), "op", count("attend", attend_op))
    monkeypatch.setattr(invariant_gemm.kernels(), "op", count("linear", linear_op))
    monkeypatch.setattr(invariant_norm.kernels(), "op", count("norm", norm_op))
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: pytest.fail("SDPA in a decode call"))
    monkeypatch.setattr(F, "linear", lambda *a, **k: pytest.fail("F.linear in a decode call"))
    t.reset(64)
    sequence.prefill(t, torch.tensor([5, 9, 14, 3, 7]))  # (a prompt of up to 64 tokens takes the kernels too)
    n = t.info.num_layers
    want = {"attend": n, "linear": 4 * n + 1, "norm": 2 * n + 1}
    assert calls == want
    calls.update(attend=0, linear=0, norm=0)
    tok = torch.tensor([11])
    alone = sequence.step(t, tok, 1)
    assert calls == want
    t.cache.length.fill_(5)
    chain = sequence.step(t, tok, 5)
    assert torch.equal(alone, chain)


def test_invariant_decode_rotates_q_and_k_in_the_product(tmp_path, monkeypatch, few_parts):
    """Heads of 64 (the test models' 16 are too narrow for the kernel's 16-column half-head tiles): the q/k/v product
    does the rotary embedding itself in every layer; the logits are near those with the rotary in torch, and a
    token's logits are the same bits stepped alone or as row 0 of a 5-row chain."""
    from helpers import make_hf_model

    from eaglekit.kernels import invariant_gemm
    from eaglekit.kernels.products import Invariant
    from eaglekit.models import load_target

    make_hf_model(tmp_path, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    t = load_target(tmp_path, backend="ours", dtype="float16")
    t.set_products("invariant")
    ropes = []
    op = invariant_gemm.kernels().op
    monkeypatch.setattr(invariant_gemm.kernels(), "op", lambda *a: ropes.append(a[4] is not None) or op(*a))
    prompt, tok = torch.tensor([5, 9, 14, 3, 7]), torch.tensor([11])
    t.reset(64)
    sequence.prefill(t, prompt)
    ropes.clear()
    alone = sequence.step(t, tok, 1)
    assert ropes == [True, False, False, False] * 2 + [False]  # per layer: qkv (rotated), o, gate_up, down; lm_head
    t.cache.length.fill_(5)
    assert torch.equal(sequence.step(t, tok, 5)[:1], alone[:1])
    monkeypatch.setattr(Invariant, "takes_rope", lambda *a: False)
    t.reset(64)
    sequence.prefill(t, prompt)
    apart = sequence.step(t, tok, 1)
    assert (apart.double() - alone.double()).abs().max() <= 2e-2 * alone.double().abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("case", range(6))
def test_greedy_speculative_equals_baseline_in_fp16_with_invariant_kernels(model_dirs, case, few_parts):
    """fp16, every decode product and attention batch-invariant: speculative output equals the baseline's."""
    from helpers import NoisyOracleDraft

    from eaglekit.capture import CaptureSpec
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape

    rng = random.Random(2000 + case)
    family = ["llama", "mistral", "qwen2", "qwen3"][case % 4]
    target = _invariant_target(model_dirs, family)
    prompt = [rng.randrange(3, 96) for _ in range(rng.randint(1, 20))]
    want = Decoder(target).generate(prompt, 12, eos_ids=()).token_ids
    dec = Decoder(target, None, TreeShape(*[(3, 1, 4), (3, 2, 6), (4, 3, 10)][case % 3]))
    dec.capture = CaptureSpec.default(8)
    dec.draft = NoisyOracleDraft(target, prompt[0], noise=0.4, seed=case)
    assert dec.generate(prompt, 12, eos_ids=()).token_ids == want


@pytest.mark.slow  # (33 s in the interpreter: the default tier neared its 10 minutes on 2 cores)
def test_invariant_rows_of_a_batch_equal_the_row_alone(model_dirs, few_parts):
    """Batched decoding (RowKV, one mask row per sequence, products over B x T rows): with products "invariant" a
    sequence's verify logits are the same bits in a batch of 3 sequences of other lengths as alone."""
    t = _invariant_target(model_dirs, "qwen2")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 96, (n,), generator=g) for n in (6, 4, 9)]  # >= T tokens each
    T = 4
    # a tree: node 0 the root, 1 and 2 its children, 3 the child of 1
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    depths = torch.tensor([[0, 1, 1, 2]])
    span = 32

    def verify(rows):
        kv = t.row_cache(len(rows), span)
        for b, p in enumerate(rows):  # each row's prompt on its own (prompts of other lengths)
            one = kv.rows(b, b + 1)
            n = p.numel()
            t.forward_rows(one, p[None], torch.arange(n)[None], torch.ones(n, n, dtype=torch.bool).tril()[None], span)
            one.length += n
        ids = torch.stack([p[-T:].flip(0) for p in rows])
        logits, _ = t.forward_rows(kv, ids, depths.expand(len(rows), T), tree[None], span)
        return logits

    together = verify(prompts)
    for b, p in enumerate(prompts):
        assert torch.equal(verify([p])[0], together[b]), f"sequence {b} rounds differently inside the batch"
