"""Do products whose weights stream by bulk copies into shared memory, launched as programmatic dependent launches,
keep the memory busy across kernel boundaries? (Fast v2, goal 1; benchmarks/NOTES.md, "Weights streamed by bulk
copies")

The step's products lose ~4-7 us each to ramp and tail (NOTES, "The products' ceiling"), whatever the kernel style; a
persistent Triton kernel with grid barriers lost as much at its barriers and its plain loads kept too few bytes in
flight. `bulk_gemv.cu` (beside this) moves the weight with cp.async.bulk into a ring of shared-memory slots fed by one
producer thread; under PDL a product's producer starts on its weight while its predecessor is still finishing (it
waits only for its x). This builds the kernels with nvcc and
- checks them: fresh random inputs against an fp64 product, NaN-poisoned outputs all written, the same bits at other
  grid sizes and slot counts, and for the tensor-core variant each row's bits the same alone and among 6 or 16 rows;
- times the chain of the 8B step's products (pdl_probe.Chain: eight layers, one CUDA graph) at 1 and 6 rows against
  invariant_gemm's, side by side, and whole layers (the products with norm and attention stand-ins between them, plain
  or as PDL participants).

    python benchmarks/lab/bulk_probe.py OUT [LAYERS] [--repeat]

(--repeat: the whole layers only, three rounds in alternating order.) Needs a Hopper GPU and nvcc.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))
from pdl_probe import Chain  # noqa: E402  (benchmarks/lab/pdl_probe.py: the 8B step's products, chained)

from eaglekit.kernels import invariant_gemm  # noqa: E402


def build(out: Path) -> ctypes.CDLL:
    so = out / "libbulk_gemv.so"
    t = time.perf_counter()
    subprocess.run(["nvcc", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
                    "-o", str(so), str(HERE / "bulk_gemv.cu")], check=True)
    print(f"nvcc: {time.perf_counter() - t:.1f} s", flush=True)
    lib = ctypes.CDLL(str(so))
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.bulk_gemv.argtypes = [i32, i32, ptr, ptr, ptr] + [i32] * 5 + [ptr]
    lib.bulk_gemm.argtypes = [i32, ptr, ptr, ptr] + [i32] * 7 + [ptr]
    lib.bulk_rms.argtypes = [ptr, ptr] + [i32] * 4 + [ptr]
    lib.bulk_attn_like.argtypes = [ptr] * 3 + [i32] * 3 + [ptr]
    lib.bulk_attn_decode.argtypes = [i32] + [ptr] * 4 + [i32] + [ptr] * 4 + [i32, ptr]
    lib.bulk_error.restype = ctypes.c_char_p
    return lib


def _stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # (a graph being recorded: its capture stream)


def _ok(lib, e: int, what: str) -> None:
    if e:
        raise RuntimeError(f"{what}: {lib.bulk_error(e).decode()}")


class Bulk:
    """linear(x, w, y) for Chain: y[1, N] = x[1, K] @ w.T through bulk_gemv."""

    def __init__(self, lib, warps: int, nslots: int, grid: int, pdl: int, min_kb: int = 0):
        self.lib, self.warps, self.nslots, self.grid, self.pdl, self.min_kb = lib, warps, nslots, grid, pdl, min_kb

    def __call__(self, x, w, y):
        N, K = w.shape
        assert x.shape[0] == 1 and x.stride(-1) == 1 and w.is_contiguous() and y.is_contiguous()
        assert x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0  # 16-byte vectors and bulk copies
        _ok(self.lib, self.lib.bulk_gemv(self.warps, self.nslots, w.data_ptr(), x.data_ptr(), y.data_ptr(), N, K,
                                         self.grid, self.pdl, self.min_kb * 1024, _stream()), "bulk_gemv")


XS = 108  # bulk_gemm's "nslots" for 8 slots with x staged in shared memory (one row)


class Gemm(Bulk):
    """linear(x, w, y) for Chain: y[M, N] = x[M, K] @ w.T (M <= 16) through bulk_gemm, the tensor-core variant
    (nslots XS: 8 slots, x's one row staged in shared memory once, as gemv_bulk does)."""

    def __call__(self, x, w, y):
        M, K = x.shape
        N = w.shape[0]
        assert x.stride(-1) == 1 and w.is_contiguous() and y.is_contiguous() and y.shape == (M, N)
        assert x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0
        _ok(self.lib, self.lib.bulk_gemm(self.nslots, w.data_ptr(), x.data_ptr(), y.data_ptr(), M, N, K, x.stride(0),
                                         self.grid, self.pdl, self.min_kb * 1024, _stream()), "bulk_gemm")


class Layers(Chain):
    """Chain's products with a layer's latency-bound kernels between them, as a decode layer orders them: norm, q/k/v,
    attention (a stand-in that reads 2 MB of its layer's own "KV"), o, norm, gate/up, down. `small_pdl`: whether the
    small kernels are PDL participants (launch their successor at once, wait for their predecessor). What it asks:
    do the products' weight streams hide the small kernels' latency when every launch of the layer is PDL?"""

    def __init__(self, lib, layers: int = 8, rows: int = 1):
        super().__init__(layers, rows)
        self.lib, self.small_pdl, self.whole = lib, 0, True
        self.kv = [torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        self.normed = torch.empty(rows, 4096, device="cuda", dtype=torch.bfloat16)
        self.att = torch.empty(rows, 4096, device="cuda", dtype=torch.bfloat16)

    def body(self, linear):
        if not self.whole:  # the products alone, as Chain runs them
            return super().body(linear)
        lib, pdl, M = self.lib, self.small_pdl, self.x0.shape[0]

        def product(x, w, i):
            y = linear(x, w, self.ys[i])
            return self.ys[i] if y is None else y

        def norm(x):
            _ok(lib, lib.bulk_rms(x.data_ptr(), self.normed.data_ptr(), M, 4096, x.stride(0), pdl, _stream()), "rms")
            return self.normed

        def run():
            x = self.x0
            for (wqkv, wo, wgu, wd), kv in zip(self.ws, self.kv):
                qkv = product(norm(x), wqkv, 0)
                _ok(lib, lib.bulk_attn_like(qkv.data_ptr(), kv.data_ptr(), self.att.data_ptr(), M, qkv.stride(0), pdl,
                                            _stream()), "attn_like")
                gu = product(norm(product(self.att, wo, 1)), wgu, 2)
                x = product(gu[:, :14336], wd, 3)
            self.last = x
        return run


def check_gemm(lib, sms: int) -> dict:
    """The tensor-core variant: right against an fp64 product at 1, 6 and 16 rows, every output written, and each
    row's bits the same alone, among 6 or 16 rows, and at other grid sizes and slot counts."""
    res = {}
    for N, K in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]:
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ w.double().T
        out = {}
        for M, nslots, grid in ((1, 8, 2 * sms), (6, 8, 2 * sms), (16, 8, 2 * sms), (1, 4, sms), (6, 12, 77)):
            y = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            Gemm(lib, 4, nslots, grid, 0)(x[:M], w, y)
            torch.cuda.synchronize()
            out[(M, nslots, grid)] = y
        y = torch.full((1, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        Gemm(lib, 4, XS, 2 * sms, 0)(x[:1], w, y)  # one row, x staged in shared memory
        out[(1, XS, 2 * sms)] = y
        y16 = out[(16, 8, 2 * sms)]
        alone = []
        for m in range(16):  # every row alone
            y = torch.full((1, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            Gemm(lib, 4, 8, 2 * sms, 0)(x[m:m + 1], w, y)
            alone.append(y)
        torch.cuda.synchronize()
        row = {"rel_err_16": ((y16.double() - ref).norm() / ref.norm()).item(),
               "all_written": all(bool(torch.isfinite(v).all()) for v in out.values()),
               "rows_alone_equal_rows_among_16": bool(torch.equal(torch.cat(alone), y16)),
               "rows_among_6_equal_among_16": bool(torch.equal(out[(6, 8, 2 * sms)], y16[:6])),
               "same_bits_x_staged": bool(torch.equal(out[(1, XS, 2 * sms)], y16[:1])),
               "same_bits_other_grids": bool(torch.equal(out[(1, 4, sms)], out[(1, 8, 2 * sms)])
                                             and torch.equal(out[(6, 12, 77)], out[(6, 8, 2 * sms)])),
               "smallm_rel_err_16": ((invariant_gemm.linear(x, w, exact=True).double() - ref).norm()
                                     / ref.norm()).item()}
        res[f"{N}x{K}"] = row
        print(f"check gemm {N}x{K}: {row}", flush=True)
        del w
    return res


def check(lib, sms: int) -> dict:
    """The one-row kernel on each of the step's weight shapes (and the lm_head's): fresh random inputs, NaN-poisoned
    output, against an fp64 product; the bits again at other grid sizes and slot counts (same consumer warps: the
    segments of a long row are one a warp), and with eight consumer warps."""
    res = {}
    for N, K in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (1000, 512)]:
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ w.double().T
        outs = []
        for warps, nslots, grid in ((4, 8, sms), (4, 12, 2 * sms), (4, 16, 77), (8, 16, sms)):
            y = torch.full((1, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            Bulk(lib, warps, nslots, grid, 0)(x, w, y)
            torch.cuda.synchronize()
            outs.append(y)
        rel = ((outs[0].double() - ref).norm() / ref.norm()).item()
        res[f"{N}x{K}"] = {"rel_err": rel, "all_written": bool(torch.isfinite(outs[0]).all()),
                           "same_bits_other_grids": all(torch.equal(outs[0], o) for o in outs[1:3]),
                           "rel_err_8_warps": ((outs[3].double() - ref).norm() / ref.norm()).item(),
                           "smallm_rel_err": ((invariant_gemm.linear(x, w, exact=True).double() - ref).norm()
                                              / ref.norm()).item()}
        print(f"check {N}x{K}: {res[f'{N}x{K}']}", flush=True)
        del w
    return res


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    lib = build(out)
    sms = lib.bulk_sm_count()
    res["sms"] = sms
    save = lambda: (out / "bulk_probe.json").write_text(json.dumps(res, indent=1))  # noqa: E731
    repeat = "--repeat" in sys.argv  # the whole-layer rows only, three rounds in alternating order
    if not repeat:
        res["check"] = check(lib, sms)
        save()
        try:
            res["check_gemm"] = check_gemm(lib, sms)
        except Exception as e:
            traceback.print_exc()
            res["check_gemm"] = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
        save()
    res["variants"] = {}
    smallm_fn = lambda x, w, y: invariant_gemm.linear(x, w, exact=True)  # noqa: E731
    gemm = Gemm(lib, 4, 8, 2 * sms, 1, 100)  # pdl 1: the successor may launch at once; at least 100 KB: 2 blocks an SM
    gemm0 = Gemm(lib, 4, 8, 2 * sms, 0, 100)
    for rows in (1, 6):
        layers = Layers(lib, int(sys.argv[2]) if len(sys.argv) > 2 else 8, rows)
        res.update(layers=len(layers.ws), weight_bytes=layers.nbytes)
        # (name, products, small kernels as PDL participants, whole layers or the products alone)
        variants = [("products alone: invariant_gemm", smallm_fn, 0, False),
                    ("products alone: gemm pdl1", gemm, 1, False),
                    ("layers: invariant_gemm, small kernels plain", smallm_fn, 0, True),
                    ("layers: gemm pdl0, small kernels plain", gemm0, 0, True),
                    ("layers: gemm pdl1, small kernels pdl", gemm, 1, True),
                    ("layers: gemm s12 pdl1, small kernels pdl", Gemm(lib, 4, 12, 2 * sms, 1, 110), 1, True)]
        if rows == 1:
            gemm_xs = Gemm(lib, 4, XS, 2 * sms, 1, 100)
            variants += [("layers: bulk w4 s8 pdl1, small kernels pdl", Bulk(lib, 4, 8, 2 * sms, 1, 100), 1, True),
                         ("layers: gemm x staged pdl1, small kernels pdl", gemm_xs, 1, True),
                         ("products alone: gemm x staged pdl1", gemm_xs, 1, False)]
        variants += [("layers: invariant_gemm, small kernels plain (again)", smallm_fn, 0, True)]
        if repeat:
            whole = [v for v in variants[2:-1] if "s12" not in v[0] and v[3]]
            variants = [(f"{v[0]} #{r}", *v[1:]) for r in range(3) for v in (whole if r % 2 == 0 else whole[::-1])]
        ref = None
        for name, fn, pdl, whole in variants:
            name = f"{rows} row{'s' if rows > 1 else ''}: {name}"
            layers.small_pdl, layers.whole = pdl, whole
            try:
                row, got = layers.measure(fn)
                if whole:
                    if ref is None:
                        ref = got.double()
                    row["rel_to_smallm"] = ((got.double() - ref).norm() / ref.norm()).item()
                res["variants"][name] = row
            except Exception as e:
                traceback.print_exc()
                res["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
            print(name, res["variants"][name], flush=True)
            save()
        del layers
    print(f"\n{'variant':<56} {'ms':>8} {'us/product':>11} {'TB/s':>6}")
    for name, row in res["variants"].items():
        if "ms" in row:
            print(f"{name:<56} {row['ms']:>8.4f} {row['us_per_product']:>11.2f} {row['bandwidth_TBps']:>6.3f}")


if __name__ == "__main__":
    main()
