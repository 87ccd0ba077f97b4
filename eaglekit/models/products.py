"""How the decode-time products (q/k/v, o, gate/up, down, lm_head) run: one policy object per model, set on its
modules by `set_products`; None means plain F.linear (training, features, float32 on a GPU and `serve` there, where
inductor compiles the products). What 'auto' picks where: eaglekit.pair.auto_products.

- Aten: F.linear, said explicitly (so a machine's pick can name it).
- OneDNN (CPU): each weight packed once into oneDNN's blocked layout, products through its prepacked linear. On the
  CPUs measured, a 6-row product costs a fraction of F.linear's (which falls back to slow paths for small M: the
  demo's lm_head at 6 rows 260 vs 950 us here, 3.2x a row on AMD EPYC per issue 12), and one row's result does not
  depend on how many rows come with it (F.linear's does, in fp32 too: other kernels for 1 and for k rows).
- SmallM (GPU): eaglekit.models.smallm's Triton kernel from `from_rows` rows on (opt-in; benchmarks/NOTES.md).
- Invariant (GPU; the default for bf16/fp16 decoding there): smallm for every product, eaglekit.models.attend for
  the decode attention and .norms for the norms: a row's bits do not depend on the rows beside it, so bf16
  speculative output is identical to the bf16 baseline's.
- Bulk (GPU, sm_90, bf16, Llama shapes eaglekit.models.bulk takes): Invariant, except that a decode call's layers run
  as eaglekit.models.bulk's CUDA kernels (dependent launches streaming weights by bulk copies) and the lm_head through
  its product; equally batch-invariant (its own bits, not Invariant's).

`pick_cpu` chooses between Aten and OneDNN on the machine it runs on by timing real forwards (a one-row step and a
six-row verify), not microbenchmarks: hot-cache timings of single products mislead (NOTES, "The demo on another CPU").
"""

from __future__ import annotations

import statistics
import time
import weakref

import torch
import torch.nn.functional as F

from . import smallm


class Aten:
    name = "aten"
    attention = False  # decode attention through SDPA (Invariant: eaglekit.models.attend)
    fuses = False  # whether linear() takes residual= and gated= (eaglekit.models.layers.product)

    def linear(self, x, w, b=None):
        return F.linear(x, w, b)

    def __repr__(self):
        return self.name


class SmallM(Aten):
    name = "smallm"

    def __init__(self, from_rows: int = 2):
        self.from_rows = from_rows
        if smallm.HAVE_TRITON:
            smallm.kernels()  # built here, never first inside torch.compile's tracing (see Invariant)

    def linear(self, x, w, b=None):
        return smallm.linear(x, w, b, enabled=x.numel() // x.shape[-1] >= self.from_rows)


class Invariant(SmallM):
    """Batch-invariant decode (GPU, Triton): every product of a decode call through smallm from one row on (never
    cuBLAS, even where it was tuned faster) and the attention through eaglekit.models.attend, so a token's arithmetic
    is the same bits stepped alone or verified in a tree: bf16 greedy output identical to the bf16 baseline."""

    name = "invariant"
    attention = True
    fuses = True  # the SwiGLU gate and the residual adds run in the products' kernels (smallm.epilogue says what)
    fuses_rope = True  # and the rotary embedding of q and k in the q/k/v product's kernel, where it can (takes_rope)

    def __init__(self):
        super().__init__(1)
        from . import attend, norms

        if smallm.HAVE_TRITON:
            # the ops are registered before any compiled layer traces them: when the first build happened inside
            # dynamo's tracing, the first compiled token count gave wrong verifies (bf16_suite: 1-3 of 16-32
            # prompts identical, accept length ~1.6, the graphs compiled later right)
            attend.kernels()
            norms.kernels()

    def linear(self, x, w, b=None, residual=None, gated=False, rope=None):
        """`rope`: (cos, sin, rope_cols) for smallm.linear, only where takes_rope said yes."""
        if not self.fuses:  # (benchmarks compare: fast_probe.py --no-fuse)
            return smallm.epilogue(smallm.linear(x, w, b, exact=True), residual, gated)
        return smallm.linear(x, w, b, exact=True, residual=residual, gated=gated, rope=rope)

    def takes_rope(self, x, w, b, head_dim: int) -> bool:
        """Whether linear() can do the rotary embedding of this q/k/v product's output itself."""
        return self.fuses and self.fuses_rope and smallm.folds_rope(x, w, b, head_dim)


class Bulk(Invariant):
    """Invariant, plus eaglekit.models.bulk's kernels: `layer_kernels.layers` runs the decoder layers of a decode call
    (eaglekit.models.llama asks `layer_kernels`), and `linear` takes a plain product that fits them (the lm_head);
    every other product (prompts, batched rows) goes the Invariant way."""

    name = "bulk"

    def __init__(self, device):
        super().__init__()
        from . import bulk

        self.layer_kernels = bulk.Kernels(device)

    def linear(self, x, w, b=None, residual=None, gated=False, rope=None):
        if b is None and residual is None and not gated and rope is None and self.layer_kernels.fits(x, w):
            return self.layer_kernels.linear(x, w)
        return super().linear(x, w, b, residual=residual, gated=gated, rope=rope)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def available_memory() -> int | None:
    """Bytes of memory the system can still give (Linux's MemAvailable), or None where it cannot say."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class OneDNN(Aten):
    """Products over weights packed for oneDNN at construction (fp32, bf16; fp16/fp64 weights are not packed). A
    weight it has not packed, one modified since (its version counter moved), an input of another dtype, or a
    product that needs gradients falls back to F.linear: a stale pack is never used."""

    name = "onednn"

    def __init__(self, weights):
        self.packed: dict[int, tuple] = {}
        with torch.no_grad():
            for w in weights:
                if (id(w) not in self.packed and w.device.type == "cpu" and w.dim() == 2
                        and w.dtype in (torch.float32, torch.bfloat16)):
                    self.packed[id(w)] = (weakref.ref(w), w._version,
                                          torch.ops.mkldnn._reorder_linear_weight(w.detach(), None))

    def linear(self, x, w, b=None):
        e = self.packed.get(id(w))
        if (e is None or e[0]() is not w or e[1] != w._version or x.dtype != w.dtype or x.device.type != "cpu"
                or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return F.linear(x, w, b)
        return torch.ops.mkldnn._linear_pointwise(x, e[2], b, "none", [], "")


def product_weights(modules, heads=()) -> list[torch.Tensor]:
    """The weights a policy is asked to multiply by: the fused q/k/v and o of each Attention, the fused gate/up and
    down of each MLP (unfused modules call their own linears), and the `heads` (lm_head, fc)."""
    from .layers import MLP, Attention

    out = []
    for m in modules:
        if isinstance(m, Attention):
            out += [m.qkv_weight, getattr(m.o_proj, "weight", None)]
        elif isinstance(m, MLP) and m.gate_up_weight is not None:
            out += [m.gate_up_weight, getattr(m.down_proj, "weight", None)]
    # (an int8 draft's weights, eaglekit.models.quant, are modules of their own: not a policy's to multiply by)
    return [w for w in out if isinstance(w, torch.Tensor)] + [h.weight for h in heads if type(h) is torch.nn.Linear]


def make(kind: str | None, weights=(), from_rows: int = 2):
    """A policy by name; `weights` (product_weights) are what OneDNN packs."""
    if kind in (None, "none"):
        return None
    if kind == "aten":
        return Aten()
    if kind == "smallm":
        return SmallM(from_rows)
    if kind == "invariant":
        return Invariant()
    if kind == "bulk":
        return Bulk(weights[0].device if weights else "cuda")
    if kind == "onednn":
        if not onednn_available():
            raise RuntimeError("this torch build has no oneDNN prepacked linear")
        return OneDNN(weights)
    raise ValueError(f"unknown products kind {kind!r}")


def install(kind, modules, heads=(), from_rows: int = 2):
    """Set a policy on these modules (a kind by name, made for their weights, or a policy object made before) and
    return it: what a model's set_products does with its modules and heads (lm_head, fc)."""
    from .layers import set_products

    modules = list(modules)
    policy = kind if hasattr(kind, "linear") else make(kind, product_weights(modules, heads), from_rows)
    set_products(modules, policy)
    return policy


_PICKED: dict = {}  # (model shape, dtype, threads) -> pick_cpu's result: one timing per process and kind of model


def pick_cpu(target, reps: int = 7, rows: int = 6, again: bool = False) -> dict:
    """Time a one-row step and a `rows`-row verify of `target` (our decoder, on a CPU) with each policy; set the one
    with the smaller sum and return {"products": name, "ms": {name: [step, verify]}} (~0.5 s on the demo pair). A
    model of the same shapes loaded again in this process (same dtype and thread count) reuses the result unless
    `again`. oneDNN is not tried where its packed copy of the weights would take over half the free memory."""
    c = target.cfg
    key = (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.vocab_size, target.dtype,
           torch.get_num_threads(), reps, rows)
    if key in _PICKED and not again:
        target.set_products(_PICKED[key]["products"])
        return _PICKED[key]
    # the packs are a second copy of the weights: only a candidate where that copy leaves half the free memory free
    weights = product_weights(target.net.modules(), [target.net.lm_head])
    need = sum({id(w): w.numel() * w.element_size() for w in weights}.values())
    free = available_memory()
    fits = free is None or need <= free // 2
    candidates = ["aten"] + (["onednn"] if onednn_available() and fits else [])
    dev = target.device
    prompt = torch.arange(1, 65, device=dev) % max(2, target.info.vocab_size - 1)
    tok = prompt[-1:]
    policies = {kind: make(kind, weights) for kind in candidates}
    # (no inference_mode here: the cache that reset() allocates must stay a normal tensor)
    target.reset(prompt.numel() + (reps + 1) * len(candidates) * 2 + rows + 8)  # each step commits 1, writes rows
    target.prefill(prompt)
    times = {kind: {1: [], rows: []} for kind in candidates}
    # one untimed round first (oneDNN builds its kernels per shape on first use), then the candidates alternate
    # round by round, so a machine that slows down or speeds up midway weighs on both alike (a fresh process timing
    # one candidate after the other picked F.linear 1 time in 8 on a noisy 2-core VM where oneDNN is ~20% faster)
    for i in range(reps + 1):
        for kind in candidates:
            target.set_products(policies[kind])
            for r in (1, rows):
                t0 = time.perf_counter()
                target.step(tok, r)
                if i:
                    times[kind][r].append((time.perf_counter() - t0) * 1e3)
    ms = {kind: [round(statistics.median(t[1]), 3), round(statistics.median(t[rows]), 3)] for kind, t in times.items()}
    best = min(ms, key=lambda k: sum(ms[k]))
    target.set_products(policies[best])
    _PICKED[key] = {"products": best, "ms": ms, "rows": rows}
    if not fits:
        _PICKED[key]["onednn_skipped"] = (f"its packed weights ({need / 2**30:.1f} GiB) would take over half the free "
                                          "memory")
    return _PICKED[key]
