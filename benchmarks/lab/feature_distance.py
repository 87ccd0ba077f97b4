"""The doctor's features check (eaglekit.doctor.identity) calibrated: the feature distance
(eaglekit.train.fingerprint.distance) of the demo draft's recorded statistics against its own target and against
same-shape copies with other weights, over probes of every size the doctor grows through, term by term (scale, mean
direction, second moments).

    python benchmarks/lab/feature_distance.py [--out DIR] [--scales 0.02,0.05,0.1,0.2]

What it answers: where the threshold between "the draft's own target" and "another target" can sit, and how many probe
tokens that takes. Each probe is the doctor's: the demo prompts (prompts.jsonl) continued greedily by the target, a
round of prompts at a time, then longer continuations; the statistics cover every token of the text. A perturbed copy
is the doctor zoo's (eaglekit.doctor.zoo.perturb_target: every matrix times 1 + s * N(0, 1)).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (prompts, new tokens per prompt): the doctor's first rounds at its default and smaller sizes, and longer probes,
# over the demo prompts (prompts.jsonl beside the target) and over the built-in ones (a target folder without them)
PROBES = {"demo": [(4, 32), (8, 32), (8, 48), (8, 64), (12, 32), (12, 64), (16, 64), (24, 64), (32, 64), (32, 128)],
          "built-in": [(8, 32), (8, 64), (8, 128)]}


def terms(a: dict, b: dict) -> dict:
    """fingerprint.distance's three terms apart."""
    import torch

    from eaglekit.train.fingerprint import RMS_WEIGHT

    eps = 1e-12
    ma, mb = torch.tensor(a["mean"]), torch.tensor(b["mean"])
    sa, sb = torch.tensor(a["second"]), torch.tensor(b["second"])
    return {"rms": RMS_WEIGHT * abs(math.log((a["rms"] + eps) / (b["rms"] + eps))),
            "mean": float(1 - torch.nn.functional.cosine_similarity(ma, mb, dim=0, eps=1e-12)),
            "second": float(((sa + eps).log() - (sb + eps).log()).abs().mean())}


def measure(target_dir: Path, recorded: dict, prompt_sets: dict[str, list[list[int]]]) -> list[dict]:
    """Per probe text and size: tokens, and per slot the layer the doctor matches and the distance with its terms."""
    import torch

    from eaglekit.capture import CaptureSpec
    from eaglekit.models import load_target
    from eaglekit.train.data import Example, pad_batch
    from eaglekit.train.fingerprint import FeatureSketch, distance
    from eaglekit.train.regen import greedy_texts

    target = load_target(target_dir, device="cpu", dtype=torch.float32)
    L, H = target.info.num_layers, target.info.hidden_size
    every = CaptureSpec(tuple(range(-1, L)))
    eos = tuple(target.info.eos_token_ids)
    texts: dict[tuple, list[list[int]]] = {}  # (text, new tokens) -> the prompts' continuations
    out = []
    for text, n_prompts, new in [(t, p, n) for t, sizes in PROBES.items() for p, n in sizes]:
        if (text, new) not in texts:
            most = max(p for p, _ in PROBES[text])
            texts[text, new] = greedy_texts(target, prompt_sets[text][:most], new, eos)
        seqs = texts[text, new][:n_prompts]
        sk = FeatureSketch(L + 1, H)
        with torch.no_grad():
            for i in range(0, len(seqs), 8):
                ids, _, valid = pad_batch([Example(s, [1] * len(s)) for s in seqs[i:i + 8]])
                _, feats = target.features(ids, valid.long(), every)
                sk.add(feats, valid)
        slots = []
        for i, rec in enumerate(recorded["slots"]):
            ds = sorted((distance(rec, sk.slot(j)), j - 1) for j in range(L + 1))
            d, layer = ds[0]
            slots.append({"slot": i, "layer": layer, "distance": round(d, 4),
                          "terms": {k: round(v, 4) for k, v in terms(rec, sk.slot(layer + 1)).items()}})
        out.append({"text": text, "prompts": n_prompts, "new_tokens": new, "tokens": sk.n,
                    "worst": max(s["distance"] for s in slots), "slots": slots})
        print(f"  {text:8s} {n_prompts:3d} x {new:3d}: {sk.n:6d} tokens, worst {out[-1]['worst']:.3f}  "
              + "  ".join(f"s{s['slot']}@{s['layer']} {s['distance']:.2f} ({s['terms']['rms']:.2f}/"
                          f"{s['terms']['mean']:.2f}/{s['terms']['second']:.2f})" for s in slots), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--scales", default="0.02,0.05,0.1,0.2")
    args = ap.parse_args()
    from eaglekit.doctor.probe import GENERIC_PROMPTS, probe_prompts
    from eaglekit.doctor.zoo import perturb_target
    from eaglekit.tokenizer import encode, load_tokenizer

    demo = ROOT / "eaglekit" / "assets" / "demo"
    cfg = json.loads((demo / "draft" / "config.json").read_text())
    recorded = cfg["eaglekit"]["features"]
    target_dir = demo / "target"
    prompts, _ = probe_prompts(target_dir, None, 0)
    tok = load_tokenizer(target_dir)
    sets = {"demo": prompts, "built-in": [encode(tok, t) for t in GENERIC_PROMPTS]}
    t0 = time.time()
    res = {"probe": "feature_distance", "argv": sys.argv, "recorded_tokens": recorded["tokens"], "targets": {}}
    print("own target (distance: rms/mean/second terms)")
    res["targets"]["own"] = measure(target_dir, recorded, sets)
    with tempfile.TemporaryDirectory() as tmp:
        for s in [float(x) for x in args.scales.split(",") if x]:
            print(f"perturbed copy, s = {s}")
            d = perturb_target(target_dir, Path(tmp) / f"t{s}", scale=s)
            res["targets"][f"perturbed_{s}"] = measure(d, recorded, sets)
    res["seconds"] = round(time.time() - t0, 1)
    stamp = time.strftime("%Y-%m-%d")
    path = Path(args.out) / f"{stamp}_cpu_feature_distance.json"
    tmp_path = path.with_suffix(".tmp")
    tmp_path.write_text(json.dumps(res, indent=1))
    os.replace(tmp_path, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
