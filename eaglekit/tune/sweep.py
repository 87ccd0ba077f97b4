"""Sweeps of (steps, topk, draft tokens): accept length and tokens/s per setting, side by side with the
baseline measured in the same run, a table, CSV + JSON, a heatmap, and the best setting named.

topk = 1 is a chain, whose draft token count is forced to steps + 1 whatever the list says; settings
that are not valid trees (more draft tokens than candidates) are skipped.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..decoding.compare import decode_set
from ..decoding.decoder import Decoder
from ..decoding.sampling import SamplingParams
from ..decoding.tree import TreeShape
from ..errors import GenerationError
from ..io import atomic_write_bytes
from ..observe.metrics import fmt, rounded

DEFAULT_GRID = dict(steps=(1, 3, 5), topk=(1, 4, 8), draft_tokens=(4, 8, 16, 32))
AUTO_GRID = dict(steps=(2, 3, 4, 5, 6), topk=(1, 2, 4), draft_tokens=(4, 6, 8, 12, 16))
WARMUP_TOKENS = 16
# --auto: a short sweep of this many prompts and tokens
AUTO_PROMPTS, AUTO_TOKENS = 2, 32


def shapes(steps, topk, draft_tokens) -> list[TreeShape]:
    out = []
    for k in topk:
        for s in steps:
            for d in [s + 1] if k == 1 else draft_tokens:
                try:
                    sh = TreeShape(s, k, d)
                except GenerationError:
                    continue
                if sh not in out:
                    out.append(sh)
    return out


def sweep(
    target,
    draft,
    prompts: list[list[int]],
    grid: dict | None = None,
    sp: SamplingParams | None = None,
    max_new_tokens: int = 64,
    capture=None,
    allow_other_target: bool = False,
    progress: bool = True,
) -> dict:
    grid = grid or DEFAULT_GRID
    sp = sp or SamplingParams()
    todo = shapes(grid["steps"], grid["topk"], grid["draft_tokens"])
    if not todo:
        raise GenerationError(
            "no valid (steps, topk, draft tokens) setting in the sweep",
            code="E303",
            fix="with topk > 1, draft tokens must lie in 2 .. 1 + topk + (steps-1) * topk^2",
        )
    # warm-up: a short generation first (allocations, CUDA-graph recording) outside the timings
    base = decode_set(Decoder(target), prompts, max_new_tokens, sp, baseline=True, warmup=WARMUP_TOKENS).metrics
    rows: list[dict] = []
    it = todo
    if progress:
        from tqdm import tqdm

        it = tqdm(todo, desc="sweep", unit="setting")
    for sh in it:
        dec = Decoder(target, draft, sh, capture=capture, allow_other_target=allow_other_target)
        m = decode_set(dec, prompts, max_new_tokens, sp, warmup=WARMUP_TOKENS).metrics
        rows.append(
            {
                "steps": sh.steps,
                "topk": sh.topk,
                "draft_tokens": sh.draft_tokens,
                "accept_length": rounded(m.accept_length, 4),
                "accept_rate": rounded(m.accept_rate, 4),
                "per_position": [round(x, 4) for x in m.per_position],
                "tokens_per_s": round(m.tokens_per_s, 2),
                "speedup": round(m.tokens_per_s / base.tokens_per_s, 4) if base.tokens_per_s else 0.0,
            }
        )
    best = max(rows, key=lambda r: r["tokens_per_s"])
    return {
        "baseline_tokens_per_s": round(base.tokens_per_s, 2),
        "rows": rows,
        "best": best,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "temperature": sp.temperature,
        "device": str(target.device),
    }


def auto_shape(
    target,
    draft,
    prompts,
    sp=None,
    capture=None,
    allow_other_target=False,
    grid: dict | None = None,
    n_prompts: int = AUTO_PROMPTS,
    tokens: int = AUTO_TOKENS,
) -> tuple[TreeShape, dict]:
    """A short sweep (the first n_prompts prompts, `tokens` new tokens each) over `grid` (default AUTO_GRID)
    -> (the fastest setting, the sweep's result)."""
    res = sweep(
        target, draft, prompts[:n_prompts], grid or AUTO_GRID, sp, tokens, capture, allow_other_target, progress=False
    )
    b = res["best"]
    return TreeShape(b["steps"], b["topk"], b["draft_tokens"]), res


def write_results(res: dict, out: str | Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "sweep.json", "csv": out / "sweep.csv", "png": out / "sweep.png"}
    atomic_write_bytes(paths["json"], json.dumps(res, indent=2).encode())
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["steps", "topk", "draft_tokens", "accept_length", "accept_rate", "tokens_per_s", "speedup"])
    for r in res["rows"]:
        w.writerow(
            [
                r["steps"],
                r["topk"],
                r["draft_tokens"],
                r["accept_length"],
                r["accept_rate"],
                r["tokens_per_s"],
                r["speedup"],
            ]
        )
    atomic_write_bytes(paths["csv"], buf.getvalue().encode())
    heatmap(res, paths["png"])
    return paths


def heatmap(res: dict, path: Path) -> None:
    """One panel per topk: steps across, draft tokens down, colour = speedup, text = speedup / accept length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = res["rows"]
    topks = sorted({r["topk"] for r in rows})
    fig, axes = plt.subplots(1, len(topks), figsize=(4.2 * len(topks), 3.8), squeeze=False)
    vmax = max(r["speedup"] for r in rows)
    vmin = min(min(r["speedup"] for r in rows), 1.0)
    for ax, k in zip(axes[0], topks):
        sub = [r for r in rows if r["topk"] == k]
        steps = sorted({r["steps"] for r in sub})
        dts = sorted({r["draft_tokens"] for r in sub})
        grid = np.full((len(dts), len(steps)), np.nan)
        for r in sub:
            i, j = dts.index(r["draft_tokens"]), steps.index(r["steps"])
            grid[i, j] = r["speedup"]
            dark = r["speedup"] < (vmin + vmax) / 2
            ax.text(
                j,
                i,
                f"{r['speedup']:.2f}x\n{fmt(r['accept_length'])}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
            )
        im = ax.imshow(grid, cmap="viridis", vmin=vmin, vmax=vmax, origin="lower", aspect="auto")
        ax.set_xticks(range(len(steps)), [str(s) for s in steps])
        ax.set_yticks(range(len(dts)), [str(d) for d in dts])
        ax.set_xlabel("steps")
        ax.set_ylabel("draft tokens")
        ax.set_title(f"topk {k}" + (" (chain)" if k == 1 else ""))
    fig.colorbar(im, ax=axes[0].tolist(), label="speedup over the target alone")
    b = res["best"]
    fig.suptitle(
        f"speedup / accept length; best ({b['steps']}, {b['topk']}, {b['draft_tokens']}) "
        f"{b['speedup']:.2f}x; baseline {res['baseline_tokens_per_s']:.0f} tok/s on {res['device']}",
        fontsize=9,
    )
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())
