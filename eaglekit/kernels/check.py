"""`eaglekit kernels check`: which kernels run on this machine, why the others do not, and a short bit check of each
that runs.

Each row is a products kind (aten, onednn, invariant, hopper; eaglekit.kernels.products), a draft kernel (int8,
topk) or the routed experts' decode kernels (moe; eaglekit.kernels.moe_gemv). A row that runs here is built (nvcc
for hopper, Triton for the others; the build's time is in the row's time) and checked on small random products:
- batch invariance (onednn, invariant, hopper, int8, moe): each of rows 0, 2 and 4 computed alone has the bits it has
  inside 5 rows and inside 16 rows (what makes speculative output identical to plain decoding);
- the values against a float64 torch reference, within bf16/fp32 tolerance (every kind; aten is not batch-invariant
  by design, so this is its whole check); topk: the kernels' picks equal torch's, their probabilities within 1e-5.
The exit status is 0 when every row that runs here passed its check, 1 when one failed. A row that does not run
here never fails the command: its reason says why (no CUDA GPU, a torch without oneDNN, no Triton, no nvcc, not an
sm_90 GPU).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from . import hopper, invariant_gemm, products, topk

ROWS = (5, 16)  # the batches a row is checked inside
PICKED = (0, 2, 4)  # the rows checked alone


@dataclass
class Row:
    kind: str
    runs: bool  # whether it runs on this machine
    check: str  # "pass", "FAIL" or "-" (not run here)
    seconds: float | None  # build and check
    reason: str  # why it does not run here; what the check found


class CheckFailed(AssertionError):
    """A check's finding (its message goes to the table's reason column)."""


def _cuda() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA GPU here (torch sees none)"


def _triton() -> str | None:
    return _cuda() or (None if invariant_gemm.HAVE_TRITON else "Triton is not installed (pip install triton)")


def _onednn() -> str | None:
    return None if products.onednn_available() else "this torch build has no oneDNN prepacked linear"


def _hopper() -> str | None:
    why = hopper.device_reason("cuda" if torch.cuda.is_available() else "cpu") or hopper.build_reason()
    if why and hopper.find_nvcc() and not torch.cuda.is_available():
        why += " (nvcc found: it would build)"
    return why


def _rand(*shape, dtype, device, seed, scale=1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    if not err <= tol:
        raise CheckFailed(f"{what}: relative error {err:.2e} over {tol:.0e} against the float64 reference")


def _invariant(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, what: str) -> None:
    """fn's row r of x[:1] alone equals its row r inside x[:5] and x[:16], bit for bit."""
    for r in PICKED:
        alone = fn(x[r : r + 1])
        for m in ROWS:
            if not torch.equal(fn(x[:m])[r : r + 1], alone):
                raise CheckFailed(f"{what}: row {r} alone differs from row {r} inside {m} rows (not batch-invariant)")


def _product_check(linear, dtype, device, N: int, K: int, tol: float, invariant: bool, w=None, ref_w=None):
    w = _rand(N, K, dtype=dtype, device=device, seed=1, scale=K**-0.5) if w is None else w
    x = _rand(max(ROWS), K, dtype=dtype, device=device, seed=2)
    ref_w = w if ref_w is None else ref_w
    y = linear(x, w)
    _close(y, x.double() @ ref_w.double().T, tol, "product")
    if invariant:
        _invariant(lambda xs: linear(xs, w), x, "product")


def check_aten(device: str) -> str:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    _product_check(products.Aten().linear, dtype, device, 256, 512, 1e-4 if dtype == torch.float32 else 2e-2, False)
    return f"F.linear ({str(dtype)[6:]}) against float64 (not batch-invariant by design)"


def check_onednn(device: str) -> str:
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        w = _rand(256, 512, dtype=dtype, device=device, seed=1, scale=512**-0.5)
        _product_check(products.OneDNN([w]).linear, dtype, device, 256, 512, tol, True, w=w)
    return "fp32 and bf16: rows alone = rows in 5 and 16, bit for bit; values against float64"


def check_invariant(device: str) -> str:
    products.Invariant()  # (builds its Triton kernels)
    _product_check(lambda x, w: invariant_gemm.linear(x, w, exact=True), torch.bfloat16, device, 1024, 2048, 2e-2, True)
    return "bf16: rows alone = rows in 5 and 16, bit for bit; values against float64"


def check_hopper(device: str) -> str:
    kern = hopper.kernels_for(device)
    _product_check(kern.linear, torch.bfloat16, device, 1024, 2048, 2e-2, True)
    return "bf16 product: rows alone = rows in 5 and 16, bit for bit; values against float64"


def check_int8(device: str) -> str:
    from .int8 import Int8Linear

    w = _rand(1024, 2048, dtype=torch.bfloat16, device=device, seed=1, scale=2048**-0.5)
    lin = Int8Linear.of(w)
    widened = lin.qweight.double() * lin.scale.double()[:, None]
    _product_check(lambda x, _: lin(x), torch.bfloat16, device, 1024, 2048, 2e-2, True, w=w, ref_w=widened)
    return "int8 weight, bf16 rows: rows alone = rows in 5 and 16, bit for bit; values against float64"


def check_topk(device: str) -> str:
    logits = _rand(6, 32000, dtype=torch.float32, device=device, seed=3, scale=4.0)
    for k in (1, 8):
        p, ids = topk.kernel_top_probs(logits, k)
        rp, rids = topk.torch_top_probs(logits, k)
        if not torch.equal(ids.cpu(), rids.cpu()):
            raise CheckFailed(f"top {k}: the kernels' picks differ from torch's")
        _close(p, rp.double(), 1e-5, f"top {k} probabilities")
    return "top 1 and top 8 of 6 x 32000: torch's picks, probabilities within 1e-5"


def check_moe(device: str) -> str:
    from . import moe_gemv

    E, I, D, k = 16, 352, 512, 4
    gate_up = _rand(E, 2 * I, D, dtype=torch.bfloat16, device=device, seed=4, scale=D**-0.5)
    down = _rand(E, D, I, dtype=torch.bfloat16, device=device, seed=5, scale=I**-0.5)
    x = _rand(max(ROWS), D, dtype=torch.bfloat16, device=device, seed=6)
    g = torch.Generator().manual_seed(7)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(max(ROWS))]).to(device)
    w = torch.rand(max(ROWS), k, generator=g).to(device)
    y = moe_gemv.experts(x, gate_up, down, idx, w)
    _close(y, moe_gemv.reference(x.double(), gate_up.double(), down.double(), idx, w.double()), 2e-2, "experts")
    _invariant(lambda xs: moe_gemv.experts(xs, gate_up, down, idx[: len(xs)], w[: len(xs)]), x, "experts")
    return "bf16, 16 experts top-4: tokens alone = tokens in 5 and 16, bit for bit; values against float64"


# kind -> (why it cannot run here or None, its check on a device returning what it checked, the device: "any" is
# the GPU where torch sees one, else the CPU)
KINDS: dict[str, tuple[Callable[[], str | None], Callable[[str], str], str]] = {
    "aten": (lambda: None, check_aten, "any"),
    "onednn": (_onednn, check_onednn, "cpu"),
    "invariant": (_triton, check_invariant, "cuda"),
    "hopper": (_hopper, check_hopper, "cuda"),
    "int8": (_triton, check_int8, "cuda"),
    "topk": (_triton, check_topk, "cuda"),
    "moe": (_triton, check_moe, "cuda"),
}


def run(kinds=None) -> list[Row]:
    """Check each kind (all by default) that runs here; a row for every kind."""
    rows = []
    for kind in kinds or KINDS:
        why_not, check, device = KINDS[kind]
        if device == "any":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        why = why_not()
        if why is not None:
            rows.append(Row(kind, False, "-", None, why))
            continue
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                found, ok = check(device), True
        except CheckFailed as e:
            found, ok = str(e), False
        except (RuntimeError, hopper.Unavailable) as e:  # a build or launch that failed is a failed check
            found, ok = f"{type(e).__name__}: {str(e)[-300:]}", False
        rows.append(Row(kind, True, "pass" if ok else "FAIL", round(time.perf_counter() - t0, 3), found))
    return rows


def table(rows: list[Row]):
    from rich.table import Table

    t = Table(title="eaglekit kernels on this machine")
    for col in ("kind", "runs here", "check", "time", "reason"):
        t.add_column(col, overflow="fold")
    for r in rows:
        check = {"pass": "[green]pass[/green]", "FAIL": "[red]FAIL[/red]"}.get(r.check, r.check)
        t.add_row(
            r.kind, "yes" if r.runs else "no", check, "-" if r.seconds is None else f"{r.seconds:.2f} s", r.reason
        )
    return t


def main(argv=None) -> int:
    """`eaglekit kernels check [--json] [--only KIND ...]`: 0 when every kind that runs here passed, 1 if one failed."""
    ap = argparse.ArgumentParser(prog="eaglekit kernels check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    ap.add_argument(
        "--only", nargs="+", choices=list(KINDS), metavar="KIND", help=f"check these kinds only ({', '.join(KINDS)})"
    )
    args = ap.parse_args(argv)
    rows = run(args.only)
    failed = any(r.check == "FAIL" for r in rows)
    if args.json:
        print(json.dumps({"ok": not failed, "kinds": [asdict(r) for r in rows]}, indent=2))
    else:
        from rich.console import Console

        Console().print(table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
