"""Where a bf16 token's arithmetic parts between a 1-row step and a k-row verify (issue "Fast v2" item 4).

Demo pair target, bf16, uncompiled, on the GPU: after a prompt, the same token is stepped as 1 row and as row 0 of a
k-row chain (Target.step(token, rows=k)); forward hooks record every module's output, and the first module (in
execution order) whose row 0 differs is where the rounding parts. Run with products through cuBLAS, through
eaglekit.kernels.invariant_gemm (batch-invariant products), and with products "invariant" (invariant_gemm and the
batch-invariant attention of eaglekit.kernels.invariant_attention), so what is left over is visible.

    python benchmarks/lab/bf16_where.py OUT.json [--rows 6]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglekit.demo import ASSETS
from eaglekit.options import PairRuntime
from eaglekit.pair import load_pair
from eaglekit.tokenizer import encode, load_tokenizer, read_prompts


def _row0(out):
    t = out[0] if isinstance(out, tuple) else out
    return t.reshape(-1, t.shape[-1])[0].float().clone()


def record(t, tok, rows):
    seen: list[tuple[str, torch.Tensor]] = []
    hooks = [m.register_forward_hook(lambda mod, a, out, n=name: seen.append((n, _row0(out))))
             for name, m in t.net.named_modules() if name and not isinstance(m, torch.nn.ModuleList)]
    L = int(t.committed)
    try:
        logits = t.step(tok, rows)
    finally:
        for h in hooks:
            h.remove()
        t.committed.fill_(L)
    return seen, logits.float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    t, _ = load_pair(ASSETS / "target", ASSETS / "draft", device=args.device, dtype="bfloat16",
                     run=PairRuntime(compile="off"))
    tok = load_tokenizer(ASSETS / "target")
    res = {}
    # F.linear; invariant_gemm from 1 row; invariant_gemm + attend (all invariant)
    for key in ("cublas", "invariant_gemm", "invariant"):
        t.set_products({"cublas": None, "invariant_gemm": "invariant_gemm"}.get(key, key), from_rows=1)
        first: dict[str, int] = {}
        same_logits = 0
        for p in read_prompts(ASSETS / "prompts.jsonl")[:args.prompts]:
            ids = torch.tensor(encode(tok, p), device=args.device)
            t.reset(len(ids) + 64)
            logits, _ = t.prefill(ids)
            nxt = logits[-1].argmax().view(1)
            one, l1 = record(t, nxt, 1)
            many, lk = record(t, nxt, args.rows)
            same_logits += int(torch.equal(l1, lk))
            for (name, a), (_, b) in zip(one, many):
                if not torch.equal(a, b):
                    first[name] = first.get(name, 0) + 1
                    break
        res[key] = {"first_module_that_differs": first, "identical_logits": same_logits, "prompts": args.prompts}
        print(f"{key}: logits identical on {same_logits}/{args.prompts}; first module that parts: {first}", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
