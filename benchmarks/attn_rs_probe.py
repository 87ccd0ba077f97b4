"""The verify attention (bulk's attention kernel) alone, default build against a variant (EK_ATTN_RS=0: attn_rows's
butterflies, the same bits; EK_ATTN_MMA=0: attn_rows, CUDA cores, a block a row, against attn_tiles's tensor cores;
EK_ATTN_MTB=1: attn_tiles one tile a block): whether the bits are the same, the largest difference, and ms for 32
launches (an 8B step's layers, each its own 512-key cache so the caches exceed the L2) at k rows, in a CUDA graph
(smallm.graph_ms), one build after the other. Not the step: no products beside it, no PDL neighbours.

    python benchmarks/attn_rs_probe.py OUT [--define EK_ATTN_MMA=0] [--rows 1,6,8]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eaglekit.models import bulk, smallm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--define", action="append", default=[])
    ap.add_argument("--rows", default="1,6,8")
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    defines = tuple(args.define or ["EK_ATTN_MMA=0"])
    H, Hkv, hd, L, layers = 32, 8, 128, args.context, 32
    kb = bulk.Kernels("cuda")
    libs = {"default": bulk.library(), "variant": bulk.library(defines)}
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "defines": defines, "context": L, "rows": {}}
    for T in (int(r) for r in args.rows.split(",")):
        S = L + T
        caches = [(torch.randn(Hkv, S, hd, device="cuda", generator=g).bfloat16(),
                   torch.randn(Hkv, S, hd, device="cuda", generator=g).bfloat16()) for _ in range(layers)]
        q = torch.randn(T, H * hd, device="cuda", generator=g).bfloat16()
        block = torch.ones(T, T, dtype=torch.bool, device="cuda").tril().contiguous()
        base = torch.tensor([L], device="cuda")
        scratch = kb.scratch(T, S, Hkv, H // Hkv)
        outs, row = {}, {}
        for name, lib in libs.items():  # (smallm.graph_ms: one CUDA graph of the 32 launches, the median per launch)
            kb.lib = lib
            # (NaNs where the output will be allocated: the caching allocator hands the last freed block of this size
            # back, so an output a variant failed to write would otherwise show the default's values)
            torch.full((T, H * hd), float("nan"), device="cuda", dtype=torch.bfloat16)
            outs[name] = kb.attn(q, *caches[0], base, block, (H, Hkv, hd), scratch).clone()
            row[name] = round(layers * smallm.graph_ms(
                lambda i: kb.attn(q, *caches[i], base, block, (H, Hkv, hd), scratch), layers, reps=30), 4)
        row["same_bits"] = bool(torch.equal(outs["default"], outs["variant"]))
        row["max_abs_diff"] = float((outs["default"].float() - outs["variant"].float()).abs().max())
        res["rows"][T] = row
        print(T, row, flush=True)
        kb.lib = libs["default"]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "attn_rs_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
