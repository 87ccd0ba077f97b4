"""The story's bug as an experiment: the same draft, run with the capture it was trained on and with
captures that differ from its training (after_layers shifted by -1 / +1, the default with the embedding
swapped in for the low layer). Same shapes, no error anywhere: only acceptance shows the fault.

    python benchmarks/lab/wiring_experiment.py [--target DIR --draft DIR --prompts N --max-new-tokens N]

Defaults to the shipped demo pair on its held-out prompts, greedy, chain (3, 1, 4), on the CPU.
"""

from __future__ import annotations

import argparse
import json

import torch


def main():
    from eaglekit.capture import CaptureSpec
    from eaglekit.decoding.decoder import Decoder
    from eaglekit.decoding.tree import TreeShape
    from eaglekit.demo import demo_paths
    from eaglekit.observe.metrics import aggregate
    from eaglekit.pair import load_pair
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    ap = argparse.ArgumentParser()
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--prompt-file")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(2)
    tdir, ddir, pfile = demo_paths(args.target, args.draft, args.prompt_file)
    target, draft = load_pair(tdir, ddir, device="cpu")
    tok = load_tokenizer(tdir)
    prompts = [encode(tok, p) for p in read_prompts(pfile)[: args.prompts]]
    trained = draft.config.capture or CaptureSpec.default(target.info.num_layers)
    lo, mid, hi = trained.after_layers
    wirings = {
        "as trained": trained,
        "shifted -1 (read as input-of)": trained.shifted(-1),
        "shifted +1": trained.shifted(+1),
        "embedding instead of low layer": CaptureSpec((-1, mid, hi)),
        "last layers only": CaptureSpec(tuple([target.info.num_layers - 1] * 3)),
    }
    rows = {}
    for name, spec in wirings.items():
        dec = Decoder(target, draft, TreeShape(3, 1, 4), capture=spec)
        runs, same = [], True
        for p in prompts:
            r = dec.generate(p, args.max_new_tokens)
            same &= r.token_ids == dec.generate(p, args.max_new_tokens, baseline=True).token_ids
            runs.append(r.metrics)
        m = aggregate(runs)
        rows[name] = {"after_layers": list(spec.after_layers), "accept_length": round(m.accept_length, 3),
                      "per_position": [round(x, 3) for x in m.per_position], "identical_output": same}
    print(f"{'wiring':34} {'after_layers':>14} {'accept len':>10}  per position        output identical")
    for name, r in rows.items():
        print(f"{name:34} {str(r['after_layers']):>14} {r['accept_length']:10.2f}  "
              f"{' '.join(f'{x:.2f}' for x in r['per_position']):18}  {r['identical_output']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
