"""Where a batched cycle goes at the 8B shape: device time of each recorded phase (and of the plain step) per
products kind, batch size and draft length, and the kernels of a few cycles by device time.

    python benchmarks/lab/batch_cycle_profile.py --out DIR [--cases aten:64,invariant:16] [--fold on,off] [--tiny]

`--fold off` sets eaglekit.models.layers.FOLD_GQA_MAX_TOKENS to 0 (SDPA's enable_gqa for cached calls), to set the
folded attention beside it in one process; such cases are named <kind>_b<B>_nofold. Writes
DIR/batch_cycle_profile.json and DIR/batch_kernels_<case>_len<j>.txt."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.cases.batch import build_pair  # noqa: E402
from benchmarks.timing import samples_ms  # noqa: E402


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="aten:64,invariant:16,invariant:8")
    ap.add_argument("--lengths", default="3,1")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--fold", default="on")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    from eaglekit.decoding.config import EngineOptions
    from eaglekit.decoding.engine import BatchEngine, Request
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.models import layers

    cuda = torch.cuda.is_available() and not a.tiny
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t, d, raw = build_pair(a.tiny, "cuda" if cuda else "cpu")
    g = torch.Generator().manual_seed(1)
    res = {}
    fold_on = layers.FOLD_GQA_MAX_TOKENS
    for item, fold in [(i, f) for i in a.cases.split(",") for f in a.fold.split(",")]:
        kind, B = item.split(":")
        B = int(B)
        name = f"{kind}_b{B}" + ("" if fold == "on" else "_nofold")
        layers.FOLD_GQA_MAX_TOKENS = fold_on if fold == "on" else 0
        t.set_products(kind)
        eng = BatchEngine(t, d, EngineOptions(shape=TreeShape(3, 1, 4), max_batch=B, spec_max_batch=B, graphs=cuda,
                                              adaptive=False))
        for i in range(B):
            prompt = torch.randint(0, raw["vocab_size"] - 1, (a.context,), generator=g).tolist()
            eng.add(Request(f"r{i}", prompt, 256, eos_ids=()))
        eng.step()
        c0 = eng.cycle()
        state = c0.moving()
        snap = [x.clone() for x in state]

        def restore():
            for x, v in zip(state, snap):  # noqa: B023
                x.copy_(v)

        def med(fn):
            return round(sorted(samples_ms(fn, 20, cuda=cuda, before=restore))[10], 4)

        row = {"plain_ms": med(lambda: (c0.run("plain"), c0.run("plain_commit")))}  # noqa: B023
        for j in map(int, a.lengths.split(",")):
            c = eng.cycle(eng.shapes[j])
            phases = {ph: med(lambda ph=ph: c.run(ph)) for ph in c.SPEC}  # noqa: B023

            def cycle():
                for ph in c.SPEC:  # noqa: B023
                    c.run(ph)  # noqa: B023

            phases["cycle"] = med(cycle)
            row[f"len{j}"] = phases
            if cuda:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        restore()
                        cycle()
                    torch.cuda.synchronize()
                (out / f"batch_kernels_{name}_len{j}.txt").write_text(
                    prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90))
        res[name] = row
        print(name, json.dumps(row), flush=True)
        del eng
        if cuda:
            torch.cuda.empty_cache()
    (out / "batch_cycle_profile.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
