"""Tiny random models written as ordinary Hugging Face folders, for tests that need no downloads."""

from __future__ import annotations

from pathlib import Path

import sequence
import torch

from eaglekit.draft.base import SequenceDraft

FAMILY_CONFIGS = {
    "llama": dict(model_type="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=16),
}


def hf_config(family: str, vocab=96, hidden=64, layers=8, heads=4, kv_heads=2, inter=96, **over):
    from transformers import AutoConfig

    base = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    spec = dict(FAMILY_CONFIGS[family])
    model_type = spec.pop("model_type")
    base.update(spec)
    base.update(over)
    return AutoConfig.for_model(model_type, **base)


def make_hf_model(folder: Path, family: str = "llama", seed: int = 0, dtype=torch.float32, std: float = 0.5, **over):
    """Build, randomise (large init so logits are far from ties) and save a tiny causal LM."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = hf_config(family, **over)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * std / max(p.shape[-1], 1) ** 0.5)
    folder = Path(folder)
    model.save_pretrained(folder)
    return model


class OracleDraft(SequenceDraft):
    """A stand-in draft that runs the target itself: it predicts exactly the target's greedy choices.

    It implements the draft interface (eaglekit.draft.base.SequenceDraft) the engine uses, nothing more. Draft
    entry p (feature of position p, token p+1) maps to the oracle's own cache slot p+1, slot 0 holding
    the prompt's first token, which the oracle is told up front.
    """

    hidden_size = 1  # the oracle ignores hidden states: a width-1 dummy flows through the engine

    def __init__(self, target, first_token: int):
        from eaglekit.models.layers import KVCache

        self.net = target.net
        self.cfg = target.cfg
        self.first = first_token
        self.device = target.device
        self._dtype = target.dtype
        self._KVCache = KVCache
        self._committed = torch.zeros((), dtype=torch.long)

    @property
    def draft_vocab_size(self):
        return self.cfg.vocab_size

    @property
    def dtype(self):
        return self._dtype

    @property
    def committed(self):
        return self._committed

    def reset(self, span):
        c = self.cfg
        self.kv = self._KVCache(c.num_layers, c.num_kv_heads, c.head_dim, span + 2, 1, self.device, self.dtype)
        self._committed = torch.zeros((), dtype=torch.long)
        self.span = span

    def to_target_ids(self, ids):
        return ids

    def _run(self, ids, positions, slots, mask):
        with torch.inference_mode():
            h, _ = self.net(ids[None], positions, self.kv, slots, mask[None], ())
            return self.net.lm_head(h[0]).float()

    def extend(self, feats, next_ids, n=None):
        m, E = int(self._committed), next_ids.numel()
        n = E if n is None else int(n)
        if m == 0:
            ids = torch.cat([torch.tensor([self.first]), next_ids])
            slots = torch.arange(0, E + 1)
            mask = torch.ones(E + 1, E + 1, dtype=torch.bool).tril_()
            logits = self._run(ids, slots, slots, mask)[1:]
        else:
            slots = torch.arange(m + 1, m + 1 + E)
            mask = torch.ones(E, m + 1 + E, dtype=torch.bool)
            mask[:, m + 1:] = torch.ones(E, E, dtype=torch.bool).tril_()
            logits = self._run(next_ids, slots, slots, mask)
        self._committed = torch.tensor(m + n)
        return torch.zeros(1), logits[n - 1]

    def step(self, hidden, ids, positions, slots, mask):
        N = ids.numel()
        full = torch.cat([torch.ones(N, 1, dtype=torch.bool), mask], dim=1)
        return torch.zeros(N, 1), self._run(ids, positions + 1, slots + 1, full)


class NoisyOracleDraft(OracleDraft):
    """The oracle with seeded noise on its logits: right often, wrong often, never systematically."""

    def __init__(self, target, first_token: int, noise: float, seed: int):
        super().__init__(target, first_token)
        self.noise = noise
        self.gen = torch.Generator().manual_seed(seed)

    def _run(self, ids, positions, slots, mask):
        logits = super()._run(ids, positions, slots, mask)
        return logits + self.noise * torch.randn(logits.shape, generator=self.gen, dtype=logits.dtype)


def make_tokenizer(folder: Path, vocab: int = 96, chat_template: str | None = None):
    """A byte-level BPE tokenizer of exactly `vocab` ids: ids 0, 1, 2 are <pad>, <s>, </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = sorted(set("abcdefghijklmnopqrstuvwxyz ():=.,\n0123456789"))
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=[pre_tokenizers.ByteLevel.alphabet()[0]] + alphabet)
    text = "def add(a, b):\n    return a + b\nprint(add(1, 2))\nhello world\n" * 20
    tok.train_from_iterator([text], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))
    return fast


def use_triton_interpreter() -> None:
    """Call at the top of a test module: skip it where Triton is missing or a GPU is visible (the interpreter would
    take over the GPU's kernels in this process; tests/gpu/test_gpu.py covers them there), else run Triton kernels in
    Triton's interpreter on the CPU (set before triton is first imported)."""
    import importlib.util
    import os

    import pytest

    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton (the dev extra installs it)", allow_module_level=True)
    if torch.cuda.is_available():
        pytest.skip("interpreter tests run on CPU machines; tests/gpu/test_gpu.py covers the kernels on the GPU",
                    allow_module_level=True)
    os.environ["TRITON_INTERPRET"] = "1"
    _dot_in_one_order()


def _dot_in_one_order() -> None:
    """The interpreter's tl.dot is numpy's matmul, and the BLAS kernel numpy picks per CPU may sum an output's K
    products in an order that depends on how many columns it is given (OpenBLAS's SkylakeX kernel keeps the bits of
    tests/kernels' row-invariance tests on one AVX-512 machine, its Haswell and Zen kernels and the default there do
    not). The kernels' bit-for-bit claims are about their tiles, masks and slices of K, so here each output sums its
    products in one order whatever the tile's width (einsum's own loops, no BLAS); tests/gpu/test_gpu.py holds the
    compiled kernels to the same bits on the GPU's tensor cores."""
    import numpy as np
    from triton.runtime import interpreter

    blas_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:  # (fp8, int8: Triton's own dot)
            return blas_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = d.data.dtype
        out = np.einsum("...ik,...kj->...ij", a.data.astype(acc), b.data.astype(acc)) + d.data
        return interpreter.TensorHandle(out, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot


def random_tree_paths(T: int, rng) -> list[list[int]]:
    """A random tree of T nodes in topological order (node 0 the root, each other node's parent an earlier one) as
    each node's path from the root: paths[t] = [0, ..., t]."""
    parents = [-1] + [rng.randrange(0, i) for i in range(1, T)]
    paths = []
    for t in range(T):
        path, a = [], t
        while a >= 0:
            path.append(a)
            a = parents[a]
        paths.append(path[::-1])
    return paths


def hopper_target(products: str, layers: int = 2):
    """A bf16 Llama target on the GPU of a shape the hopper kernels take (hidden 2048, head_dim 128, intermediate
    4096, vocab 8192), random weights (norm weights not ones: they travel inside the hopper products)."""
    import dataclasses

    from eaglekit.models.config import parse_target_config
    from eaglekit.models.layers import Rotary
    from eaglekit.models.llama import LlamaModel, LlamaTarget
    from eaglekit.train.pretrain import LlamaShape, llama_config

    raw = llama_config(LlamaShape(8192, 2048, 2, 16, 4, 4096), max_pos=4096, tie=False, eos_id=1)
    cfg = dataclasses.replace(parse_target_config(raw), num_layers=layers)
    torch.manual_seed(0)
    net = LlamaModel(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.02)
        for n, p in net.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    net = net.to("cuda", torch.bfloat16)
    net.rotary = Rotary(cfg.head_dim, cfg.rope).to("cuda")  # (its frequencies stay float32)
    t = LlamaTarget(net, "cuda", torch.bfloat16)
    t.fuse()
    t.set_products(products)
    return t


def assert_tree_verify_matches(ours, ref, tol: float, step=lambda t, tok: sequence.step(t, tok)) -> None:
    """One tree-masked verify of a 9-node tree after a 10-token prefix gives, at every node, transformers' (`ref`)
    logits of prefix + that node's path; keeping one path (padded, 5 real) then leaves a cache that steps on like
    a plain sequence. `step(target, token) -> logits [V]` (a target's own step, or a test's wrapper)."""
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(3, 96, (10,), generator=g)
    parents = [0, 0, 0, 1, 1, 2, 3, 3, 6]  # node 0 is the root
    D = len(parents)
    tokens = torch.randint(3, 96, (D,), generator=g)
    depths = torch.zeros(D, dtype=torch.long)
    mask = torch.eye(D, dtype=torch.bool)
    for i in range(1, D):
        depths[i] = depths[parents[i]] + 1
        mask[i] = mask[parents[i]].clone()
        mask[i, i] = True
    ours.reset(32)
    sequence.prefill(ours, prefix)
    logits, _ = sequence.verify(ours, tokens, depths, mask)
    for i in range(D):
        path = mask[i].nonzero().squeeze(1)
        with torch.no_grad():
            want = ref(torch.cat([prefix, tokens[path]])[None]).logits[0, -1]
        torch.testing.assert_close(logits[i], want.float(), rtol=tol, atol=tol)
    keep = mask[8].nonzero().squeeze(1)  # root, 1, 3, 6, 8
    sequence.keep(ours, torch.cat([keep, torch.zeros(3, dtype=torch.long)]), torch.tensor(5))  # padded, 5 real
    assert sequence.length(ours) == 15
    nxt = torch.tensor([5])
    lg = step(ours, nxt).reshape(-1)
    with torch.no_grad():
        want = ref(torch.cat([prefix, tokens[keep], nxt])[None]).logits[0, -1]
    torch.testing.assert_close(lg, want.float(), rtol=tol, atol=tol)


def doctor_args(target, draft, capture=None, **opts):
    """(ModelOptions, DoctorOptions) of a doctor run, as `eaglekit doctor` builds them (device cpu, the doctor's
    default): `capture` a CaptureSpec, the wiring served instead of the draft's own; `opts` DoctorOptions' fields."""
    from eaglekit.options import DOCTOR_DEVICE, DoctorOptions, ModelOptions

    layers = None if capture is None else ",".join(map(str, capture.after_layers))
    return (ModelOptions(target=target, draft=draft, device=DOCTOR_DEVICE, capture_layers=layers),
            DoctorOptions(**opts))


def extend(draft, kv, feats, next_ids, n=None):
    """Commit entries on a one-row draft cache `kv` (Draft.row_cache(1, span)): feats [E, C*H_t] with next_ids [E]
    (target ids), padded past `n` (default all E) -> (hidden [H], logits [Vd] float32) of entry n - 1, as the engine's
    one-row extend (Draft.extend_rows)."""
    E = next_ids.numel()
    n = torch.as_tensor(E if n is None else n, dtype=torch.long, device=next_ids.device).view(1)
    with torch.inference_mode():
        h, logits = draft.extend_rows(kv, feats[None], next_ids[None], n, kv.max_len)
    return h[0], logits[0]


def level(draft, kv, hidden, ids, positions, slots, mask):
    """One tree level on a one-row draft cache `kv`: K pending entries of own hidden [K, H] and target ids [K] at
    `positions`, written at `slots`, each seeing the slots its row of mask [K, span] allows -> (hidden [K, H], logits
    [K, Vd] float32), as the engine's walk runs a level (Draft.step_rows on one row)."""
    with torch.inference_mode():
        h, logits = draft.step_rows(kv, hidden[None], ids[None], positions[None], slots[None], mask[None])
    return h[0], logits[0]


def grow(draft, kv, h, logits, root, shape, own_walk: bool = True):
    """The tree the engine grows on a one-row batch: kv the row's draft cache (Draft.row_cache(1, span)), h [H],
    logits [Vd], root a 0-d target id, shape a TreeShape -> that row's Tree ([D] fields). own_walk=False: the engine's
    walk over step_rows (what more rows, or tracing, take) instead of the draft's one-row walk (Eagle3Draft.chain_rows
    / tree_rows: compiled after compile(), eager before)."""
    from eaglekit.decoding import tree

    if not own_walk:
        draft._walks_row = lambda kv: False
    try:
        with torch.inference_mode():
            t = tree.expand_rows(draft, kv, h.reshape(1, -1), logits.reshape(1, -1), root.reshape(1), shape,
                                 kv.max_len)
    finally:
        if not own_walk:
            del draft._walks_row
    return tree.tree_row(t, 0)
