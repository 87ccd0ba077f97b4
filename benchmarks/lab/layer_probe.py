"""Whole decode layers with a real attention: what today's kernels cost against products streamed by bulk copies with
every kernel a programmatic dependent launch (Fast v2, goal 1; benchmarks/NOTES.md, "A real attention in the PDL
layer").

bulk_probe.py measured layers whose attention was a stand-in (~3 us, reading 2 MB); the step's attention takes ~11.5
us a layer (eaglekit.kernels.invariant_attention: two Triton kernels). This replaces the stand-in with
- today's attention (eaglekit.kernels.invariant_attention on the cache with this step's k/v apart, the DIRECT path a
  decode step takes, and the cache write the step does), with today's norms (eaglekit.kernels.invariant_norm) and
  invariant_gemm's products: today's layer, less the epilogues that ride inside its products;
- `attn_decode` (bulk_gemv.cu): a decode attention whose K/V stream into shared memory before it waits for its
  predecessor, parts merged in order by the last one to finish; checked here against an fp64 attention;
- variants of the tensor-core product (gemm_bulk), each leaving out one suspect for why it lost more than the one-row
  FMA kernel around the attention: its per-tile barrier (the last warp in adds instead), its eight 1 KB copies a chunk
  (W packed: one 8 KB copy), its 168 registers (at most 8 rows: x's zero rows 8-15 not held); each checked to give
  the same bits as the plain one at 1, 6 and 16 rows (NOTES: "A race in the products' ring, and a packed product");
and times eight layers of each combination in one CUDA graph, two rounds in opposite orders.

    python benchmarks/lab/layer_probe.py OUT [LAYERS] [--check-only | --gemm-check | --six | --epi]

(--check-only: the checks alone, e.g. under compute-sanitizer; --gemm-check: the products' checks alone; --six: after
the checks, the products at a verify's 6 rows instead of the 1-row layers; --epi: only the 1-row rows that show
what the epilogues cost: today's, the packed product with and without them, gemm and FMA.)

Needs a Hopper GPU and nvcc. The 8B shape: 32 query heads, 8 KV heads, head_dim 128, context 512 in a 1024 cache.
"""

from __future__ import annotations

import json
import math
import sys
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))
from bulk_probe import Bulk, Gemm, Layers, _ok, _stream, build  # noqa: E402

from eaglekit.kernels import invariant_attention, invariant_gemm, invariant_norm  # noqa: E402

H, HKV, HD, CAP, CTX = 32, 8, 128, 1024, 512
# bulk_gemm's codes (8 slots): the last warp adds a tile's sums (no barrier); W packed (one 8 KB copy a chunk);
# packed and at most 8 rows (x's rows 8-15 not in registers); at most 8 rows, W as it is
GEMM_LAST, GEMM_PACKED, GEMM_PACKED_LO, GEMM_LO = 208, 408, 508, 608
GEMM_SWIGLU, GEMM_RESIDUAL = 718, 728  # GEMM_PACKED_LO with an epilogue: SwiGLU (W from pack_swiglu), y += the product


def pack_gemm(w: torch.Tensor) -> torch.Tensor:
    """W [N, K] in the order GEMM_PACKED reads it: [tile][piece][step j][row g][column group t][8 k], as an [N, K]
    tensor (the shape only counts elements; chunk (tile, piece) is the 4096 at (tile * K / 512 + piece) * 4096)."""
    N, K = w.shape
    return w.view(N // 8, 8, K // 512, 16, 4, 8).permute(0, 2, 3, 1, 4, 5).contiguous().view(N, K)


def pack_swiglu(w: torch.Tensor) -> torch.Tensor:
    """gate/up W [2 F, K] (gate rows, then up rows) with each 8-row tile holding 4 gate rows and the up rows of the same
    4 outputs, so GEMM_SWIGLU's tile has both halves of its outputs; pack_gemm after this."""
    n, k = w.shape
    return torch.stack((w[: n // 2].view(n // 8, 4, k), w[n // 2:].view(n // 8, 4, k)), 1).reshape(n, k)


class Packed(Gemm):
    """Gemm on packed weights: each weight packed once, ahead (never inside a captured graph), looked up by address;
    `packed`: {address of W: W packed} made elsewhere (shared, or packed after pack_swiglu)."""

    def __init__(self, lib, code: int, grid: int, pdl: int, weights=(), packed: dict | None = None):
        super().__init__(lib, 4, code, grid, pdl, 100)
        self.packed = {w.data_ptr(): pack_gemm(w) for w in weights} if packed is None else packed

    def __call__(self, x, w, y):
        return super().__call__(x, self.packed[w.data_ptr()], y)


class PackedEpilogues(Packed):
    """The step's products with their epilogues, as a decoder would run them: q/k/v plain, gate/up with SwiGLU (its
    output [M, F] in the first M * F elements of y), o and down adding into y (the residual stream). By weight shape:
    28672 rows gate/up, 4096 rows o and down. Not gemm's arithmetic (same_arithmetic: no output comparison)."""

    same_arithmetic = False

    def __init__(self, lib, grid: int, pdl: int, weights):
        super().__init__(lib, GEMM_PACKED_LO, grid, pdl, packed={
            w.data_ptr(): pack_gemm(pack_swiglu(w) if w.shape[0] == 28672 else w) for w in weights})

    def __call__(self, x, w, y):
        self.nslots = {28672: GEMM_SWIGLU, 4096: GEMM_RESIDUAL}.get(w.shape[0], GEMM_PACKED_LO)
        return super().__call__(x, w, y)


class Attention:
    """attn_decode's launch and its buffers: q [1, >= 4096] (row stride ignored: one row), k/v [HKV, CAP, HD]; `ach`
    keys a part (32 or 64)."""

    def __init__(self, lib, pdl: int, n: int = CTX, cap: int = CAP, ach: int = 32):
        self.lib, self.pdl, self.cap, self.ach = lib, pdl, cap, ach
        parts = cap // ach
        self.n = torch.tensor([n], dtype=torch.int32, device="cuda")
        self.acc = torch.empty(HKV * parts * 4 * HD, device="cuda", dtype=torch.float32)
        self.ml = torch.empty(HKV * parts * 4 * 2, device="cuda", dtype=torch.float32)
        self.tickets = torch.zeros(HKV, device="cuda", dtype=torch.int32)

    def __call__(self, q, k, v, out):
        _ok(self.lib, self.lib.bulk_attn_decode(self.ach, q.data_ptr(), k.data_ptr(), v.data_ptr(), self.n.data_ptr(),
                                                self.cap, self.acc.data_ptr(), self.ml.data_ptr(),
                                                self.tickets.data_ptr(), out.data_ptr(), self.pdl, _stream()),
            "attn_decode")
        return out


def reference(q, k, v, n):
    """fp64 GQA attention of one row: q [H * HD], k/v [HKV, cap, HD], keys 0..n-1 -> [H * HD]."""
    qh = q.double().view(H, 1, HD)
    kk = k[:, :n].double().repeat_interleave(H // HKV, 0)
    vv = v[:, :n].double().repeat_interleave(H // HKV, 0)
    w = torch.softmax(qh @ kk.transpose(1, 2) / math.sqrt(HD), -1)
    return (w @ vv).reshape(-1)


def check_attention(lib) -> dict:
    """attn_decode against fp64 at contexts that cut parts every way (1 key, a part's edge, a full cache), every
    output written (NaN-poisoned), the same bits on a second launch and as a PDL launch (K/V by bulk copies, the
    step's own key by plain loads, or everything by cp.async and loads), the tickets left at zero;
    today's attention's error beside it."""
    res = {}
    torch.manual_seed(1)
    k = torch.randn(HKV, CAP, HD, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(HKV, CAP, HD, device="cuda", dtype=torch.bfloat16)
    for n in (1, 2, 63, 64, 65, 300, 511, 512, 1000, 1024):
        q = torch.randn(H * HD, device="cuda", dtype=torch.bfloat16) * 2
        outs, tickets = [], 0
        for pdl, ach in ((0, 32), (0, 32), (1, 32), (0, 64), (5, 32), (9, 32)):  # 5, 9: the K/V by other loads
            att = Attention(lib, pdl, n, ach=ach)
            out = torch.full((H * HD,), float("nan"), device="cuda", dtype=torch.bfloat16)
            att(q, k, v, out)
            torch.cuda.synchronize()
            outs.append(out)
            tickets += int(att.tickets.abs().sum())
        ref = reference(q, k, v, n)
        mask = torch.zeros(1, 1, CAP, dtype=torch.bool, device="cuda")
        mask[..., :n] = True
        slots, count, _ = invariant_attention.visible(mask)
        ours = (invariant_attention.attend(q.view(1, H, 1, HD), k[None], v[None], slots, count)
                .transpose(1, 2).reshape(-1))
        row = {"rel_err": ((outs[0].double() - ref).norm() / ref.norm()).item(),
               "all_written": bool(torch.isfinite(outs[0]).all()),
               "same_bits_again_and_pdl": all(torch.equal(outs[0], o) for o in (outs[1], outs[2], outs[4], outs[5])),
               "tickets_zero": tickets == 0,
               "rel_err_64_keys_a_part": ((outs[3].double() - ref).norm() / ref.norm()).item(),
               "eaglekit_attend_rel_err": ((ours.double() - ref).norm() / ref.norm()).item()}
        res[str(n)] = row
        print(f"check attn_decode n={n}: {row}", flush=True)
    return res


def check_gemm_variants(lib, sms: int) -> dict:
    """gemm's variants (the last warp adds a tile's sums; W packed; at most 8 rows) against code 8 (a barrier a tile,
    W as it is): the same bits at 1, 6 and 16 rows (8-row variants: 1 and 6) on the step's weight shapes and the
    lm_head's, every output written; each against an fp32 product (max error over the output's largest magnitude)."""
    res = {}
    for N, K in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]:
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
        runs = {code: Gemm(lib, 4, code, 2 * sms, 0, 100) for code in (8, GEMM_LAST, GEMM_LO)}
        runs.update({code: Packed(lib, code, 2 * sms, 0, [w]) for code in (GEMM_PACKED, GEMM_PACKED_LO)})
        rows = {code: {"differing": {}, "rel_err": {}, "all_written": True} for code in runs}
        for M in (1, 6, 16):
            ref = x[:M].float() @ w.float().T
            ys = {}
            for code, fn in runs.items():
                if M > 8 and code in (GEMM_PACKED_LO, GEMM_LO):
                    continue
                ys[code] = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
                fn(x[:M], w, ys[code])
            torch.cuda.synchronize()
            for code, y in ys.items():
                rows[code]["differing"][M] = int((y != ys[8]).sum())
                rows[code]["rel_err"][M] = float((y.float() - ref).abs().max() / ref.abs().max())
                rows[code]["all_written"] &= bool(torch.isfinite(y).all())
        for code, row in rows.items():
            row["same_bits_as_8"] = not any(row["differing"].values())
            print(f"check gemm {code} {N}x{K}: {row}", flush=True)
        res[f"{N}x{K}"] = {str(code): row for code, row in rows.items()}
        del w, runs
    return res


def check_epilogues(lib, sms: int) -> dict:
    """GEMM_SWIGLU and GEMM_RESIDUAL against fp32 (max error over the largest magnitude) at 1 and 6 rows, and each
    row's bits the same alone as among 6 (row 0)."""
    res = {}
    for code, N, K in [(GEMM_SWIGLU, 28672, 4096), (GEMM_RESIDUAL, 4096, 4096), (GEMM_RESIDUAL, 4096, 14336)]:
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(6, K, device="cuda", dtype=torch.bfloat16)
        y0 = torch.randn(6, N, device="cuda", dtype=torch.bfloat16)
        wp = pack_gemm(pack_swiglu(w) if code == GEMM_SWIGLU else w)
        fn = Packed(lib, code, 2 * sms, 0, packed={w.data_ptr(): wp})
        row, outs = {}, {}
        for M in (1, 6):
            y = y0[:M].clone()
            fn(x[:M], w, y)
            torch.cuda.synchronize()
            p = x[:M].float() @ w.float().T
            if code == GEMM_SWIGLU:
                ref = torch.nn.functional.silu(p[:, : N // 2]) * p[:, N // 2:]
                y = y.view(-1)[: M * N // 2].view(M, N // 2)
            else:
                ref = y0[:M].float() + p
            outs[M] = y
            row[f"rel_err_{M}"] = float((y.float() - ref).abs().max() / ref.abs().max())
        row["row_alone_equals_among_6"] = bool(torch.equal(outs[1], outs[6][:1]))
        res[f"{code} {N}x{K}"] = row
        print(f"check epilogue {code} {N}x{K}: {row}", flush=True)
        del w, wp, fn
    return res


class RealLayers(Layers):
    """Layers with a choice of norm (the CUDA stand-in or eaglekit's) and attention (the stand-in, today's with its
    cache write, or attn_decode), each small kernel plain or a PDL participant (`small_pdl`)."""

    def __init__(self, lib, layers: int = 8):
        super().__init__(lib, layers, 1)
        self.norm_kind, self.attn_kind = "cuda", "stand-in"
        self.caches = [(torch.randn(1, HKV, CAP, HD, device="cuda", dtype=torch.bfloat16),
                        torch.randn(1, HKV, CAP, HD, device="cuda", dtype=torch.bfloat16)) for _ in range(layers)]
        self.norm_w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
        mask = torch.zeros(1, 1, CAP, dtype=torch.bool, device="cuda")
        mask[..., :CTX] = True
        self.base = torch.tensor([CTX - 1], device="cuda")
        # once a step, as the decoder does
        self.slots, self.count, self.old = invariant_attention.visible(mask, self.base)
        self.pos = torch.tensor([CTX - 1], device="cuda")
        self.attn = {(pdl, ach): Attention(lib, pdl, ach=ach) for pdl in (0, 1, 2, 3, 5, 9) for ach in (32, 64)}

    def body(self, linear):
        if not self.whole or (self.norm_kind, self.attn_kind) == ("cuda", "stand-in"):
            return super().body(linear)
        lib, pdl = self.lib, self.small_pdl

        def product(x, w, i):
            y = linear(x, w, self.ys[i])
            return self.ys[i] if y is None else y

        def norm(x):
            if self.norm_kind == "eaglekit":
                return invariant_norm.rms_norm(x, self.norm_w, 1e-5)
            _ok(lib, lib.bulk_rms(x.data_ptr(), self.normed.data_ptr(), 1, 4096, x.stride(0), pdl, _stream()), "rms")
            return self.normed

        def attention(qkv, cache, kv):
            k, v = cache
            if self.attn_kind.startswith("cuda"):  # cudaA[/tT]: attn_decode, A keys a part, its pdl mode T
                ach, _, trig = self.attn_kind[4:].partition("/t")
                return self.attn[int(trig) if pdl and trig else pdl, int(ach)](qkv, k, v, self.att).view(1, 4096)
            if self.attn_kind == "stand-in":
                _ok(lib, lib.bulk_attn_like(qkv.data_ptr(), kv.data_ptr(), self.att.data_ptr(), 1, qkv.stride(0), pdl,
                                            _stream()), "attn_like")
                return self.att
            q = qkv[:, :4096].view(1, 1, H, HD).transpose(1, 2)
            kn = qkv[:, 4096:5120].view(1, 1, HKV, HD).transpose(1, 2)
            vn = qkv[:, 5120:].view(1, 1, HKV, HD).transpose(1, 2)
            k.index_copy_(2, self.pos, kn)  # the step's cache write (two small kernels a layer in the step)
            v.index_copy_(2, self.pos, vn)
            o = invariant_attention.attend(q, k, v, self.slots, self.count, self.old, (kn, vn, self.base))
            return o.transpose(1, 2).reshape(1, 4096)

        def run():
            x = self.x0
            for (wqkv, wo, wgu, wd), cache, kv in zip(self.ws, self.caches, self.kv):
                qkv = product(norm(x), wqkv, 0)
                gu = product(norm(product(attention(qkv, cache, kv), wo, 1)), wgu, 2)
                x = product(gu[:, :14336], wd, 3)
            self.last = x
        return run


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    save = lambda: (out / "layer_probe.json").write_text(json.dumps(res, indent=1))  # noqa: E731
    lib = build(out)
    sms = lib.bulk_sm_count()
    if "--gemm-check" not in sys.argv:
        res["check_attention"] = check_attention(lib)
        save()
    res["check_gemm_variants"] = check_gemm_variants(lib, sms)
    res["check_epilogues"] = check_epilogues(lib, sms)
    save()
    if "--check-only" in sys.argv or "--gemm-check" in sys.argv:
        return
    n = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 8  # layers
    if "--six" in sys.argv:
        return six_rows(lib, sms, n, res, save)
    smallm_fn = lambda x, w, y: invariant_gemm.linear(x, w, exact=True)  # noqa: E731
    gemm = Gemm(lib, 4, 8, 2 * sms, 1, 100)  # as bulk_probe: PDL, at least 100 KB a block (two an SM)
    fma = Bulk(lib, 4, 8, 2 * sms, 1, 100)
    gemm_last = Gemm(lib, 4, GEMM_LAST, 2 * sms, 1, 100)
    layers = RealLayers(lib, n)
    weights = [w for ws in layers.ws for w in ws]
    packed = Packed(lib, GEMM_PACKED, 2 * sms, 1, weights)
    packed_lo = Packed(lib, GEMM_PACKED_LO, 2 * sms, 1, packed=packed.packed)  # the same packed copies
    gemm_lo = Gemm(lib, 4, GEMM_LO, 2 * sms, 1, 100)
    res.update(layers=len(layers.ws), weight_bytes=layers.nbytes, context=CTX)
    epilogues = PackedEpilogues(lib, 2 * sms, 1, weights)
    # (name, products, small kernels PDL, norm, attention or "alone": the products without the rest of the layer)
    today = "today: invariant_gemm, eaglekit invariant_norm, eaglekit attention + cache write"
    variants = [(today, smallm_fn, 0, "eaglekit", "eaglekit"),
                ("invariant_gemm, eaglekit invariant_norm, attn_decode 64 plain", smallm_fn, 0, "eaglekit", "cuda64"),
                ("invariant_gemm, eaglekit invariant_norm, attn_decode 32 plain", smallm_fn, 0, "eaglekit", "cuda32"),
                ("invariant_gemm, CUDA norms plain, stand-in attention plain", smallm_fn, 0, "cuda", "stand-in"),
                ("gemm pdl, CUDA norms pdl, stand-in attention pdl", gemm, 1, "cuda", "stand-in"),
                ("gemm pdl, CUDA norms pdl, attn_decode 64 pdl", gemm, 1, "cuda", "cuda64"),
                ("gemm pdl, CUDA norms pdl, attn_decode 32 pdl", gemm, 1, "cuda", "cuda32"),
                ("fma pdl, CUDA norms pdl, attn_decode 64 pdl", fma, 1, "cuda", "cuda64"),
                ("fma pdl, CUDA norms pdl, attn_decode 32 pdl", fma, 1, "cuda", "cuda32"),
                # when the attention lets the next product launch: once its K/V landed (t2), or at exit (t3)
                ("gemm pdl, CUDA norms pdl, attn_decode 64 pdl trigger after K/V", gemm, 1, "cuda", "cuda64/t2"),
                ("gemm pdl, CUDA norms pdl, attn_decode 64 pdl trigger at exit", gemm, 1, "cuda", "cuda64/t3"),
                ("gemm pdl, CUDA norms pdl, attn_decode 32 pdl trigger at exit", gemm, 1, "cuda", "cuda32/t3"),
                ("fma pdl, CUDA norms pdl, attn_decode 32 pdl trigger at exit", fma, 1, "cuda", "cuda32/t3"),
                # the step's own key by plain loads after the wait (a bulk copy queues behind the products' copies)
                ("gemm pdl, CUDA norms pdl, attn_decode 64 pdl, own key by loads", gemm, 1, "cuda", "cuda64/t5"),
                ("gemm pdl, CUDA norms pdl, attn_decode 32 pdl, own key by loads", gemm, 1, "cuda", "cuda32/t5"),
                ("fma pdl, CUDA norms pdl, attn_decode 32 pdl, own key by loads", fma, 1, "cuda", "cuda32/t5"),
                # K/V by cp.async: the attention's copies off the bulk-copy engine the products stream through
                ("gemm pdl, CUDA norms pdl, attn_decode 64 pdl, K/V by cp.async", gemm, 1, "cuda", "cuda64/t9"),
                ("gemm pdl, CUDA norms pdl, attn_decode 32 pdl, K/V by cp.async", gemm, 1, "cuda", "cuda32/t9"),
                ("fma pdl, CUDA norms pdl, attn_decode 32 pdl, K/V by cp.async", fma, 1, "cuda", "cuda32/t9"),
                # gemm without its barrier a tile: the last warp in adds (same bits)
                ("gemm last-adds pdl, CUDA norms pdl, stand-in attention pdl", gemm_last, 1, "cuda", "stand-in"),
                ("gemm last-adds pdl, CUDA norms pdl, attn_decode 64 pdl", gemm_last, 1, "cuda", "cuda64"),
                ("gemm last-adds pdl, CUDA norms pdl, attn_decode 32 pdl", gemm_last, 1, "cuda", "cuda32"),
                # W packed (one 8 KB copy a chunk); x's zero rows 8-15 out of the registers (168 -> 110)
                ("gemm packed pdl, CUDA norms pdl, stand-in attention pdl", packed, 1, "cuda", "stand-in"),
                ("gemm packed pdl, CUDA norms pdl, attn_decode 64 pdl", packed, 1, "cuda", "cuda64"),
                ("gemm packed pdl, CUDA norms pdl, attn_decode 32 pdl", packed, 1, "cuda", "cuda32"),
                ("gemm <=8 rows pdl, CUDA norms pdl, stand-in attention pdl", gemm_lo, 1, "cuda", "stand-in"),
                ("gemm <=8 rows pdl, CUDA norms pdl, attn_decode 64 pdl", gemm_lo, 1, "cuda", "cuda64"),
                ("gemm <=8 rows pdl, CUDA norms pdl, attn_decode 32 pdl", gemm_lo, 1, "cuda", "cuda32"),
                ("gemm packed <=8 rows pdl, CUDA norms pdl, stand-in attention pdl", packed_lo, 1, "cuda", "stand-in"),
                ("gemm packed <=8 rows pdl, CUDA norms pdl, attn_decode 64 pdl", packed_lo, 1, "cuda", "cuda64"),
                ("gemm packed <=8 rows pdl, CUDA norms pdl, attn_decode 32 pdl", packed_lo, 1, "cuda", "cuda32"),
                # and with the epilogues a decoder needs (SwiGLU into gate/up, residual adds into o and down)
                ("gemm packed <=8 rows + epilogues pdl, CUDA norms pdl, stand-in attention pdl", epilogues, 1, "cuda",
                 "stand-in"),
                ("gemm packed <=8 rows + epilogues pdl, CUDA norms pdl, attn_decode 64 pdl", epilogues, 1, "cuda",
                 "cuda64"),
                ("gemm packed <=8 rows + epilogues pdl, CUDA norms pdl, attn_decode 32 pdl", epilogues, 1, "cuda",
                 "cuda32"),
                ("products alone: gemm pdl", gemm, 1, "cuda", "alone"),
                ("products alone: gemm last-adds pdl", gemm_last, 1, "cuda", "alone"),
                ("products alone: gemm packed pdl", packed, 1, "cuda", "alone"),
                ("products alone: gemm <=8 rows pdl", gemm_lo, 1, "cuda", "alone"),
                ("products alone: gemm packed <=8 rows pdl", packed_lo, 1, "cuda", "alone"),
                ("products alone: fma pdl", fma, 1, "cuda", "alone")]
    if "--epi" in sys.argv:
        keep = (today, "fma pdl, CUDA norms pdl, attn_decode 32 pdl", "gemm pdl, CUDA norms pdl, attn_decode 32 pdl")
        variants = [v for v in variants if v[0] in keep or "packed <=8 rows" in v[0] and "alone" not in v[0]]
    res["variants"] = {}
    outputs = {}
    for rnd, order in enumerate((variants, variants[::-1])):
        for name, fn, pdl, nk, ak in order:
            layers.small_pdl, layers.norm_kind, layers.attn_kind, layers.whole = pdl, nk, ak, ak != "alone"
            timed(layers, name, fn, gemm, outputs, (nk, ak), res["variants"], rnd)
            save()
    table(res["variants"], "1 row")


def timed(layers, name: str, fn, gemm, outputs: dict, key, into: dict, rnd: int):
    """One timing of `layers` with products `fn`, into[name]. gemm's variants do the same arithmetic, so each output
    should equal plain gemm's with the same other kernels (`key`): recorded as same_output_as_gemm."""
    try:
        row, got = layers.measure(fn)
        row["finite"] = bool(torch.isfinite(got).all())
        if fn is gemm:
            outputs[key] = got
        elif isinstance(fn, Gemm) and getattr(fn, "same_arithmetic", True) and key in outputs:
            row["same_output_as_gemm"] = bool(torch.equal(got, outputs[key]))
    except Exception as e:
        traceback.print_exc()
        row = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
    into.setdefault(name, []).append(row)
    print(f"round {rnd}: {name}: {row}", flush=True)


def table(variants: dict, shape: str):
    print(f"\n{f'variant (8 layers, {shape})':<66} {'ms (two rounds)':>18} {'TB/s':>6}")
    for name, rows in variants.items():
        ms = [r["ms"] for r in rows if "ms" in r]
        if ms:
            print(f"{name:<66} {' / '.join(f'{m:.4f}' for m in ms):>18} {rows[0]['bandwidth_TBps']:>6.3f}")


def six_rows(lib, sms: int, n: int, res: dict, save):
    """A verify's shape, 6 rows ((3,1,4) verifies 5, (5,1,6) 7): today's products (invariant_gemm, plain launches)
    against gemm and the packed <= 8-row gemm with every kernel PDL, in whole layers with the stand-in norms and
    attention (bulk_probe.Layers: they take any row count) and alone. Two rounds in opposite orders."""
    layers = Layers(lib, n, 6)
    gemm = Gemm(lib, 4, 8, 2 * sms, 1, 100)
    packed_lo = Packed(lib, GEMM_PACKED_LO, 2 * sms, 1, [w for ws in layers.ws for w in ws])
    smallm_fn = lambda x, w, y: invariant_gemm.linear(x, w, exact=True)  # noqa: E731
    variants = [("6 rows: invariant_gemm, stand-in norms and attention, plain", smallm_fn, 0, True),
                ("6 rows: gemm, stand-in norms and attention, all pdl", gemm, 1, True),
                ("6 rows: gemm packed <=8 rows, stand-in norms and attention, all pdl", packed_lo, 1, True),
                ("6 rows, products alone: invariant_gemm", smallm_fn, 0, False),
                ("6 rows, products alone: gemm pdl", gemm, 1, False),
                ("6 rows, products alone: gemm packed <=8 rows pdl", packed_lo, 1, False)]
    res.update(layers=n, weight_bytes=layers.nbytes, six_rows={})
    outputs = {}
    for rnd, order in enumerate((variants, variants[::-1])):
        for name, fn, pdl, whole in order:
            layers.small_pdl, layers.whole = pdl, whole
            timed(layers, name, fn, gemm, outputs, whole, res["six_rows"], rnd)
            save()
    table(res["six_rows"], "6 rows")


if __name__ == "__main__":
    main()
