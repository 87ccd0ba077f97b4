"""How the decode-time products (q/k/v, o, gate/up, down, lm_head) run: the policies, and the one chooser.

A policy object is set on a model's modules (eaglekit.models.layers.install_products); None means plain F.linear
(training, features, float32 on a GPU, serve's batches, where inductor compiles the products). Every policy declares
what it does as class attributes (no flag is read by name elsewhere):

    kind        attention  batch_invariant  layer_kernels   where
    aten        no         no               no              anywhere: F.linear, said explicitly
    onednn      no         float32 only     no              CPU: weights prepacked for oneDNN's linear
    invariant   yes        yes              no              CUDA + Triton, bf16/fp16
    hopper      yes        yes              yes             sm_90 + nvcc, bf16, the shapes eaglekit.kernels.hopper takes

- onednn: on the CPUs measured a 6-row product costs a fraction of F.linear's (which takes slow paths for small M).
  In float32 one row's result does not depend on how many rows come with it; in bf16 it does (as F.linear's does), so
  bf16 on a CPU is exact against a reference that steps through the verify's rows (Decoder.baseline_rows), not
  against the plain one-row decode (docs/exactness.md).
- invariant: every product of a decode call through eaglekit.kernels.invariant_gemm from one row on, the decode
  attention through .invariant_attention and the norms through .invariant_norm: a row's bits do not depend on the
  rows beside it, so bf16 speculative output is identical to the bf16 plain decode's.
- hopper: invariant, except that a decode call's layers run as eaglekit.kernels.hopper's CUDA kernels and the lm_head
  through its product; equally batch-invariant (its own bits, not invariant's).

`choose(target, device, batched)` is the one place that decides what 'auto' means, and says why (`Choice.reason`):
the reason travels to `--json`, the demo's table and `eaglekit doctor`. On a CPU 'auto' is decided by timing
(`pick_cpu`): real forwards (a one-row step and a six-row verify) of each candidate, interleaved round by round.
"""

from __future__ import annotations

import statistics
import time
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import invariant_gemm


class Aten:
    name = "aten"
    attention = False  # decode attention through SDPA (Invariant: eaglekit.kernels.invariant_attention)
    batch_invariant = False  # a row's bits independent of the rows computed with it
    fuses = False  # whether linear() takes residual= and gated= (eaglekit.models.layers.product)
    layer_kernels = None  # Hopper: the kernels that run a decode call's layers (eaglekit.models.llama asks)
    compiles_any_length = True  # whether compiling.compile_prompt's symbolic-size graphs can take its products

    def linear(self, x, w, b=None):
        return F.linear(x, w, b)

    def takes_rope(self, x, w, b, head_dim: int) -> bool:
        """Whether linear() can do the rotary embedding of this q/k/v product's output itself."""
        return False

    def __repr__(self):
        return self.name


class Invariant(Aten):
    """Batch-invariant decode (GPU, Triton): every product of a decode call through invariant_gemm from one row on
    (never cuBLAS, even where it was tuned faster) and the attention through eaglekit.kernels.invariant_attention, so
    a token's arithmetic is the same bits stepped alone or verified in a tree: bf16 greedy output identical to the
    bf16 baseline."""

    name = "invariant"
    attention = True
    batch_invariant = True
    fuses = True  # the SwiGLU gate and residual adds run in the products' kernels (invariant_gemm.epilogue says what)

    def __init__(self):
        from . import invariant_attention, invariant_norm

        if invariant_gemm.HAVE_TRITON:
            invariant_gemm.kernels()
            # the ops are registered before any compiled layer traces them: when the first build happened inside
            # dynamo's tracing, the first compiled token count gave wrong verifies (bf16_suite: 1-3 of 16-32
            # prompts identical, accept length ~1.6, the graphs compiled later right)
            invariant_attention.kernels()
            invariant_norm.kernels()

    def linear(self, x, w, b=None, residual=None, gated=False, rope=None):
        """`rope`: (cos, sin, rope_cols) for invariant_gemm.linear, only where takes_rope said yes."""
        return invariant_gemm.linear(x, w, b, exact=True, residual=residual, gated=gated, rope=rope)

    def takes_rope(self, x, w, b, head_dim: int) -> bool:
        return invariant_gemm.folds_rope(x, w, b, head_dim)


class Hopper(Invariant):
    """Invariant, plus eaglekit.kernels.hopper's kernels: `layer_kernels.layers` runs the decoder layers of a decode
    call (eaglekit.models.llama asks `layer_kernels`), and `linear` takes a plain product that fits them (the lm_head);
    every other product (prompts, batched rows) goes the Invariant way."""

    name = "hopper"

    def __init__(self, device):
        super().__init__()
        from . import hopper

        self.layer_kernels = hopper.Kernels(device)

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
    compiles_any_length = False  # inductor lowers a packed weight's product for fixed sizes only

    def __init__(self, weights):
        self.packed: dict[int, tuple] = {}
        # row-invariant only where every packed weight is float32 (see the module docstring)
        self.batch_invariant = True
        with torch.no_grad():
            for w in weights:
                if (
                    id(w) not in self.packed
                    and w.device.type == "cpu"
                    and w.dim() == 2
                    and w.dtype in (torch.float32, torch.bfloat16)
                ):
                    self.packed[id(w)] = (
                        weakref.ref(w),
                        w._version,
                        torch.ops.mkldnn._reorder_linear_weight(w.detach(), None),
                    )
                    self.batch_invariant = self.batch_invariant and w.dtype == torch.float32

    def linear(self, x, w, b=None):
        e = self.packed.get(id(w))
        if (
            e is None
            or e[0]() is not w
            or e[1] != w._version
            or x.dtype != w.dtype
            or x.device.type != "cpu"
            or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))
        ):
            return F.linear(x, w, b)
        return torch.ops.mkldnn._linear_pointwise(x, e[2], b, "none", [], "")


KINDS = ("aten", "onednn", "invariant", "hopper")  # what --products names, besides "auto"
CPU_KINDS = ("aten", "onednn")  # a draft shares these with its target; beside the GPU kinds it keeps F.linear


def make(kind: str | None, weights=()):
    """A policy by name; `weights` (eaglekit.models.layers.product_weights) are what OneDNN packs."""
    if kind in (None, "none"):
        return None
    if kind == "aten":
        return Aten()
    if kind == "invariant":
        return Invariant()
    if kind == "hopper":
        return Hopper(weights[0].device if weights else "cuda")
    if kind == "onednn":
        if not onednn_available():
            raise RuntimeError("this torch build has no oneDNN prepacked linear")
        return OneDNN(weights)
    raise ValueError(f"unknown products kind {kind!r}")


_PICKED: dict = {}  # (model shape, dtype, threads) -> pick_cpu's result: one timing per process and kind of model


def pick_cpu(target, reps: int = 7, rows: int = 6, again: bool = False) -> dict:
    """Time a one-row step and a `rows`-row verify of `target` (our decoder, on a CPU) with each policy; set the one
    with the smaller sum and return {"products": name, "ms": {name: [step, verify]}} (~0.5 s on the demo pair). A
    model of the same shapes loaded again in this process (same dtype and thread count) reuses the result unless
    `again`. oneDNN is not tried where its packed copy of the weights would take over half the free memory."""
    c = target.cfg
    key = (
        c.hidden_size,
        c.intermediate_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.vocab_size,
        target.dtype,
        torch.get_num_threads(),
        reps,
        rows,
    )
    if key in _PICKED and not again:
        target.set_products(_PICKED[key]["products"])
        return _PICKED[key]
    # the packs are a second copy of the weights: only a candidate where that copy leaves half the free memory free
    weights = target.product_weights()
    need = sum({id(w): w.numel() * w.element_size() for w in weights}.values())
    free = available_memory()
    fits = free is None or need <= free // 2
    candidates = ["aten"] + (["onednn"] if onednn_available() and fits else [])
    policies = {kind: make(kind, weights) for kind in candidates}
    times: dict[str, dict[int, list[float]]] = {kind: {1: [], rows: []} for kind in candidates}
    # one untimed round first (oneDNN builds its kernels per shape on first use), then the candidates alternate
    # round by round, so a machine that slows down or speeds up midway weighs on both alike (a fresh process timing
    # one candidate after the other picked F.linear 1 time in 8 on a noisy 2-core VM where oneDNN is ~20% faster)
    call = _row_calls(target, rows)
    for i in range(reps + 1):
        for kind in candidates:
            target.set_products(policies[kind])
            for r in (1, rows):
                t0 = time.perf_counter()
                call(r)
                if i:
                    times[kind][r].append((time.perf_counter() - t0) * 1e3)
    ms = {kind: [round(statistics.median(t[1]), 3), round(statistics.median(t[rows]), 3)] for kind, t in times.items()}
    best = min(ms, key=lambda k: sum(ms[k]))
    target.set_products(policies[best])
    _PICKED[key] = {"products": best, "ms": ms, "rows": rows}
    if not fits:
        _PICKED[key]["onednn_skipped"] = (
            f"its packed weights ({need / 2**30:.1f} GiB) would take over half the free memory"
        )
    return _PICKED[key]


def _row_calls(target, rows: int):
    """-> call(r): an r-token forward of the target's row interface (what a one-row engine runs: a plain step at 1, a
    verify at `rows`) after a 64-token prompt in a row of its own; each call writes the same pending slots past the
    prompt, so every call attends over the same keys."""
    dev = target.device
    prompt = torch.arange(1, 65, device=dev) % max(2, target.info.vocab_size - 1)
    T, span = prompt.numel(), prompt.numel() + rows + 8
    kv = target.row_cache(1, span)
    with torch.inference_mode():
        causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
        target.forward_rows(kv, prompt[None], torch.arange(T, device=dev)[None], causal, T, last=True)
        kv.length += T
    shapes = {
        r: (
            prompt[-1:].expand(r)[None].contiguous(),
            torch.arange(r, device=dev)[None],
            torch.ones(1, r, r, dtype=torch.bool, device=dev).tril_(),
        )
        for r in (1, rows)
    }

    @torch.inference_mode()
    def call(r: int) -> None:
        ids, depths, block = shapes[r]
        target.forward_rows(kv, ids, depths, block, span)

    return call


@dataclass(frozen=True)
class Choice:
    """What 'auto' (or a named kind) resolves to for one model on one device, and why. `kind` None: F.linear (or
    what inductor makes of it); "pick": time aten against onednn on this CPU (pick_cpu)."""

    kind: str | None
    reason: str


def hopper_reason(target) -> str | None:
    """Why kind 'hopper' (eaglekit.kernels.hopper) cannot run this target, or None where it can."""
    from . import hopper

    cfg = target.cfg
    if cfg is None or not own_decoder(target):
        return "it needs eaglekit's own decoder on one device"
    return hopper.reason(cfg, target.device, target.dtype)


def own_decoder(target) -> bool:
    """Whether products can be set on this target: eaglekit's own decoder on one device (not transformers-backed,
    not a tensor-parallel rank)."""
    return target.takes_products and target.tp is None


def compiled(target) -> bool:
    """Whether the target's decode-time layers run compiled (eaglekit.pair.load_pair's `run.compile`)."""
    return target.compiled_layers


def choose(target, device, batched: bool = False, rows: int | None = None) -> Choice:
    """The one chooser: what products='auto' means for this target on `device`, with the reason. The choice never
    depends on the tree or on whether a draft is loaded: `generate --baseline` must decode the bits `generate` does.
    `batched`: many sequences per forward (serve); `rows`: the most rows one forward can hold there (max batch
    times the tree's tokens), where known."""
    device = str(device)
    if not own_decoder(target):
        return Choice(
            None,
            "this target has no products policy (transformers-backed, DeepSeek-family or a "
            "tensor-parallel rank): its own F.linear products",
        )
    if device == "cpu":
        if compiled(target):
            return Choice(None, "compiled layers on a CPU: inductor's products (oneDNN's packs cannot be traced)")
        if target.compiled_prompts:
            return Choice(
                None,
                "prompt graphs on a CPU: F.linear's products (oneDNN's packs have no compiled form "
                "for a length that changes)",
            )
        return Choice("pick", "CPU: aten and onednn timed on this machine (a step and a 6-row verify)")
    if not device.startswith("cuda"):
        return Choice(None, f"F.linear on {device}")
    if target.dtype not in (torch.bfloat16, torch.float16):
        return Choice(None, "float32 on a GPU: inductor's products (no rounding differs between 1 and k rows there)")
    if not invariant_gemm.HAVE_TRITON:
        return Choice(None, "Triton is not installed: F.linear (bf16 output may part from the plain decode's)")
    if batched and rows is not None and rows > invariant_gemm.MAX_ROWS:
        # The batch-invariant kernels still run every forward they take (each plain step of up to MAX_ROWS rows, every
        # verify that fits), so a server with a draft takes the products a server without one takes: F.linear
        # throughout made each plain step of the demo pair 2.2x slower on an H200 (0.94 ms against 0.43), and a draft
        # that never pays served at 0.53x of no draft (docs/performance.md#d20)
        return Choice(
            "invariant",
            f"batched forwards of up to {rows} rows (serve): batch-invariant Triton kernels "
            f"for every forward of up to {invariant_gemm.MAX_ROWS} rows, F.linear for larger "
            f"verifies, whose tokens are not batch-invariant (keep --max-batch times the "
            f"tree's tokens within {invariant_gemm.MAX_ROWS} for every token to be; "
            f"--products aten for F.linear throughout)",
        )
    if batched:  # hopper's kernels run one row: a request would change bits as the batch grows past one
        return Choice(
            "invariant",
            "batched rows (serve): batch-invariant Triton kernels at every batch size, so a "
            "request's greedy output is the same bits whatever shares the batch",
        )
    why_not = hopper_reason(target)
    if why_not is None:
        return Choice("hopper", "bf16 on an sm_90 GPU with nvcc: the Hopper layer kernels (fastest; batch-invariant)")
    return Choice("invariant", f"batch-invariant Triton kernels (hopper's cannot run: {why_not})")


def check_kind(kind: str, target, device) -> tuple[str, str] | None:
    """(why the named `kind` cannot run this target on `device`, the fix), or None where it can."""
    if not own_decoder(target):
        return (
            "it needs eaglekit's Llama-family decoder on one device",
            "leave out --products for transformers-backed, DeepSeek-family or tensor-parallel targets",
        )
    if kind == "onednn" and not (str(device) == "cpu" and onednn_available()):
        return "onednn runs on a CPU whose torch has oneDNN", "use --products aten (or auto) here"
    if kind == "onednn" and compiled(target):
        return "onednn cannot run inside torch.compile'd layers", "leave out --compile, or use --products aten"
    if kind == "onednn" and target.compiled_prompts:
        return (
            "onednn's packed products have no compiled form for a length that changes (--prompt-graphs)",
            "leave out --prompt-graphs, or use --products aten",
        )
    if kind in ("invariant", "hopper") and not (str(device).startswith("cuda") and invariant_gemm.HAVE_TRITON):
        return f"{kind} is a GPU kernel (Triton)", "use it with --device cuda and triton installed"
    if kind == "hopper" and (why := hopper_reason(target)) is not None:
        return why, "use --products invariant (the same guarantee, Triton kernels)"
    return None


def compiles_any_length(policy) -> bool:
    """Whether a model with this policy (None: F.linear) may run its prompts through compiling.compile_prompt's
    graph."""
    return policy is None or policy.compiles_any_length
