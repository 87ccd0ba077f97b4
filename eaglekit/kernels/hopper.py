"""A bf16 decode layer for Hopper GPUs whose every kernel streams while its neighbours run (products "hopper").

Why: with the Triton kernels of products "invariant" (eaglekit.kernels.invariant_gemm, .invariant_attention,
.invariant_norm) each of a layer's ~10 kernels drains the memory at its end and ramps it at the next one's start, so
the 8B step sat well below the GPU's copy bandwidth. Here (eaglekit/kernels/hopper.cu) each kernel is a programmatic
dependent launch: it lets its successor launch at once, and the successor's weight streams by bulk copies into
shared memory *before* it waits for its input; the attention copies the committed keys before its wait likewise. A
layer is five kernels: q/k/v with its RMSNorm folded in (the norm's weight times x comes from the kernel before, its
1/rms scales the sums in the epilogue) and the rotary embedding and the cache write in its epilogue; attention; o
with the residual add, whose epilogue also writes the next norm's input and its statistics; gate/up with its norm and
SwiGLU; down as o. The lm_head takes the same product. Figures (the 8B step against "invariant"):
docs/performance.md#d1 (the kernels), docs/performance.md#d2 (the norms folded in). What products "auto" picks
where it runs (eaglekit.kernels.products.choose).

The arithmetic of a row never depends on the rows beside it (the products' rows are the tensor cores' A rows, a
norm's statistics are each row's own sums in a fixed order, the attention takes each row's keys in logical order in
fixed 32-key chunks, its parts set by the span alone): a token verified in a tree gives the bits it
gives stepped alone, so bf16 speculative output stays identical to the bf16 baseline, as with "invariant". Its bits
are not invariant's (other summation orders): the guarantee holds within one kind.

Where it runs: eaglekit's Llama-family decoder in bf16 on an sm_90 GPU, batch 1, head_dim 128, 1-8 query heads a KV
head, no biases, no q/k norm, no sliding window, hidden and intermediate sizes multiples of 2048 (`reason` says
which condition fails). Built at first use with nvcc (seconds; kept under eaglekit's cache folder, keyed by the
source and the nvcc version, so the next run loads it in milliseconds). Elsewhere (prompts over 64 tokens, batched
rows, the draft), "invariant".

The CUDA entry points take one argument struct each (LinearArgs, QkvArgs, RmsArgs, AttnArgs below mirror hopper.cu's
ek_hopper_*_args field by field; tests/kernels/test_hopper.py checks them against the source).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("hopper.cu")
SOURCES = (SOURCE, SOURCE.with_name("hopper_ptx.cuh"))  # what a build reads (the library's name digests them)
EPI_PLAIN, EPI_RESID, EPI_SWIGLU = 0, 1, 2
MAX_ROWS = 64  # rows a product or the attention takes in one launch (4 tiles of 16)
ACH = 32  # keys a chunk of the attention (hopper.cu)
MAX_PARTS = 64  # the attention's 32-key chunks counted for its parts at most (past that a part folds more chunks)
REPS = (1, 2, 4, 8)  # query heads a KV head the attention is built for


class Unavailable(RuntimeError):
    """The hopper kernels cannot run here (no nvcc, not an sm_90 GPU, a build that failed): the message says which."""


def reason(cfg, device, dtype) -> str | None:
    """Why the hopper layer cannot run a model of this config on `device` in `dtype`, or None where it can."""
    return device_reason(device, dtype) or shape_reason(cfg) or build_reason()


def device_reason(device, dtype=torch.bfloat16) -> str | None:
    """Why these kernels cannot run on `device` in `dtype`, or None where they can."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "it runs on CUDA GPUs only"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "it needs an sm_90 GPU (H100/H200: bulk copies and mbarriers)"
    if dtype != torch.bfloat16:
        return "it runs bf16 only"
    return None


def build_reason() -> str | None:
    """None where the kernels can be had: nvcc to build them, or a build of these sources already in the cache."""
    try:
        source_digest()
        if find_nvcc() is None and prebuilt() is None:
            return "no nvcc found (set CUDA_HOME or put nvcc on PATH) to build its kernels"
    except Unavailable as e:  # (an install without the CUDA source)
        return str(e)
    return None


def _heads_reason(num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    if head_dim != 128:
        return f"head_dim {head_dim} is not 128"
    if num_heads % num_kv_heads or num_heads // num_kv_heads not in REPS:
        return f"{num_heads} query heads over {num_kv_heads} KV heads is not 1, 2, 4 or 8 a KV head"
    return None


def shape_reason(cfg) -> str | None:
    """Why the hopper kernels do not take a model of this config (eaglekit.models.config.TargetConfig), or None."""
    heads = _heads_reason(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    checks = [
        (heads is None, heads),
        (
            cfg.hidden_size % 2048 == 0
            and cfg.intermediate_size % 2048 == 0
            and cfg.num_heads * cfg.head_dim % 2048 == 0,
            "hidden, intermediate and attention widths must be multiples of 2048",
        ),
        (not (cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias), "biases are not supported"),
        (not cfg.qk_norm, "q/k norms are not supported"),
        (cfg.sliding_window is None, "sliding-window attention is not supported"),
        (cfg.vocab_size % 8 == 0, f"vocab_size {cfg.vocab_size} is not a multiple of 8"),
    ]
    return next((why for ok, why in checks if not ok), None)


# --- the build: nvcc at first use, cached by the digests of the sources and of the compiler ---------------------------
def find_nvcc() -> str | None:
    for cand in (
        os.environ.get("CUDACXX"),
        os.environ.get("CUDA_HOME") and f"{os.environ['CUDA_HOME']}/bin/nvcc",
        shutil.which("nvcc"),
        "/usr/local/cuda/bin/nvcc",
    ):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """`nvcc --version`'s output (what the cache key digests: another compiler may build other code)."""
    try:
        run = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{nvcc} --version failed: {e}") from e
    if run.returncode != 0:
        raise Unavailable(f"{nvcc} --version failed: {run.stderr.strip()[-500:]}")
    return run.stdout


def build_command(nvcc: str, out: Path) -> list[str]:
    return [
        nvcc,
        "-O3",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-o",
        str(out),
        str(SOURCE),
    ]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def source_digest() -> str:
    missing = [p.name for p in SOURCES if not p.exists()]
    if missing:
        raise Unavailable(
            f"this eaglekit install lacks {', '.join(missing)} (its CUDA source): reinstall eaglekit, or "
            "use --products invariant"
        )
    return _digest(b"".join(p.read_bytes() for p in SOURCES))


def _cache_folder() -> Path:
    from .compiling import cache_dir

    return cache_dir().parent / "cuda"


def library_path(nvcc: str) -> Path:
    """Where the library `nvcc` builds lives: eaglekit's cache folder (next to inductor's), named by the digests of
    the sources and of `nvcc --version` (a new compiler builds anew rather than load another's library)."""
    return _cache_folder() / f"hopper-{source_digest()}-{_digest(nvcc_version(nvcc).encode())}-sm90a.so"


def prebuilt() -> Path | None:
    """The newest library built from these sources by any nvcc (where no nvcc is found: a machine that only runs
    them), or None."""
    found = sorted(_cache_folder().glob(f"hopper-{source_digest()}-*-sm90a.so"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


BUILD_SECONDS: float | None = None  # what this process spent building the library (None: loaded from the cache)
_LIB = None


def build(nvcc: str, path: Path) -> float:
    """Build the library into `path` atomically (a crash mid-build leaves no half library); the seconds it took."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    t0 = time.perf_counter()
    # (a one-time cost a user should see: the next run loads the cached library in milliseconds)
    print(
        f"eaglekit: building the hopper kernels with nvcc (first use, ~10-60 s) into {path.parent}",
        file=sys.stderr,
        flush=True,
    )
    run = subprocess.run(build_command(nvcc, Path(tmp)), capture_output=True, text=True)
    if run.returncode != 0:
        os.unlink(tmp)
        raise Unavailable(f"nvcc could not build {SOURCE.name}: {run.stderr.strip()[-2000:]}")
    os.replace(tmp, path)
    seconds = time.perf_counter() - t0
    print(f"eaglekit: hopper kernels built in {seconds:.1f} s (cached)", file=sys.stderr, flush=True)
    return seconds


def library() -> ctypes.CDLL:
    """The kernels, built on first use and loaded (once a process)."""
    global _LIB, BUILD_SECONDS
    if _LIB is not None:
        return _LIB
    nvcc = find_nvcc()
    if nvcc is None:
        path = prebuilt()
        if path is None:
            raise Unavailable(
                "products 'hopper' builds its CUDA kernels with nvcc, and none was found: set CUDA_HOME "
                "or put nvcc on PATH, or use --products invariant"
            )
    else:
        path = library_path(nvcc)
        if not path.exists():
            BUILD_SECONDS = build(nvcc, path)
    lib = ctypes.CDLL(str(path))
    for name, args in ENTRY_POINTS.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.POINTER(args)], ctypes.c_int
    lib.ek_hopper_error.argtypes, lib.ek_hopper_error.restype = [ctypes.c_int], ctypes.c_char_p
    lib.ek_hopper_sm_count.argtypes, lib.ek_hopper_sm_count.restype = [], ctypes.c_int
    _LIB = lib
    return lib


# --- the entry points' argument structs: hopper.cu's ek_hopper_*_args, field by field, in order ----------------
_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class LinearArgs(ctypes.Structure):
    _fields_ = [
        ("epi", _i),
        ("W", _p),
        ("x", _p),
        ("y", _p),
        ("res", _p),
        ("M", _i),
        ("N", _i),
        ("K", _i),
        ("ldx", _i),
        ("ss_in", _p),
        ("nss", _i),
        ("eps", _f),
        ("xg", _p),
        ("g", _p),
        ("ss_out", _p),
        ("grid", _i),
        ("stream", _p),
    ]


class QkvArgs(ctypes.Structure):
    _fields_ = [
        ("W", _p),
        ("x", _p),
        ("q_out", _p),
        ("M", _i),
        ("K", _i),
        ("ldx", _i),
        ("H", _i),
        ("Hkv", _i),
        ("hd", _i),
        ("kc", _p),
        ("vc", _p),
        ("pos", _p),
        ("inv_freq", _p),
        ("base", _p),
        ("cap", _i),
        ("ss_in", _p),
        ("nss", _i),
        ("eps", _f),
        ("grid", _i),
        ("stream", _p),
    ]


class RmsArgs(ctypes.Structure):
    _fields_ = [("x", _p), ("w", _p), ("y", _p), ("M", _i), ("K", _i), ("ss", _p), ("stream", _p)]


class AttnArgs(ctypes.Structure):
    _fields_ = [
        ("rep", _i),
        ("q", _p),
        ("ldq", _i),
        ("K", _p),
        ("V", _p),
        ("cap", _i),
        ("base", _p),
        ("block", _p),
        ("cols", _i),
        ("acc", _p),
        ("ml", _p),
        ("tickets", _p),
        ("out", _p),
        ("ldo", _i),
        ("rows", _i),
        ("hkv", _i),
        ("parts", _i),
        ("first", _p),
        ("kn", _p),
        ("vn", _p),
        ("kn_t", _i),
        ("kn_h", _i),
        ("vn_t", _i),
        ("vn_h", _i),
        ("stream", _p),
    ]


ENTRY_POINTS = {
    "ek_hopper_linear": LinearArgs,
    "ek_hopper_qkv": QkvArgs,
    "ek_hopper_rms": RmsArgs,
    "ek_hopper_attn": AttnArgs,
}
C_STRUCTS = {
    LinearArgs: "ek_hopper_linear_args",
    QkvArgs: "ek_hopper_qkv_args",
    RmsArgs: "ek_hopper_rms_args",
    AttnArgs: "ek_hopper_attn_args",
}


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream  # (a graph being recorded: its capture stream)


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


class Kernels:
    """The launches, on torch tensors (shapes checked here, so the library's -1 means a bug). Every launch goes into
    torch's current stream, so CUDA graphs record it."""

    def __init__(self, device):
        self.lib = library()
        self.device = torch.device(device)
        with torch.cuda.device(self.device):
            self.grid = 2 * self.lib.ek_hopper_sm_count()  # two 100 KB blocks an SM
        # the attention's tickets: one per (row, KV head), zero between launches (the merging block resets its own)
        self.tickets = torch.zeros(MAX_ROWS * 64, dtype=torch.int32, device=self.device)

    def _call(self, entry: str, args: ctypes.Structure) -> None:
        err = getattr(self.lib, entry)(ctypes.byref(args))
        if err:
            raise RuntimeError(f"{entry}: {self.lib.ek_hopper_error(err).decode()}")

    @staticmethod
    def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
        """Whether `linear` takes y = x @ w^T (else the caller's fallback)."""
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        return (
            x.is_cuda
            and x.dtype == torch.bfloat16
            and w.dtype == torch.bfloat16
            and w.dim() == 2
            and x.shape[-1] == w.shape[1]
            and w.shape[1] % 2048 == 0
            and w.shape[0] % 8 == 0
            and w.is_contiguous()
            and x.is_contiguous()
            and 1 <= rows <= MAX_ROWS
        )

    @staticmethod
    def _norm(norm) -> dict:
        """The struct fields (ss_in, nss, eps) from `norm` = (ss [M, nss] fp32, eps) or None."""
        if norm is None:
            return {"ss_in": None, "nss": 0, "eps": 0.0}
        ss, eps = norm
        assert ss.dtype == torch.float32 and ss.dim() == 2 and ss.is_contiguous()
        return {"ss_in": ss.data_ptr(), "nss": ss.shape[1], "eps": eps}

    def linear(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        epi: int = EPI_PLAIN,
        res: torch.Tensor | None = None,
        norm=None,
        stats: torch.Tensor | None = None,
    ):
        """x [.., K] @ w[N, K]^T, then the epilogue: EPI_RESID adds `res` (x's shape with N), EPI_SWIGLU takes w as
        [gate; up] rows and gives silu(gate) * up ([.., N / 2]).

        A norm in the product: `norm` = (ss, eps) says x is g * h (an RMSNorm's weight times its input) with ss
        [M, n] partial sums of h^2; each row's sums are scaled by rsqrt(sum(ss) / K + eps) before the epilogue.
        `stats` (EPI_RESID only): the next norm's weight g [N]; then the result is (y, y * g, ss [M, N / 8]: each 8
        columns' share), what the next product takes as its x and its `norm`."""
        K, N = x.shape[-1], w.shape[0]
        M = x.numel() // K
        y = torch.empty(*x.shape[:-1], N // 2 if epi == EPI_SWIGLU else N, device=x.device, dtype=x.dtype)
        if res is not None:
            assert res.is_contiguous() and res.shape == y.shape and res.dtype == y.dtype
        xg = ss = None
        if stats is not None:
            assert epi == EPI_RESID and stats.shape == (N,) and stats.dtype == y.dtype and stats.is_contiguous()
            xg = torch.empty_like(y)
            ss = torch.empty(M, N // 8, device=x.device, dtype=torch.float32)
        self._call(
            "ek_hopper_linear",
            LinearArgs(
                epi=epi,
                W=w.data_ptr(),
                x=x.data_ptr(),
                y=y.data_ptr(),
                res=_ptr(res),
                M=M,
                N=N,
                K=K,
                ldx=K,
                **self._norm(norm),
                xg=_ptr(xg),
                g=_ptr(stats),
                ss_out=_ptr(ss),
                grid=self.grid,
                stream=_stream(),
            ),
        )
        return y if stats is None else (y, xg, ss)

    def rms_stats(self, x: torch.Tensor, w: torch.Tensor):
        """The first layer's norm for the q/k/v product that applies it: (w * x, ss [M, 1] each row's sum of x^2)."""
        K = x.shape[-1]
        M = x.numel() // K
        y = torch.empty_like(x)
        ss = torch.empty(M, 1, device=x.device, dtype=torch.float32)
        self._call(
            "ek_hopper_rms",
            RmsArgs(x=x.data_ptr(), w=w.data_ptr(), y=y.data_ptr(), M=M, K=K, ss=ss.data_ptr(), stream=_stream()),
        )
        return y, ss

    def qkv(self, h, w, heads: tuple[int, int, int], kc, vc, pos, inv_freq, base, norm=None) -> torch.Tensor:
        """q (rotated) [M, H hd] from h [M, K]; k (rotated) and v written to the layer's cache kc, vc [Hkv, cap, hd]
        at slots base[0] + row. pos [M] int64 (each row's position), inv_freq [hd / 2] float32 (Rotary's); base: a
        device int64 (the cache's committed length). `norm`: as linear's."""
        H, Hkv, hd = heads
        M, K = h.shape
        assert kc.is_contiguous() and vc.is_contiguous() and pos.is_contiguous() and inv_freq.is_contiguous()
        assert base.dtype == pos.dtype == torch.int64 and pos.shape == (M,) and inv_freq.dtype == torch.float32
        q = torch.empty(M, H * hd, device=h.device, dtype=h.dtype)
        self._call(
            "ek_hopper_qkv",
            QkvArgs(
                W=w.data_ptr(),
                x=h.data_ptr(),
                q_out=q.data_ptr(),
                M=M,
                K=K,
                ldx=K,
                H=H,
                Hkv=Hkv,
                hd=hd,
                kc=kc.data_ptr(),
                vc=vc.data_ptr(),
                pos=pos.data_ptr(),
                inv_freq=inv_freq.data_ptr(),
                base=base.data_ptr(),
                cap=kc.shape[1],
                **self._norm(norm),
                grid=self.grid,
                stream=_stream(),
            ),
        )
        return q

    def scratch(self, rows: int, span: int, Hkv: int, rep: int):
        """The attention's part buffers for a call of `rows` rows whose keys lie below `span` (all its layers'):
        `parts` counts the span's 32-key chunks up to MAX_PARTS; the kernel takes four chunks a part (so it uses the
        first ceil(parts / 4) of these buffers), past MAX_PARTS chunks each part folds chunks p, p + parts, ... (so the
        grid and these buffers stay bounded however long the span; the parts depend on the span only, never on the
        rows)."""
        parts = min(math.ceil(span / ACH), MAX_PARTS)
        acc = torch.empty(rows * Hkv * parts * rep * 128, device=self.device, dtype=torch.float32)
        ml = torch.empty(rows * Hkv * parts * rep * 2, device=self.device, dtype=torch.float32)
        return acc, ml, parts

    def attn(self, q, kc, vc, base, block, heads, scratch, new=None) -> torch.Tensor:
        """q [M, H hd] over the cache kc, vc [Hkv, cap, hd] (slot stride hd; cap: the head stride in slots): row t sees
        the committed slots below base[0] and the pending slot base[0] + c where block[t, c] (bool [M, C], C <= 64;
        a verify's: [M, M], its tree ancestors and itself). -> [M, H hd]. `new` = (first, kn, vn): row r's own key
        is not in the cache yet but at kn[r], vn[r] ([M, Hkv, hd] views, head_dim innermost), its slot first[0] + r;
        the kernel reads it there and writes it to the cache (the draft's calls: pending_attention)."""
        H, Hkv, hd = heads
        M = q.shape[0]
        acc, ml, parts = scratch
        assert block.dtype == torch.bool and block.dim() == 2 and block.shape[0] == M and block.is_contiguous()
        assert 1 <= block.shape[1] <= 64 and kc.stride(-1) == 1 and kc.stride(-2) == hd and vc.stride() == kc.stride()
        assert M <= MAX_ROWS and Hkv <= 64 and acc.numel() >= M * Hkv * parts * (H // Hkv) * 128
        out = torch.empty(M, H * hd, device=q.device, dtype=q.dtype)
        first = kn = vn = None
        strides = (0, 0, 0, 0)
        if new is not None:
            first, kn, vn = new
            assert first.dtype == torch.int64 and kn.shape == vn.shape == (M, Hkv, hd)
            # (16-byte rows: the kernel moves them in uint4s)
            kn, vn = (
                t
                if t.stride(-1) == 1 and t.stride(0) % 8 == 0 and t.stride(1) % 8 == 0 and t.data_ptr() % 16 == 0
                else t.contiguous()
                for t in (kn, vn)
            )
            strides = (kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1))
        self._call(
            "ek_hopper_attn",
            AttnArgs(
                rep=H // Hkv,
                q=q.data_ptr(),
                ldq=q.stride(0),
                K=kc.data_ptr(),
                V=vc.data_ptr(),
                cap=kc.stride(0) // hd,
                base=base.data_ptr(),
                block=block.data_ptr(),
                cols=block.shape[1],
                acc=acc.data_ptr(),
                ml=ml.data_ptr(),
                tickets=self.tickets.data_ptr(),
                out=out.data_ptr(),
                ldo=out.stride(0),
                rows=M,
                hkv=Hkv,
                parts=parts,
                first=_ptr(first),
                kn=_ptr(kn),
                vn=_ptr(vn),
                kn_t=strides[0],
                kn_h=strides[1],
                vn_t=strides[2],
                vn_h=strides[3],
                stream=_stream(),
            ),
        )
        return out

    def layers(self, layers, x, pos, inv_freq, cache_layer, base, block, scratch, capture=(), caught=None):
        """The decoder layers (eaglekit.models.llama.DecoderLayer, fused) for x [1, T, D] at positions pos [T]: the new
        keys and values of layer i written to cache_layer(i) ([1, Hkv, cap, hd] each) at base[0] + t, each row
        attending as block [T, T] says (attn). The residual stream after layer i goes to caught[i] for i in capture.

        A layer is five kernels: q/k/v with its norm in it, attention, o (+ the residual, and the next norm's input
        and statistics in its epilogue), gate/up with its norm in it, down (as o); the first layer's norm statistics
        come from one norm kernel (rms_stats)."""
        _, T, D = x.shape
        x2 = x.reshape(T, D)
        xg, ss = self.rms_stats(x2, layers[0].input_layernorm.weight)
        for i, layer in enumerate(layers):
            a, m, kv = layer.self_attn, layer.mlp, cache_layer(i)
            heads = (a.num_heads, a.num_kv_heads, a.head_dim)
            post = layer.post_attention_layernorm
            q = self.qkv(
                xg, a.qkv_weight, heads, kv[0][0], kv[1][0], pos, inv_freq, base, norm=(ss, layer.input_layernorm.eps)
            )
            o = self.attn(q, kv[0][0], kv[1][0], base, block, heads, scratch)
            x2, hg, hs = self.linear(o, a.o_proj.weight, EPI_RESID, x2, stats=post.weight)
            act = self.linear(hg, m.gate_up_weight, EPI_SWIGLU, norm=(hs, post.eps))
            if i + 1 < len(layers):
                x2, xg, ss = self.linear(
                    act, m.down_proj.weight, EPI_RESID, x2, stats=layers[i + 1].input_layernorm.weight
                )
            else:
                x2 = self.linear(act, m.down_proj.weight, EPI_RESID, x2)
            if i in capture:
                caught[i] = x2.view(1, T, D)
        return x2.view(1, T, D)


# --- the attention alone, as a torch op: the draft's decode attention (eaglekit.models.layers.Attention `pending`) ---
def draft_reason(num_heads: int, num_kv_heads: int, head_dim: int, device, dtype) -> str | None:
    """Why `pending_attention` cannot run a draft layer of these heads on `device` in `dtype`, or None where it can."""
    return device_reason(device, dtype) or _heads_reason(num_heads, num_kv_heads, head_dim) or build_reason()


_BY_DEVICE: dict = {}
_PENDING_OP = None


def kernels_for(device) -> Kernels:
    """One Kernels per device (its tickets are the attention's: launches on one stream take them in turn)."""
    key = str(torch.device(device))
    if key not in _BY_DEVICE:
        _BY_DEVICE[key] = Kernels(device)
    return _BY_DEVICE[key]


def pending_attention(q, k, v, kn, vn, base, block, first) -> torch.Tensor:
    """`Kernels.attn` as a registered op (torch.compile keeps it whole, CUDA graphs record its launch): q [T, H hd]
    over the cache k, v [Hkv, S, hd] (views of one layer's, S the span), row t seeing the slots below base[0] and the
    pending slot base[0] + c where block[t, c] ([T, C] bool, C <= 64); this call's keys kn, vn [T, Hkv, hd], for
    slots first[0] + r, are read from there and written into k, v by the kernel. The op mutates the cache itself
    because an index_copy_ beside a custom op made inductor copy the whole cache each call. -> [T, H hd]. Why for a
    draft: cuDNN's SDPA does not split the keys, so a tree level at a few rows took about twice this kernel's time
    (docs/performance.md#d12)."""
    return pending_op()(q, k, v, kn, vn, base, block, first)


def pending_op():
    """pending_attention's registered op (an OpOverload), registered on first use: fetch it before torch.compile
    traces a call (Eagle3Draft.set_attention does), since dynamo cannot trace the registration (the name's digest):
    a registration inside a trace breaks the graph there, and a compiled chain runs its pieces eagerly."""
    global _PENDING_OP
    if _PENDING_OP is None:
        _PENDING_OP = _register_pending()._opoverload
    return _PENDING_OP


def _register_pending():
    from torch.library import custom_op

    from .compiling import op_name

    @custom_op(op_name("pending_attention", __file__, *SOURCES), mutates_args=("k", "v"), device_types="cuda")
    def op(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kn: torch.Tensor,
        vn: torch.Tensor,
        base: torch.Tensor,
        block: torch.Tensor,
        first: torch.Tensor,
    ) -> torch.Tensor:
        T, Hkv, (_, S, hd) = q.shape[0], k.shape[0], k.shape
        H = q.shape[1] // hd
        kb = kernels_for(q.device)
        q = q if q.stride(1) == 1 else q.contiguous()
        return kb.attn(
            q, k, v, base, block.contiguous(), (H, Hkv, hd), kb.scratch(T, S, Hkv, H // Hkv), new=(first, kn, vn)
        )

    @op.register_fake
    def _(q, k, v, kn, vn, base, block, first):
        return q.new_empty(q.shape)

    return op
