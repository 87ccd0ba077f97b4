"""`eaglekit demo`: the shipped pair on held-out prompts, with and without the draft, side by side.

The pair (eaglekit/assets/demo) is a 12-layer Llama-architecture target trained on the Python
standard library and its EAGLE-3 draft, both made by `eaglekit recipe demo`. The prompts come from
standard-library files held out of both trainings.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .decoding.compare import compare
from .decoding.engine import Decoder
from .decoding.tree import TreeShape
from .errors import InputError
from .observe.chainpick import pick_chain
from .observe.metrics import fmt
from .options import DEMO_DEVICE, DecodeOptions, DemoOptions, ModelOptions
from .pair import compiled, load_pair
from .tokenizer import encode, load_tokenizer, read_prompts

ASSETS = Path(__file__).parent / "assets" / "demo"
# On a CPU, without --steps/--topk/--draft-tokens, the demo picks its chain on the machine it runs on: which
# length pays depends on what a verify of k rows costs against one row there (a 2-core AMD EPYC: chains 3-6,
# 1.75-1.85x; a 2-core Sapphire Rapids: the chain of 2, 1.39x against 1.28-1.32x for the chain of 5; NOTES.md).
# eaglekit.observe.chainpick predicts each chain's accept length on these very prompts and times its cycles.
# On a GPU (where each chain would compile its own shapes first) the demo runs this one
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


def processor_name(device: torch.device) -> str:
    """What ran the demo, for its table: the GPU's name, or the CPU model (the speedup depends on it: see the
    README) with the instruction sets that decide which kernels torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    info = {}
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


def run_demo(target=None, draft=None, opts: DemoOptions | None = None, decode: DecodeOptions | None = None,
             model: ModelOptions | None = None, progress: bool = True) -> dict:
    """The shipped pair (or `target` / `draft` folders) on the held-out prompts, both ways. `decode` gives the
    length and the tree (default: picked on a CPU by pick_chain, DEFAULT_SHAPE on a GPU); `model` the device
    (default cpu: see DEMO_DEVICE), dtype and compile mode."""
    opts, decode = opts or DemoOptions(), decode or DecodeOptions()
    model = model or ModelOptions(device=DEMO_DEVICE)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    tdir, ddir, pfile = demo_paths(target, draft, opts.prompt_file)
    tgt, drf = load_pair(tdir, ddir, model.backend, model.device_name, model.dtype_name, compile=model.compile_mode,
                         products=model.products, draft_quant=model.draft_quant)
    tok = load_tokenizer(tdir)
    ids = [encode(tok, t) for t in read_prompts(pfile)[:opts.prompts]]
    picked = None
    if decode.tree_given:
        shape = decode.shape()
    elif tgt.device.type == "cpu":
        shape, picked = pick_chain(tgt, drf, ids, decode.max_new_tokens)
    else:
        shape = TreeShape.make(*DEFAULT_SHAPE)
    dec = Decoder(tgt, drf, shape)
    cmp = compare(dec, ids, decode.max_new_tokens, warmup=16, progress="demo" if progress else None)
    return {**cmp.summary(),
            "tree": {"steps": shape.steps, "topk": shape.topk, "draft_tokens": shape.draft_tokens,
                     "picked": picked},
            "device": str(tgt.device), "processor": processor_name(tgt.device), "threads": torch.get_num_threads(),
            "compiled": compiled(tgt), "products": getattr(tgt, "products", "aten"),
            "products_pick": getattr(tgt, "products_pick", None), "draft_quant": getattr(drf, "quantized", None),
            "per_prompt": cmp.rows()}


def print_demo(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    tr = res["tree"]
    picked = tr.get("picked")
    how = (f" (picked on this machine in {picked['seconds']:.0f} s: predicted tokens/s of chains "
           + ", ".join(f"{x['steps']} {x['tokens_per_s']:.0f}" for x in picked["candidates"])
           + " = their accept lengths on these prompts over their cycle times)" if picked else "")
    pp = res.get("products_pick")
    prod = f"; products: {res.get('products', 'aten')}" + (
        " (the faster here; ms for a step + a 6-row verify: "
        + ", ".join(f"{k} {sum(v):.1f}" for k, v in pp["ms"].items()) + ")" if pp else "")
    if res.get("draft_quant"):
        prod += f"; draft weights {res['draft_quant']}"
    t = Table(title=f"eaglekit demo: {res['prompts']} held-out prompts, {res['new_tokens']} new tokens, "
                    f"{res['device']} ({res.get('processor', '?')}), {res['threads']} threads; tree steps {tr['steps']}, "
                    f"topk {tr['topk']}, draft tokens {tr['draft_tokens']}{how}{prod}")
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
    if rows > 1:  # bf16 on a GPU: the reference steps through verify-shaped kernels (Decoder.baseline_rows)
        t.add_row(f"output identical to the target's (greedy, {rows}-row steps)", "", same)
        t.add_row("identical to the plain 1-row decode", "", f"{res['identical_one_row']}/{res['prompts']} prompts")
    else:
        t.add_row("output identical to the target's (greedy)", "", same)
    if "warm_up_s" in res:
        how = "compiled layers" if res.get("compiled") else "uncompiled layers"
        t.caption = f"{how}; warm-up before the timings {res['warm_up_s']:.1f} s"
    c.print(t)
