"""The draft's pick per level on a GPU, side by side: torch's softmax + top-k against eaglekit.kernels.topk's two
kernels (a tree's levels) and the argmax (a chain's), each replayed in a CUDA graph as the cycle runs it; the
kernels' ids checked equal to torch's and their probabilities close.

    python benchmarks/lab/pick_bench.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.timing import median_ms  # noqa: E402
from eaglekit.kernels.graphs import record_graphs  # noqa: E402
from eaglekit.kernels.topk import kernel_top_probs, torch_top_probs  # noqa: E402


def graphed(fn):
    """fn recorded in a CUDA graph as eaglekit's cycle records it (engine.record_graphs): its replay."""
    return record_graphs([[fn]], {"pick": fn}, [])["pick"].replay


def main():
    out = Path(sys.argv[1])
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for R, V, k in [(1, 32000, 4), (4, 32000, 4), (8, 32000, 8), (4, 128256, 4), (1, 32000, 1)]:
        x = torch.randn(R, V, device="cuda", generator=g) * 3
        p0, i0 = torch_top_probs(x, k)
        p1, i1 = kernel_top_probs(x, k)
        same = bool(torch.equal(i0, i1))
        close = float((p1 - p0).abs().max() / p0.abs().max())
        t_torch = median_ms(graphed(lambda: torch_top_probs(x, k)), 200, cuda=True)
        t_kern = median_ms(graphed(lambda: kernel_top_probs(x, k)), 200, cuda=True)
        t_arg = median_ms(graphed(lambda: x.argmax(-1, keepdim=True)), 200, cuda=True)
        rows.append({"rows": R, "vocab": V, "k": k, "ids_equal": same, "prob_max_rel_diff": close,
                     "torch_softmax_topk_us": round(t_torch * 1e3, 1), "kernels_us": round(t_kern * 1e3, 1),
                     "argmax_us": round(t_arg * 1e3, 1)})
        print(rows[-1])
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "picks": rows}, indent=1))


if __name__ == "__main__":
    main()
