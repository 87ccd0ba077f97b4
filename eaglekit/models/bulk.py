"""A bf16 decode layer for Hopper GPUs whose every kernel streams while its neighbours run (products "bulk").

Why: the step at the 8B shape sat at ~75% of the GPU's copy bandwidth with the Triton kernels of products
"invariant" (eaglekit.models.smallm, .attend, .norms): each of a layer's ~10 kernels drains the memory at its end and
ramps it at the next one's start, and the products alone, one kernel per weight, stream at ~85% at best
(benchmarks/NOTES.md, "The products' ceiling"). Here (eaglekit/models/bulk.cu) each kernel is a programmatic dependent
launch: it lets its successor launch at once, and the successor's weight streams by bulk copies into shared memory
*before* it waits for its input; the attention copies the committed keys before its wait likewise. A layer is seven
kernels: RMSNorm; q/k/v with the rotary embedding and the cache write in its epilogue; attention; o with the residual
add; RMSNorm; gate/up with SwiGLU; down with the residual add. The lm_head takes the same product. The recorded 8B
step: 4.17-4.29 ms on an H200 (82.5-86.6% of its copy bandwidth) against "invariant"'s ~4.75 (benchmarks/NOTES.md,
"Products bulk"; benchmarks/bulk_step.py). Verifies past 8 rows are slower than "invariant"'s (NOTES): opt-in.

The arithmetic of a row never depends on the rows beside it (the products' rows are the tensor cores' A rows, the
attention takes each row's keys in logical order in fixed 32-key parts): a token verified in a tree gives the bits it
gives stepped alone, so bf16 speculative output stays identical to the bf16 baseline, as with "invariant". Its bits
are not invariant's (other summation orders): the guarantee holds within one kind.

Where it runs: eaglekit's Llama-family decoder in bf16 on an sm_90 GPU, batch 1, head_dim 128, 1-8 query heads a KV
head, no biases, no q/k norm, no sliding window, hidden and intermediate sizes multiples of 2048 (`reason` says
which condition fails). Built at first use with nvcc (11 s on the H200; kept under eaglekit's cache folder, keyed by
the source, so the next run loads it in milliseconds). Elsewhere (prompts over 64 tokens, batched rows, the draft),
"invariant".
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("bulk.cu")
SOURCES = (SOURCE, SOURCE.with_name("bulk_ptx.cuh"))  # what a build reads (the library's name digests them)
EPI_PLAIN, EPI_RESID, EPI_SWIGLU = 0, 1, 2
MAX_ROWS = 64  # rows a product or the attention takes in one launch (4 tiles of 16)
ACH = 32  # keys a part of the attention (bulk.cu)
REPS = (1, 2, 4, 8)  # query heads a KV head the attention is built for


class Unavailable(RuntimeError):
    """The bulk kernels cannot run here (no nvcc, not an sm_90 GPU, a build that failed): the message says which."""


def reason(cfg, device, dtype) -> str | None:
    """Why the bulk layer cannot run a model of this config on `device` in `dtype`, or None where it can."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "it runs on CUDA GPUs only"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "it needs an sm_90 GPU (H100/H200: bulk copies and mbarriers)"
    if dtype != torch.bfloat16:
        return "it runs bf16 only"
    why = shape_reason(cfg)
    if why is None and find_nvcc() is None:
        return "no nvcc found (set CUDA_HOME or put nvcc on PATH) to build its kernels"
    return why


def shape_reason(cfg) -> str | None:
    """Why the bulk kernels do not take a model of this config (eaglekit.models.config.TargetConfig), or None."""
    checks = [
        (cfg.head_dim == 128, f"head_dim {cfg.head_dim} is not 128"),
        (cfg.num_heads % cfg.num_kv_heads == 0 and cfg.num_heads // cfg.num_kv_heads in REPS,
         f"{cfg.num_heads} query heads over {cfg.num_kv_heads} KV heads is not 1, 2, 4 or 8 a KV head"),
        (cfg.hidden_size % 2048 == 0 and cfg.intermediate_size % 2048 == 0
         and cfg.num_heads * cfg.head_dim % 2048 == 0,
         "hidden, intermediate and attention widths must be multiples of 2048"),
        (not (cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias), "biases are not supported"),
        (not cfg.qk_norm, "q/k norms are not supported"),
        (cfg.sliding_window is None, "sliding-window attention is not supported"),
        (cfg.vocab_size % 8 == 0, f"vocab_size {cfg.vocab_size} is not a multiple of 8"),
    ]
    return next((why for ok, why in checks if not ok), None)


def find_nvcc() -> str | None:
    for cand in (os.environ.get("CUDACXX"), os.environ.get("CUDA_HOME") and f"{os.environ['CUDA_HOME']}/bin/nvcc",
                 shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def build_command(nvcc: str, out: Path, defines: tuple[str, ...] = ()) -> list[str]:
    return [nvcc, "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
            *(f"-D{d}" for d in defines), "-o", str(out), str(SOURCE)]


def library_path(defines: tuple[str, ...] = ()) -> Path:
    """Where the built library lives: eaglekit's cache folder (next to inductor's), named by the source's digest (and
    the build options of a benchmark's variant)."""
    from .compiling import cache_dir

    missing = [p.name for p in SOURCES if not p.exists()]
    if missing:
        raise Unavailable(f"this eaglekit install lacks {', '.join(missing)} (its CUDA source): reinstall eaglekit, or "
                          "use --products invariant")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + " ".join(defines).encode()).hexdigest()[:16]
    return cache_dir().parent / "cuda" / f"bulk-{digest}-sm90a.so"


_p, _i = ctypes.c_void_p, ctypes.c_int
ARGTYPES = {  # bulk.cu's extern "C" entry points (tests/test_bulk.py checks these against the source)
    "ek_bulk_linear": [_i, _p, _p, _p, _p, _i, _i, _i, _i, _i, _p],
    "ek_bulk_qkv": [_p, _p, _p, _i, _i, _i, _i, _i, _i, _p, _p, _p, _p, _p, _i, _i, _p],
    "ek_bulk_rms": [_p, _p, _p, _i, _i, ctypes.c_float, _p],
    "ek_bulk_attn": [_i, _p, _i, _p, _p, _i, _p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _p],
    "ek_bulk_set_pdl": [_i],
}
BUILD_SECONDS: float | None = None  # what this process spent building the library (None: loaded from the cache)
_LIB = None


def library(defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The kernels, built on first use (atomically: a crash mid-build leaves no half library) and loaded. `defines`
    (benchmarks only): a variant built with those macros, loaded beside the default."""
    global _LIB, BUILD_SECONDS
    if _LIB is not None and not defines:
        return _LIB
    path = library_path(defines) if defines else library_path()
    if not path.exists():
        nvcc = find_nvcc()
        if nvcc is None:
            raise Unavailable("products 'bulk' builds its CUDA kernels with nvcc, and none was found: set CUDA_HOME "
                              "or put nvcc on PATH, or use --products invariant")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        t0 = time.perf_counter()
        run = subprocess.run(build_command(nvcc, Path(tmp), defines), capture_output=True, text=True)
        if run.returncode != 0:
            os.unlink(tmp)
            raise Unavailable(f"nvcc could not build {SOURCE.name}: {run.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
        BUILD_SECONDS = time.perf_counter() - t0
    lib = ctypes.CDLL(str(path))
    for name, types in ARGTYPES.items():
        getattr(lib, name).argtypes = types
    lib.ek_bulk_error.restype = ctypes.c_char_p
    if not defines:
        _LIB = lib
    return lib


def _stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # (a graph being recorded: its capture stream)


class Kernels:
    """The launches, on torch tensors (shapes checked here, so the library's -1 means a bug). Every launch goes into
    torch's current stream, so CUDA graphs record it."""

    def __init__(self, device):
        self.lib = library()
        self.device = torch.device(device)
        with torch.cuda.device(self.device):
            self.grid = 2 * self.lib.ek_bulk_sm_count()  # two 100 KB blocks an SM
        # the attention's tickets: one per (row, KV head), zero between launches (the merging block resets its own)
        self.tickets = torch.zeros(MAX_ROWS * 64, dtype=torch.int32, device=self.device)

    def _ok(self, err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"bulk {what}: {self.lib.ek_bulk_error(err).decode()}")

    @staticmethod
    def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
        """Whether `linear` takes y = x @ w^T (else the caller's fallback)."""
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        return (x.is_cuda and x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16 and w.dim() == 2
                and x.shape[-1] == w.shape[1] and w.shape[1] % 2048 == 0 and w.shape[0] % 8 == 0
                and w.is_contiguous() and x.is_contiguous() and 1 <= rows <= MAX_ROWS)

    def linear(self, x: torch.Tensor, w: torch.Tensor, epi: int = EPI_PLAIN,
               res: torch.Tensor | None = None) -> torch.Tensor:
        """x [.., K] @ w[N, K]^T, then the epilogue: EPI_RESID adds `res` (x's shape with N), EPI_SWIGLU takes w as
        [gate; up] rows and gives silu(gate) * up ([.., N / 2])."""
        K, N = x.shape[-1], w.shape[0]
        M = x.numel() // K
        y = torch.empty(*x.shape[:-1], N // 2 if epi == EPI_SWIGLU else N, device=x.device, dtype=x.dtype)
        if res is not None:
            assert res.is_contiguous() and res.shape == y.shape and res.dtype == y.dtype
        self._ok(self.lib.ek_bulk_linear(epi, w.data_ptr(), x.data_ptr(), y.data_ptr(),
                                         res.data_ptr() if res is not None else None, M, N, K, K, self.grid,
                                         _stream()), "linear")
        return y

    def rms(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        K = x.shape[-1]
        y = torch.empty_like(x)
        self._ok(self.lib.ek_bulk_rms(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() // K, K, eps, _stream()),
                 "rms")
        return y

    def qkv(self, h, w, heads: tuple[int, int, int], kc, vc, pos, inv_freq, base) -> torch.Tensor:
        """q (rotated) [M, H hd] from h [M, K]; k (rotated) and v written to the layer's cache kc, vc [Hkv, cap, hd]
        at slots base[0] + row. pos [M] int64 (each row's position), inv_freq [hd / 2] float32 (Rotary's); base: a
        device int64 (the cache's committed length)."""
        H, Hkv, hd = heads
        M, K = h.shape
        assert kc.is_contiguous() and vc.is_contiguous() and pos.is_contiguous() and inv_freq.is_contiguous()
        assert base.dtype == pos.dtype == torch.int64 and pos.shape == (M,) and inv_freq.dtype == torch.float32
        q = torch.empty(M, H * hd, device=h.device, dtype=h.dtype)
        self._ok(self.lib.ek_bulk_qkv(w.data_ptr(), h.data_ptr(), q.data_ptr(), M, K, K, H, Hkv, hd, kc.data_ptr(),
                                      vc.data_ptr(), pos.data_ptr(), inv_freq.data_ptr(), base.data_ptr(),
                                      kc.shape[1], self.grid, _stream()), "qkv")
        return q

    def scratch(self, rows: int, span: int, Hkv: int, rep: int):
        """The attention's part buffers for a call of `rows` rows whose keys lie below `span` (all its layers')."""
        parts = math.ceil(span / ACH)
        acc = torch.empty(rows * Hkv * parts * rep * 128, device=self.device, dtype=torch.float32)
        ml = torch.empty(rows * Hkv * parts * rep * 2, device=self.device, dtype=torch.float32)
        return acc, ml, parts

    def attn(self, q, kc, vc, base, block, heads, scratch) -> torch.Tensor:
        """q [M, H hd] over the cache kc, vc [Hkv, cap, hd]: row t sees the committed slots below base[0] and this
        call's slot base[0] + c where block[t, c] (bool [M, M]: its tree ancestors and itself). -> [M, H hd]."""
        H, Hkv, hd = heads
        M = q.shape[0]
        acc, ml, parts = scratch
        assert block.dtype == torch.bool and block.shape == (M, M) and block.is_contiguous()
        assert M <= MAX_ROWS and Hkv <= 64 and acc.numel() >= M * Hkv * parts * (H // Hkv) * 128
        out = torch.empty(M, H * hd, device=q.device, dtype=q.dtype)
        self._ok(self.lib.ek_bulk_attn(H // Hkv, q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(), kc.shape[1],
                                       base.data_ptr(), block.data_ptr(), acc.data_ptr(), ml.data_ptr(),
                                       self.tickets.data_ptr(), out.data_ptr(), out.stride(0), M, Hkv, parts,
                                       _stream()), "attention")
        return out

    def layer(self, layer, x, pos, inv_freq, kv, base, block, scratch) -> torch.Tensor:
        """One decoder layer (eaglekit.models.llama.DecoderLayer, fused) for x [1, T, D] at positions pos [T]: seven
        kernels, the new keys and values written to kv (the layer's cache, [1, Hkv, cap, hd] each) at base[0] + t,
        each row attending as block [T, T] says (attn)."""
        a, m = layer.self_attn, layer.mlp
        heads = (a.num_heads, a.num_kv_heads, a.head_dim)
        _, T, D = x.shape
        x2 = x.reshape(T, D)
        h = self.rms(x2, layer.input_layernorm.weight, layer.input_layernorm.eps)
        q = self.qkv(h, a.qkv_weight, heads, kv[0][0], kv[1][0], pos, inv_freq, base)
        o = self.attn(q, kv[0][0], kv[1][0], base, block, heads, scratch)
        x2 = self.linear(o, a.o_proj.weight, EPI_RESID, x2)
        h = self.rms(x2, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
        act = self.linear(h, m.gate_up_weight, EPI_SWIGLU)
        return self.linear(act, m.down_proj.weight, EPI_RESID, x2).view(1, T, D)
