"""Products of a few rows by a large weight (decode and verify shapes): one pass over the weight per 16 rows, and the
same arithmetic for a row whether it comes alone or with up to 63 others.

Why it was built: at 1 row inductor emits GEMV kernels near copy bandwidth, but 2..16 rows go to cuBLAS's small-M
GEMMs (a 6-row verify cost 1.21-1.24 steps where its bytes allow ~1.02), and cuBLAS picks other kernels (other
reduction orders) for 1 row and for k rows, so in bf16 a token verified in a tree rounds differently from the same
token stepped alone. Alone it is faster than cuBLAS at 6 rows in isolation, level inside the 8B verify and slower
than inductor's GEMVs at 1 row (docs/performance.md#d13), and bf16 still parts in the
attention. So it is the product half of products "invariant" (eaglekit.kernels.products.Invariant, with
eaglekit.kernels.invariant_attention and .invariant_norm): bf16 output identical to the baseline.

How: y[M, N] = x[M, K] @ W[N, K]^T for M <= 64 with a Triton kernel whose tile is always 16 rows (rows past M are
masked zeros; more rows, more tiles, each its own program, or with SHARED_TILES up to four to a program that reads
the weight tile once for all of them, each tile its own dot). The grid covers N in blocks and K in `split` slices;
each program accumulates its slice in fp32 with the tensor cores, partial sums land in [split, M, N] fp32 and a
second kernel adds them in a fixed order. The tile config depends on (N, K) only, never on M, so each row's result
is bit-identical for every M: the batch invariance that bf16 losslessness needs (tests/kernels/test_invariant_gemm.py
checks it, in Triton's interpreter on a CPU and on the GPU). The same kernels do the invariant policy's epilogues
(`linear`'s `gated`: silu(gate) * up over a [gate; up] weight; `residual`: the layer's residual add), so a layer has
three kernels fewer; what they compute is `epilogue` in plain torch.

Runs where Triton runs (CUDA); elsewhere, and for fp32 (tensor-core tiles would round fp32 inputs to tf32), `linear`
is F.linear (then `epilogue`).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # more rows than this go to F.linear (rows come in 16-row tiles)
# 16-row tiles one program takes (1, 2 or 4; $EAGLEKIT_GEMM_TILES): 1 reads the weight once per tile, so a call of 64
# rows reads it four times; 4 gives a program up to four tiles, each its own dot against the weight tile read once
# (a row's arithmetic is the same either way: tiles_for), and narrower column blocks keep the programs' count
_env = os.environ.get("EAGLEKIT_GEMM_TILES", "1").strip()
SHARED_TILES = int(_env) if _env.isdigit() else _env  # (anything else: tiles_for names the variable and the choices)
HAVE_TRITON = importlib.util.find_spec("triton") is not None
_DTYPES = (torch.bfloat16, torch.float16)


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `linear` takes the Triton path for this input (CUDA, or Triton's interpreter in tests; bf16/fp16;
    at most MAX_ROWS rows; w in x's dtype, or int8 with `linear`'s scale)."""
    if not HAVE_TRITON or x.dtype not in _DTYPES or w.dtype not in (x.dtype, torch.int8) or w.stride(-1) != 1:
        return False
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    return x.numel() // x.shape[-1] <= MAX_ROWS


def config(N: int, K: int, exact: bool = False, int8: bool = False) -> tuple[int, int, int, int, int] | None:
    """(block_n, block_k, split, warps, stages) for an [N, K] weight: this GPU's tuned entry (`tune`) if there is one
    (None where tuning found cuBLAS faster, unless `exact`: batch-invariant products never leave the kernel), else
    `rule`. A function of the weight's shape only: that is what makes a row's rounding independent of M. An int8
    weight (eaglekit.kernels.int8) has its own entries ("int8:NxK"; no cuBLAS to fall back on) and rule."""
    if int8:
        entry = tuned_table().get(f"int8:{N}x{K}")
        return tuple(entry) if entry is not None else int8_rule(N, K)
    entry = tuned_table().get(f"{N}x{K}")
    if entry == "cublas":
        return rule(N, K) if exact else None
    return tuple(entry) if entry is not None else rule(N, K)


def gated_config(cfg: tuple) -> tuple:
    """The config of a gated product (invariant_gemm.linear's `gated`) over a [gate; up] weight whose own config is
    `cfg`:
    a program reads block_n / 2 rows of each half, so programs and bytes per program stay those of the plain
    product."""
    return (cfg[0] // 2, *cfg[1:])


def rope_config(cfg: tuple, head_dim: int) -> tuple | None:
    """The config of a product that also does the rotary embedding of its output's heads (`linear`'s `rope`), from
    its weight's config: a program takes block_n columns of one head's first half and their partners, block_n at
    most half the weight's and half a head, at least 16 (tl.dot's least width); one K slice. None where no such
    config exists. A function of the weight's shape and head_dim only, as `config`."""
    half = head_dim // 2
    block_n = min(cfg[0] // 2, half)
    if head_dim % 2 or cfg[2] != 1 or block_n < 16 or half % block_n:
        return None
    return (block_n, *cfg[1:])


def rule(N: int, K: int) -> tuple[int, int, int, int, int]:
    """The untuned config, from the H200 sweep (docs/performance.md#d14): one slice of K up
    to 8192, two beyond; 128 x 128 tiles for weights of 16384 rows or more."""
    if N >= 16384:
        return 128, 128, 1, 4, 4
    block_k = 256 if K % 256 == 0 else 128
    split = 2 if K > 8192 and K % (2 * block_k) == 0 else 1
    return 64, block_k, split, 4, 4


def int8_rule(N: int, K: int) -> tuple[int, int, int, int, int]:
    """The untuned config of an int8 weight, from the H200 sweep of the 8B draft's six weights
    (docs/performance.md#d15): 256 columns of K a tile and three stages everywhere;
    weights of 16384 rows or
    more in 128-row tiles and one slice of K (gate/up 3.47, lm_head 3.66 TB/s of int8), the rest in 64-row tiles and
    K in four slices (2.7-2.9 TB/s; the 4096 x 4096 o 1.76), fewer slices where K does not split so."""
    block_k = 256 if K % 256 == 0 else 128
    if N >= 16384:
        return 128, block_k, 1, 4, 3
    split = next((s for s in (4, 2) if K % (s * block_k) == 0), 1)  # (the kernel masks a K no tile divides)
    return 64, block_k, split, 4, 3


# tile configs `tune` tries: (block_n, block_k, split, warps, stages)
GRID = [
    c
    for c in itertools.product((32, 64, 128), (128, 256, 512), (1, 2, 4), (4, 8), (3, 5))
    if c[4] * (16 + c[0]) * c[1] * 2 <= 200 * 1024
]  # the stages' tiles fit an H100/H200's shared memory


def table_path() -> Path:
    """Where tuned configs are kept, per GPU model: $EAGLEKIT_SMALLM_TABLE, else beside the inductor cache."""
    from .compiling import cache_dir

    return Path(os.environ.get("EAGLEKIT_SMALLM_TABLE") or cache_dir().parent / "invariant_gemm.json")


_TABLE = None  # this GPU's tuned entries, read once: see tuned_table


def tuned_table() -> dict:
    """This GPU's entries of the tuned table ({} without a GPU or a table). Read from disk on the first call and
    kept in a plain global, not a functools cache: torch.compile traces through a cache wrapper and would stat the
    file inside every compiled layer, a graph break at each product. kernels() makes the first call, before any
    trace."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _read_table()
    return _TABLE


def _read_table() -> dict:
    if not torch.cuda.is_available():
        return {}
    p = table_path()
    if not p.exists():
        return {}
    return json.loads(p.read_text()).get(torch.cuda.get_device_name(), {})


def graph_ms(fn, calls: int, reps: int = 7) -> float:
    """Median ms per call of fn(i), i in range(calls), recorded once into a CUDA graph (no launch gaps; give fn
    `calls` different weights whose bytes exceed the L2 cache, so they stream from HBM as in a model)."""
    from .graphs import record_graphs  # eaglekit's one way to record (warm-up on a side stream first)

    def all_calls():
        for i in range(calls):
            fn(i)

    g = record_graphs([[all_calls]], {"all": all_calls}, [])["all"]  # Triton compiles in the warm-up
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def tune(shapes, rows: int = 6, write: bool = True, log=print) -> dict:
    """Time every GRID config and cuBLAS for each [N, K] weight at `rows` rows (bf16, inside CUDA graphs) and keep
    the fastest, "cublas" where cuBLAS wins, in this GPU's table (atomically merged into table_path())."""
    run = kernels().run
    found, report = {}, []
    for N, K in shapes:
        copies = max(2, -(-600_000_000 // (N * K * 2)))  # > 10x an H200's L2
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16)
        times: dict[str | tuple[int, ...], float] = {"cublas": graph_ms(lambda i: F.linear(x, ws[i]), copies)}
        for cfg in GRID:
            if K % (cfg[1] * cfg[2]) == 0 and K // cfg[2] >= cfg[1]:
                times[cfg] = graph_ms(lambda i, c=cfg: run(x, ws[i], c), copies)
        best = min(times, key=times.__getitem__)
        found[f"{N}x{K}"] = "cublas" if best == "cublas" else list(best)
        gb = N * K * 2 / 1e9
        report.append(
            {
                "N": N,
                "K": K,
                "rows": rows,
                "best": found[f"{N}x{K}"],
                "best_tb_s": gb / times[best],
                "cublas_tb_s": gb / times["cublas"],
            }
        )
        log(
            f"invariant_gemm tune {N}x{K} at {rows} rows: {found[f'{N}x{K}']} {gb / times[best]:.2f} TB/s "
            f"(cuBLAS {gb / times['cublas']:.2f})"
        )
        del ws
    if write:
        save_entries(found)
    return {"table": found, "report": report}


def save_entries(found: dict) -> Path:
    """Merge tuned entries ("NxK" or "int8:NxK" -> config) into this GPU's table, atomically; the next use reads
    them (and kernels() names a new op after them). Returns the table's path."""
    global _TABLE
    from ..io import atomic_write_json

    p = table_path()
    whole = json.loads(p.read_text()) if p.exists() else {}
    whole.setdefault(torch.cuda.get_device_name(), {}).update(found)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(p, whole)
    _TABLE = None
    return p


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tiles_for(M: int, block_n: int, most: int | str | None = None) -> tuple[int, int]:
    """(16-row tiles a program takes, its column block) for M rows under a config of column block `block_n`, with at
    most `most` (default SHARED_TILES) tiles a program: the fewest of 1, 2, 4 covering M's tiles (`most` inside a
    compiled graph, which must not read M), and the column block narrowed as many times (not below 16, tl.dot's
    least width) so the grid keeps its programs. Neither changes a row's bits: a row's sum runs over K in the same
    slices and steps whatever the column block and the tiles beside its own (tests/kernels/test_invariant_gemm.py
    checks it)."""
    most = SHARED_TILES if most is None else most
    if most not in (1, 2, 4):
        raise ValueError(
            f"16-row tiles a program must be 1, 2 or 4, got {most!r}: set $EAGLEKIT_GEMM_TILES to one "
            "of them (1, the default: a program a tile)"
        )
    if most == 1 or torch.compiler.is_compiling():
        # `most` tiles without reading M: inside a compiled graph M may be symbolic (a prompt graph's, one for every
        # length), and reading it would hold the graph to one tile count, each new count compiling a graph of its own
        # (a draft's catch-up took 3-7 s on an H100 that way:
        # docs/performance.md#d16)
        tiles = most
    else:
        tiles = min(most, 1 << max(0, (triton_cdiv(M, 16) - 1).bit_length()))
    return tiles, min(block_n, max(16, block_n // tiles))


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None = None,
    enabled: bool = True,
    exact: bool = False,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    rope: tuple | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """epilogue(F.linear(x, w, b), residual, gated), through the small-M kernel where `enabled`, `usable` and not
    tuned to cuBLAS (`exact`: through the kernel even where cuBLAS was faster, so every product of the model is
    batch-invariant). The kernel does the epilogue itself (one kernel, not three) unless there is a bias.
    `rope` = (cos, sin [rows of x, head_dim], rope_cols): the rotary embedding of the output's heads below column
    rope_cols, in the kernel; only where folds_rope() says it can. `scale` [rows of w] (float32): w is int8 and the
    product is x @ (w * scale[:, None])^T (eaglekit.kernels.int8; no rotary then)."""
    if (scale is None) == (w.dtype == torch.int8) or (scale is not None and rope is not None):
        raise ValueError("invariant_gemm.linear: an int8 weight comes with its scale (and without rotary), only it")
    cfg = plan(x, w, b, enabled, exact, residual, gated)
    if rope is not None and (not exact or gated or residual is not None or not _rotates(cfg, w, b, rope[0].shape[-1])):
        raise ValueError("invariant_gemm.linear: this product cannot do the rotary embedding (see folds_rope)")
    if cfg is None:
        if scale is not None:  # (scaled in float32, as the kernel does: a bf16 scale would be off by up to 0.4%)
            wide = torch.promote_types(x.dtype, torch.float32)
            y = (F.linear(x, w.to(x.dtype)).to(wide) * scale.to(wide)).to(x.dtype)
            return epilogue(y if b is None else y + b, residual, gated)
        return epilogue(F.linear(x, w, b), residual, gated)
    N = w.shape[0] // 2 if gated else w.shape[0]
    r = residual.reshape(-1, N) if residual is not None else None
    cos, sin, rope_cols = rope if rope is not None else (None, None, 0)
    y = kernels().op(x.reshape(-1, x.shape[-1]), w, r, gated, cos, sin, rope_cols, exact, scale)
    y = y.view(*x.shape[:-1], N)
    return y if b is None else y + b


def plan(x, w, b=None, enabled=True, exact=False, residual=None, gated=False) -> tuple | None:
    """The config of the weight `linear` runs this product by, None where it goes to F.linear and torch."""
    if not (enabled and usable(x, w)) or (residual is not None and residual.dtype != x.dtype):
        return None
    if b is not None and (gated or residual is not None):
        return None
    return config(w.shape[0], w.shape[1], exact, int8=w.dtype == torch.int8)


def folds_rope(x, w, b, head_dim: int) -> bool:
    """Whether `linear(x, w, b, exact=True, rope=...)` can do the rotary embedding in its kernel."""
    return _rotates(plan(x, w, b, True, True), w, b, head_dim)


def _rotates(cfg, w, b, head_dim: int) -> bool:
    """folds_rope for a product already planned (`cfg`, None where it goes to F.linear)."""
    return cfg is not None and b is None and w.shape[0] % head_dim == 0 and rope_config(cfg, head_dim) is not None


def epilogue(y: torch.Tensor, residual: torch.Tensor | None = None, gated: bool = False) -> torch.Tensor:
    """What the fused kernel does after the product, in plain torch: `gated` (y = [g | u]) -> silu(g) * u (a SwiGLU
    MLP's gate/up product), then + `residual`."""
    if gated:
        g, u = y.chunk(2, dim=-1)
        y = F.silu(g) * u
    return y if residual is None else residual + y


_KERNELS = None
_NAMED_FOR = None  # (the tuned table, SHARED_TILES) _KERNELS's op is named after
_BUILT: dict = {}  # op name -> kernels: a name registers once, so a table seen before reuses its op


def kernels():
    """`.op`, the registered op (torch.library.triton_op: torch.compile sees its kernels, CUDA graphs record them),
    and `.run(x, w, cfg)`, the same with a given config (what `tune` times). Built on first use, so that
    importing eaglekit never needs Triton. The op's name carries this GPU's tuned table (the configs it plans come
    from there) and the code's digest (compiling.op_name says why): a new table (tune) names a new op."""
    global _KERNELS, _NAMED_FOR
    table = tuned_table()  # before any trace (tuned_table says why); a global check once read
    if _KERNELS is None or _NAMED_FOR is None or table is not _NAMED_FOR[0] or SHARED_TILES != _NAMED_FOR[1]:
        from . import invariant_gemm_triton
        from .compiling import op_name

        name = op_name(
            "small_m_linear",
            __file__,
            invariant_gemm_triton.__file__,
            extra=json.dumps(table, sort_keys=True) + f"tiles{SHARED_TILES}",
        )
        if name not in _BUILT:
            _BUILT[name] = _build(name)
        _KERNELS, _NAMED_FOR = _BUILT[name], (table, SHARED_TILES)
    return _KERNELS


def _build(name: str):
    from .invariant_gemm_triton import smallm_partial, smallm_sum

    def run(
        x: torch.Tensor,
        w: torch.Tensor,
        cfg,
        wrap=lambda k: k,
        residual: torch.Tensor | None = None,
        gated: bool = False,
        rope: tuple | None = None,
        scale: torch.Tensor | None = None,
        tiles: int | None = None,
    ) -> torch.Tensor:
        """`rope` = (cos, sin [M, head_dim], rope_cols): rotary on the output's heads below column rope_cols (cfg's
        block_n is then per half head, as rope_config gives; one slice of K). `scale`: w is int8 (`linear`).
        `tiles`: at most this many 16-row tiles a program (default SHARED_TILES; tiles_for)."""
        M, K = x.shape
        N = w.shape[0] // 2 if gated else w.shape[0]
        x = x.contiguous()
        r = residual.contiguous() if residual is not None else x  # (x: a placeholder the kernels never read)
        block_n, block_k, split, warps, stages = cfg
        per_program, block_n = tiles_for(M, block_n, tiles)
        k_slice = triton_cdiv(triton_cdiv(K, split), block_k) * block_k
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        width = 2 * N if gated else N
        part = y if split == 1 else torch.empty((split, M, width), device=x.device, dtype=torch.float32)
        cos, sin, rope_cols, half = _rotary_operands(x, rope, N, cfg, block_n, gated, residual)
        grid_n = triton_cdiv(N, 2 * block_n) if rope is not None else triton_cdiv(N, block_n)
        wrap(smallm_partial)[(grid_n, split, triton_cdiv(M, 16 * per_program))](
            x,
            w,
            part,
            r,
            cos,
            sin,
            scale if scale is not None else x,
            cos.stride(0),
            rope_cols,
            M,
            N,
            K,
            x.stride(0),
            w.stride(0),
            k_slice,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            DIRECT=split == 1,
            GATED=gated,
            RESIDUAL=residual is not None,
            HALF=half,
            SCALED=scale is not None,
            UP=gated or half > 0,
            TILES=per_program,
            num_warps=warps,
            num_stages=stages,
        )
        if split > 1:
            wrap(smallm_sum)[(triton_cdiv(M * N, 1024),)](
                part, r, y, M, N, SPLIT=split, BLOCK=1024, GATED=gated, RESIDUAL=residual is not None
            )
        return y

    return SimpleNamespace(op=_register(name, run), run=run)


# _build's helpers stay in this file: the op's name carries its digest (compiling.op_name), so a change renames it
def _rotary_operands(
    x: torch.Tensor, rope: tuple | None, N: int, cfg, block_n: int, gated: bool, residual: torch.Tensor | None
) -> tuple:
    """(cos, sin, rope_cols, half) as smallm_partial reads them (x stands in for cos and sin without a rotary, half
    0); refuses a rotary the launch cannot do (`run`'s docstring)."""
    cos, sin, rope_cols = rope if rope is not None else (x, x, 0)
    half = cos.shape[-1] // 2 if rope is not None else 0
    if rope is not None and (
        gated or residual is not None or N % (2 * half) or cfg[2] != 1 or half % block_n or block_n < 16
    ):
        raise ValueError(
            f"rotary in the product needs heads of {2 * half} tiling the output, one slice of K and "
            f"a block_n of 16 or more dividing half a head, no other epilogue; got N={N}, {cfg}"
        )
    return cos.contiguous(), sin.contiguous(), rope_cols, half


def _register(name: str, run):
    """`run` registered as the triton_op `name`: the op plans the weight's config as `plan` does (then its rotary or
    gated form) and launches through wrap_triton."""
    from torch.library import triton_op, wrap_triton

    @triton_op(name, mutates_args=())
    def small_m_linear(
        x: torch.Tensor,
        w: torch.Tensor,
        residual: Optional[torch.Tensor],
        gated: bool,
        cos: Optional[torch.Tensor],
        sin: Optional[torch.Tensor],
        rope_cols: int,
        exact: bool,
        scale: Optional[torch.Tensor],
    ) -> torch.Tensor:
        cfg = config(w.shape[0], w.shape[1], exact, int8=scale is not None)
        assert cfg is not None  # (the op runs only where plan() found a config for this weight)
        rope = (cos, sin, rope_cols) if cos is not None else None
        if cos is not None:  # (rope is not None)
            cfg = rope_config(cfg, cos.shape[-1])
            assert cfg is not None  # (linear() refuses a rotary the product cannot do: _rotates)
        return run(x, w, gated_config(cfg) if gated else cfg, wrap_triton, residual, gated, rope, scale)

    return small_m_linear
