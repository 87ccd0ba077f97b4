"""CPU cases on the shipped demo pair (eaglekit/assets/demo): the demo's decode both ways, and the cost of the
EAGLE-3 cycle against the target's step. Both run anywhere; on a 2-core machine cpu-demo takes ~2-8 minutes
(--quick: ~1), cpu-cycle ~1 minute.

Timings on a CPU shared with other work are noisy (another process's burst lands on one mode only): the demo
alternates the two modes prompt by prompt, and the suite's rounds give the spread."""

from __future__ import annotations

from ..registry import case, shapes, suite
from ..schema import stats, value
from ..timing import OneRow, samples_ms


def _tree(p):
    return (p["steps"], p["topk"], p["draft_tokens"]) if p.get("steps") else None


@case("demo-decode", "the demo pair's held-out prompts with and without its draft: tok/s, speedup, accept length, "
      "identity (as `eaglekit demo`)",
      defaults={"device": "cpu", "prompts": 32, "max_new_tokens": 128, "rounds": 3, "steps": None, "topk": None,
                "draft_tokens": None, "products": "auto", "threads": None, "dtype": "auto"},
      quick={"prompts": 6, "max_new_tokens": 64, "rounds": 2, "steps": 4, "topk": 1, "draft_tokens": 5})
def demo_decode(p, ctx):
    from eaglekit.demo import run_demo
    from eaglekit.options import DecodeOptions, DemoOptions, ModelOptions

    tree = _tree(p)
    decode = DecodeOptions(max_new_tokens=p["max_new_tokens"], **(dict(zip(("steps", "topk", "draft_tokens"), tree))
                                                                   if tree else {}))
    model = ModelOptions(device=p["device"], dtype=p["dtype"], products=p["products"])
    runs = []
    for _ in range(p["rounds"]):
        runs.append(run_demo(opts=DemoOptions(prompts=p["prompts"], threads=p["threads"]), decode=decode, model=model,
                             progress=False))
    per = [r for run in runs for r in run["per_prompt"]]
    last = runs[-1]
    return {
        "metrics": {
            "speedup": stats([r["speedup"] for r in runs], "x"),
            "baseline_tokens_per_s": stats([r["baseline_tokens_per_s"] for r in runs], "tok/s"),
            "eagle_tokens_per_s": stats([r["eagle_tokens_per_s"] for r in runs], "tok/s"),
            "accept_length": stats([r["accept_length"] for r in runs], "tokens/verify"),
            "speedup_per_prompt": stats([r["eagle_tokens_per_s"] / r["baseline_tokens_per_s"] for r in per], "x"),
        },
        "identity": {"greedy_output_equals_target": all(r["identical"] for r in runs),
                     "prompts_identical": sum(r["identical"] for r in per), "prompts_decoded": len(per)},
        "details": {"trees": [r["tree"] for r in runs], "products": [r["products"] for r in runs],
                    "products_pick": [r.get("products_pick") for r in runs], "per_position": last["per_position"],
                    "processor": last["processor"], "threads": last["threads"], "device": last["device"]},
    }


def _demo_pair(p):
    from eaglekit.demo import ASSETS
    from eaglekit.options import PairRuntime
    from eaglekit.pair import load_pair

    return load_pair(ASSETS / "target", ASSETS / "draft", device=p["device"], dtype=p["dtype"],
                     run=PairRuntime(compile="off", products=p["products"]))


@case("demo-cycle", "the demo pair's decode step, and per tree its cycle and verify, timed one by one",
      defaults={"device": "cpu", "dtype": "float32", "products": "auto", "threads": None, "reps": 40,
                "shapes": "3,1,4;5,1,6;5,4,8", "context": 128},
      quick={"reps": 12, "shapes": "3,1,4;5,4,8"})
def demo_cycle(p, ctx):
    import torch

    from eaglekit.decoding.tree import TreeShape

    if p["threads"]:
        torch.set_num_threads(p["threads"])
    t, d = _demo_pair(p)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, t.info.vocab_size, (p["context"],), generator=g).to(t.device)
    span = p["context"] + 128
    plain = OneRow(t, None, TreeShape.make(), prompt, graphs=False)
    step = samples_ms(plain.step, p["reps"], warm=3, before=plain.restore)
    metrics = {"step_ms": stats(step, "ms")}
    base = metrics["step_ms"]["median"]
    for s in shapes(p["shapes"]):
        shape = TreeShape(*(int(x) for x in s.split(",")))
        one = OneRow(t, d, shape, prompt, graphs=False)
        cyc = samples_ms(one.cycle, p["reps"], warm=3, before=one.restore)

        def verify(one=one):
            one.restore()
            one.run("draft_tree")

        ver = samples_ms(lambda one=one: one.run("verify"), p["reps"], warm=2, before=verify)
        key = s.replace(",", "_")
        metrics[f"cycle_ms_{key}"] = stats(cyc, "ms")
        metrics[f"verify_ms_{key}"] = stats(ver, "ms")
        metrics[f"cycle_over_step_{key}"] = value(metrics[f"cycle_ms_{key}"]["median"] / base, "steps")
    return {"metrics": metrics,
            "details": {"products": getattr(t, "products", "aten"), "products_pick": getattr(t, "products_pick", None),
                        "threads": torch.get_num_threads(), "context": p["context"], "span": span}}


suite("cpu-demo", "the shipped demo pair decoded with and without its draft on this machine (CPU by default)",
      ["demo-decode"])
suite("cpu-cycle", "step, verify and cycle cost of the shipped demo pair (CPU by default)", ["demo-cycle"])
