"""torch.compile for the decode shapes: one place that says how, with which inductor options, and where the
compiled kernels are cached (so a second run of the same model on the same machine does not compile again).

The engine records the compiled kernels inside its own CUDA graphs, so inductor's own cudagraphs stay off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import threading
from pathlib import Path

import torch

# inductor options for the decode-time layers of a large model, chosen on the H200 (docs/performance.md#d21)
DECODE_OPTIONS: dict = {"coordinate_descent_tuning": True}
# Coordinate-descent tuning times config variants of every Triton kernel while it compiles. On the 8B shape's layer
# (hidden 4096) it buys ~7% of the step (D21); on the demo target's (hidden 256) it buys nothing measurable and more
# than doubles a fresh machine's warm-up (D43). So a layer is tuned from this width up, and the small bookkeeping
# kernels between layers (twin) never are.
TUNE_MIN_HIDDEN = 2048


def decode_options(hidden: int | None) -> dict:
    """The inductor options for a decode-time layer of width `hidden` (None: a bookkeeping function, not a layer):
    DECODE_OPTIONS from TUNE_MIN_HIDDEN up, inductor's defaults below it."""
    return dict(DECODE_OPTIONS) if hidden is not None and hidden >= TUNE_MIN_HIDDEN else {}


def cache_dir() -> Path:
    """Where inductor keeps compiled kernels: $TORCHINDUCTOR_CACHE_DIR if set, else ~/.cache/eaglekit/inductor
    (inductor's own default lies under /tmp, which many machines clear on reboot)."""
    d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not d:
        d = str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eaglekit" / "inductor")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    return Path(d)


def op_name(name: str, *sources, extra: str = "") -> str:
    """The registered name of one of eaglekit's Triton ops: "eaglekit::<name>_<digest of the source files and
    `extra`>". Why: inductor's cache of compiled graphs (kept across runs, see cache_dir) keys a triton_op by its name
    and its Triton kernels' source, not by the Python that launches them (strides, grids, buffers, the tuned configs
    read there). A change to that Python was served from a warm cache as the old code (a GPU ran the old launch code
    until the cache was emptied); a name that carries the digest makes every such change a new op, compiled
    afresh."""
    h = hashlib.sha256()
    for src in sources:
        try:
            h.update(Path(src).read_bytes())
        except OSError:  # an install without its sources (bytecode only): the path and the version stand in
            from .. import __version__

            h.update(f"{src} {__version__}".encode())
    h.update(extra.encode())
    return f"eaglekit::{name}_{h.hexdigest()[:12]}"


def compile_decode(fn, options: dict | None = None, hidden: int | None = None):
    """`fn` compiled for fixed shapes: one graph per token count; its callers pass the span dimensions through
    span_dynamic, so generations of other lengths reuse it instead of compiling again. `options` overrides
    decode_options(hidden) ({} = inductor's defaults); `hidden`: the width of the layer `fn` runs (None: not a
    layer)."""
    cache_dir()
    from torch import _dynamo

    _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 64)  # one graph per token count
    return torch.compile(fn, dynamic=False, options=decode_options(hidden) if options is None else options)


def compile_prompt(fn):
    """`fn` compiled once for the one-row calls prompt_calls marks (a prompt's prefill, the draft's extend over it),
    whose token count changes from call to call: its sizes are symbolic (dynamic=True), so every length of two
    tokens or more runs one graph (one more where the code branches on the length, as the products do at their row
    limit); inductor's default options (tuning a kernel for one length buys nothing at the next). Why: eagerly a
    prompt runs each layer as ~150 operations (views included) launched one by one from Python, bound by the host
    where the device is fast (the demo pair's 9M-parameter prefill took 11-14 ms on an H200,
    docs/performance.md#d22); compiled, a layer is a few fused kernels and the products.
    Opt-in (--prompt-graphs: the target's and the draft's compile_prompts()) until measured on a GPU; BatchEngine
    compiles both sides of the row limit at warm-up or before its first prefill. A product policy whose lowering
    needs fixed shapes (oneDNN's packed weights) keeps its prompts eager (products.compiles_any_length)."""
    cache_dir()
    from torch import _dynamo
    from torch.fx.experimental import _config as fx_config

    _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 64)
    compiled = torch.compile(fn, dynamic=True)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        # without duck sizing: a length equal to another size of the first call (2 tokens and 2 key-value heads)
        # would be traced as that size, and the graph would hold for that one length (the next compiled again).
        # (Set and put back by hand: fx_config.patch costs ~6x as much, and this runs per layer of a prompt.)
        prev = fx_config.use_duck_shape
        fx_config.use_duck_shape = False
        try:
            return compiled(*args, **kwargs)
        finally:
            fx_config.use_duck_shape = prev

    return call


class _Local(threading.local):
    prompt: bool = False  # inside prompt_calls on this thread (the class's value: a thread that never entered one)


_LOCAL = _Local()


# SDPA's backends for calls whose shapes change from call to call: not cuDNN's, which builds an execution plan for each
# new shape
PROMPT_SDPA = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@contextlib.contextmanager
def prompt_calls():
    """Model calls made inside are the ones whose token count changes from call to call (a prompt's prefill, the
    draft's extend over a prompt or a catch-up window); they run no code that prepares itself per shape, which would
    pay again for every new prompt length inside the timed generation: the plain (uncompiled) layers, since a
    compiled function holds one graph per token count (prompts of up to COMPILE_MAX_TOKENS reach it), and SDPA
    without cuDNN's backend, which builds a plan per shape (what that cost the GPU demo: docs/performance.md). A
    model compiled for prompts (compile_prompt: one graph for every length) runs that graph here instead.
    The compiled-graph switch is per thread (another thread's decode calls keep their graphs and bits); SDPA's
    backend choice is torch's own process-wide setting, changed for the duration (decode calls inside recorded CUDA
    graphs do not consult it). Usable as a decorator too."""
    prev = _LOCAL.prompt
    _LOCAL.prompt = True
    try:
        if torch.cuda.is_available():
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([getattr(SDPBackend, b) for b in PROMPT_SDPA]):
                yield
        else:
            yield
    finally:
        _LOCAL.prompt = prev


def in_prompt() -> bool:
    """True inside prompt_calls (on this thread): compiled decode functions stand aside. Read it outside compiled
    functions only: dynamo bakes a thread-local's value into the graph without a guard (torch 2.13), so a compiled
    function that read it would keep its first answer; code inside one takes an argument instead (the DeepSeek
    layer's `prompt`)."""
    return _LOCAL.prompt


_TWINS: dict = {}


def twin(fn, compiled: bool):
    """`fn`, or with `compiled` its compile_decode twin (built once per function): for the small bookkeeping between
    a compiled model's layers (a tree's masks and selection, a cycle's accept), where eager code runs a kernel for
    each operation and inductor fuses them into a few. The same code either way, so the same results."""
    if not compiled:
        return fn
    if fn not in _TWINS:
        _TWINS[fn] = compile_decode(fn)
    return _TWINS[fn]


def span_dynamic(mask: torch.Tensor | None, kv, visible=None):
    """Before a compiled call: the span (mask [.., T, S]) becomes a symbolic size, so a new span does not compile
    again (the token count, which picks the GEMV kernels, stays static). The KV cache [B, Hkv, S_max, hd] is
    passed narrowed to [.., :S] (new entries always land below S): were its allocation S_max visible too, the
    compiled code would guard on S == S_max or S < S_max and compile once more for the other case. `visible`
    (eaglekit.kernels.invariant_attention's slots [B, T, S], then counts and base) spans S too."""
    from torch._dynamo import maybe_mark_dynamic

    if mask is None or kv is None:
        return kv
    S = mask.shape[-1]
    kv = tuple(t[:, :, :S] for t in kv)
    maybe_mark_dynamic(mask, mask.dim() - 1)
    for t in kv:
        maybe_mark_dynamic(t, 2)
    if visible is not None:
        maybe_mark_dynamic(visible[0], 2)
    return kv
