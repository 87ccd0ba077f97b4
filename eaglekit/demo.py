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
from .observe.metrics import fmt
from .options import DEMO_DEVICE, DecodeOptions, DemoOptions, ModelOptions
from .pair import load_pair
from .tokenizer import encode, load_tokenizer, read_prompts

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
    return f"{name}{f' ({isa})' if isa else ''}"


def run_demo(target=None, draft=None, opts: DemoOptions | None = None, decode: DecodeOptions | None = None,
             model: ModelOptions | None = None, progress: bool = True) -> dict:
    """The shipped pair (or `target` / `draft` folders) on the held-out prompts, both ways. `decode` gives the
    length and the tree (default: DEFAULT_SHAPE); `model` the device (default cpu: see DEMO_DEVICE) and dtype."""
    opts, decode = opts or DemoOptions(), decode or DecodeOptions()
    model = model or ModelOptions(device=DEMO_DEVICE)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    tdir, ddir, pfile = demo_paths(target, draft, opts.prompt_file)
    tgt, drf = load_pair(tdir, ddir, model.backend, model.device_name, model.dtype_name)
    tok = load_tokenizer(tdir)
    shape = decode.shape() if decode.tree_given else TreeShape.make(*DEFAULT_SHAPE)
    dec = Decoder(tgt, drf, shape)
    ids = [encode(tok, t) for t in read_prompts(pfile)[:opts.prompts]]
    cmp = compare(dec, ids, decode.max_new_tokens, warmup=16, progress="demo" if progress else None)
    return {**cmp.summary(),
            "tree": {"steps": shape.steps, "topk": shape.topk, "draft_tokens": shape.draft_tokens},
            "device": str(tgt.device), "processor": processor_name(tgt.device), "threads": torch.get_num_threads(),
            "per_prompt": cmp.rows()}


def print_demo(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    tr = res["tree"]
    t = Table(title=f"eaglekit demo: {res['prompts']} held-out prompts, {res['new_tokens']} new tokens, "
                    f"{res['device']} ({res.get('processor', '?')}), {res['threads']} threads; tree steps {tr['steps']}, "
                    f"topk {tr['topk']}, "
                    f"draft tokens {tr['draft_tokens']}")
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
    c.print(t)
