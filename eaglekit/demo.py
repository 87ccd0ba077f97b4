"""`eaglekit demo`: the shipped pair on held-out prompts, with and without the draft, side by side.

The pair (eaglekit/assets/demo) is a 12-layer Llama-architecture target trained on the Python
standard library and its EAGLE-3 draft, both made by `eaglekit recipe demo`. The prompts come from
standard-library files held out of both trainings.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import InputError

ASSETS = Path(__file__).parent / "assets" / "demo"
# chosen on the 2-core CPU machine over the 32 held-out prompts (benchmarks/NOTES.md): the chain of 5 gave the
# best tokens/s of (3,1,4), (4,1,5), (5,1,6), (3,2,6)
DEFAULT_SHAPE = (5, 1, 6)


def demo_paths(target=None, draft=None, prompts=None) -> tuple[Path, Path, Path]:
    t = Path(target) if target else ASSETS / "target"
    d = Path(draft) if draft else ASSETS / "draft"
    p = Path(prompts) if prompts else ASSETS / "prompts.jsonl"
    for what, path in (("target", t), ("draft", d), ("prompts", p)):
        if not path.exists():
            raise InputError(f"the demo {what} is missing at {path}",
                             fix="reinstall eaglekit, or rebuild the pair: eaglekit recipe demo --install", code="E101")
    return t, d, p


def run_demo(target=None, draft=None, prompts=None, n_prompts: int = 32, max_new_tokens: int = 128, shape=None,
             device: str = "cpu", dtype=None, threads: int | None = None, progress: bool = True) -> dict:
    from .decoding.engine import Decoder
    from .decoding.tree import TreeShape
    from .observe.metrics import GenerationMetrics, aggregate
    from .pair import load_pair
    from .tokenizer import encode, load_tokenizer, read_prompts

    if threads:
        torch.set_num_threads(threads)
    tdir, ddir, pfile = demo_paths(target, draft, prompts)
    tgt, drf = load_pair(tdir, ddir, "auto", device, dtype)
    tok = load_tokenizer(tdir)
    shape = shape or TreeShape.make(*DEFAULT_SHAPE)
    dec = Decoder(tgt, drf, shape)
    texts = read_prompts(pfile)[:n_prompts]
    ids = [encode(tok, t) for t in texts]
    dec.generate(ids[0], 16)  # warm-up: first-call allocations stay out of the timings
    dec.generate(ids[0], 16, baseline=True)
    base_runs, eagle_runs, identical, rows = [], [], True, []
    it = ids
    if progress:
        from tqdm import tqdm

        it = tqdm(ids, desc="demo", unit="prompt", leave=False)
    for i, p in enumerate(it):
        # alternate the order so that neither mode always runs on a warmer cache
        order = (True, False) if i % 2 == 0 else (False, True)
        res = {}
        for baseline in order:
            res[baseline] = dec.generate(p, max_new_tokens, baseline=baseline)
        b, e = res[True], res[False]
        same = b.token_ids == e.token_ids
        identical &= same
        base_runs.append(b.metrics)
        eagle_runs.append(e.metrics)
        rows.append({"prompt_tokens": len(p), "new_tokens": e.metrics.new_tokens, "identical": same,
                     "accept_length": round(e.metrics.accept_length, 3),
                     "baseline_tokens_per_s": round(b.metrics.tokens_per_s, 1),
                     "eagle_tokens_per_s": round(e.metrics.tokens_per_s, 1)})
    B: GenerationMetrics = aggregate(base_runs)
    E: GenerationMetrics = aggregate(eagle_runs)
    return {
        "accept_length": round(E.accept_length, 3),
        "accept_rate": round(E.accept_rate, 4),
        "per_position": [round(x, 4) for x in E.per_position],
        "histogram": E.histogram,
        "baseline_tokens_per_s": round(B.tokens_per_s, 2),
        "eagle_tokens_per_s": round(E.tokens_per_s, 2),
        "speedup": round(E.tokens_per_s / B.tokens_per_s, 3) if B.tokens_per_s else 0.0,
        "identical": identical,
        "prompts": len(ids),
        "new_tokens": E.new_tokens,
        "tree": {"steps": shape.steps, "topk": shape.topk, "draft_tokens": shape.draft_tokens},
        "device": str(tgt.device),
        "threads": torch.get_num_threads(),
        "per_prompt": rows,
    }


def print_demo(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    tr = res["tree"]
    t = Table(title=f"eaglekit demo: {res['prompts']} held-out prompts, {res['new_tokens']} new tokens, "
                    f"{res['device']}, {res['threads']} threads; tree steps {tr['steps']}, topk {tr['topk']}, "
                    f"draft tokens {tr['draft_tokens']}")
    t.add_column("")
    t.add_column("target alone", justify="right")
    t.add_column("with EAGLE-3", justify="right")
    t.add_row("tokens/s", f"{res['baseline_tokens_per_s']:.1f}", f"{res['eagle_tokens_per_s']:.1f}")
    t.add_row("speedup", "1.00x", f"{res['speedup']:.2f}x")
    t.add_row("accept length (tokens per verify)", "1", f"{res['accept_length']:.2f}")
    for k, v in enumerate(res["per_position"], 1):
        t.add_row(f"acceptance at draft position {k}", "", f"{v:.1%}")
    t.add_row("output identical to the target's (greedy)", "", "yes" if res["identical"] else "NO")
    c.print(t)
