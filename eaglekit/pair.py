"""Loading a target and its draft together (the draft borrows the target's embedding), and the one chooser of how
the pair runs: `plan_run` answers every 'auto' of PairRuntime (compile, prompt graphs, experts, draft precision)
with what runs and why, and kernels.products.choose the products; load_pair applies the plan and keeps it on the
target (`target.plan`), where `generate --json` and the demo read it (the doctor and the training record read
its products, `target.products_choice`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import torch

from .draft import Eagle3Draft, load_draft
from .errors import InputError
from .models import Target, load_target
from .options import PRODUCTS, PairRuntime, resolve_device

if TYPE_CHECKING:
    from .kernels.products import Choice


def pick_device(name: str | None = "auto") -> str:
    """--device's one meaning in every command: auto = cuda if a CUDA device is visible, else cpu."""
    return resolve_device(name)


def compile_pair(target: Target, draft: Eagle3Draft | None) -> None:
    """torch.compile the target's and the draft's decode calls (traced at their first call: a caller may set the
    products or the thread count before it). A target without `compiles` refuses it (E108)."""
    target.compile()
    if draft is not None:
        draft.compile()


T = TypeVar("T")


@dataclass(frozen=True)
class Decision(Generic[T]):
    """One part of a RunPlan: what runs, and why."""

    value: T
    why: str


@dataclass
class RunPlan:
    """How a loaded pair runs, each part with its reason: plan_run decides all but the products, which
    set_pair_products adds (kernels.products.choose; on a CPU it times candidates, so it runs after compiling)."""

    compile: Decision[bool]  # torch.compile of the decode calls
    prompt_graphs: Decision[bool]  # prompts through one graph compiled for every length
    experts: Decision[str | None]  # a mixture-of-experts target's routed experts: 'grouped', 'triton'; None: default
    draft_precision: Decision[str | None]  # 'int8' or 'none' (as stored); None without a draft
    products: Choice | None = None

    def as_dict(self) -> dict:
        """{part: {"value", "why"}}: what `generate --json` and the demo report."""
        out = {
            k: {"value": d.value, "why": d.why}
            for k, d in (
                ("compile", self.compile),
                ("prompt_graphs", self.prompt_graphs),
                ("experts", self.experts),
                ("draft_precision", self.draft_precision),
            )
        }
        c = self.products
        return out | {"products": {"value": c.kind, "why": c.reason} if c is not None else None}


def plan_run(target: Target, draft: Eagle3Draft | None, device, run: PairRuntime) -> RunPlan:
    """The plan for `run` (eaglekit.options.PairRuntime) on this target and draft; a value no part can take is E108."""
    # tensor-parallel ranks stay uncompiled: their all-reduces sit inside the layers
    own = target.compiles and target.tp is None
    gpu = str(device).startswith("cuda")
    if run.compile in (True, "on"):
        comp = Decision(True, "asked for (--compile)")
    elif run.compile in (False, "off"):
        comp = Decision(False, "asked not to (--no-compile)")
    elif run.compile not in ("auto", None):
        raise InputError(
            f"compile={run.compile!r} is not one of auto, on, off", fix="pass auto, on or off", code="E108"
        )
    elif run.server:
        comp = Decision(
            False,
            "a server's batched engine meets many (rows, tokens) shapes, each a compile of its "
            "own (seconds each, some while requests wait): --compile asks for it",
        )
    elif not own:
        comp = Decision(
            False, "this target's decoder does not compile (transformers-backed, or a tensor-parallel rank)"
        )
    elif gpu:
        comp = Decision(
            True, "a GPU with eaglekit's own decoder: the engine records the compiled kernels in its CUDA graphs"
        )
    else:
        comp = Decision(False, "on a CPU compiling does not pay (docs/performance.md#d34)")
    if run.prompt_graphs and not own:
        raise InputError(
            "--prompt-graphs needs eaglekit's own decoder (Llama or DeepSeek family, one process)",
            code="E108",
            fix="leave out --prompt-graphs for this target",
        )
    graphs = Decision(
        bool(run.prompt_graphs),
        "asked for (--prompt-graphs)"
        if run.prompt_graphs
        else "prompts run eagerly: prompt graphs are opt-in until their warm-up is measured on a GPU "
        "(eaglekit.kernels.compiling.compile_prompt)",
    )
    experts = _experts(target, run.experts)
    precision: Decision[str | None]
    if draft is None:
        precision = Decision(None, "no draft")
    elif run.draft_quant in (None, "auto"):
        q = auto_draft_quant(target, draft, device)
        precision = Decision(
            q,
            "int8 weights on a GPU for a bf16/fp16 pair: half the bytes a draft step, the "
            "accept length within 1% (docs/performance.md#d24)"
            if q == "int8"
            else "as stored: int8 pays on a GPU in bf16/fp16 only",
        )
    else:
        precision = Decision(run.draft_quant, "asked for (--draft-quant)")
    return RunPlan(comp, graphs, experts, precision)


def load_pair(
    target_dir, draft_dir=None, backend: str = "auto", device: str = "auto", dtype=None, run: PairRuntime | None = None
) -> tuple[Target, Eagle3Draft | None]:
    """The target and its draft (None without `draft_dir`), run as `run` (eaglekit.options.PairRuntime; None: its
    defaults) says, through plan_run (kept as `target.plan`):

    `run.compile`: torch.compile the decoder layers for the decode shapes. 'auto' (or None) compiles on a GPU with
    eaglekit's own decoder, where the engine records the compiled kernels in its CUDA graphs (on a CPU it does not
    pay: docs/performance.md#d34; a server's batched engine neither: `run.server`); 'on' / True everywhere, 'off' /
    False never. The first generation pays the compile; eaglekit.kernels.compiling keeps the kernels for the next
    run.

    `run.products`: how the decode products run: 'auto' is eaglekit.kernels.products.choose (its reason is kept as
    `target.products_choice` and in the plan; it reads `run.batched` and `run.rows`, the decode shape a server
    runs); 'aten', 'onednn' (CPU), 'invariant' (GPU, Triton) or 'hopper' (sm_90, CUDA built at first use) force
    one. 'invariant' and 'hopper' make every decode product and the decode attention batch-invariant, so bf16
    speculative output is identical to the bf16 plain decode (the draft keeps F.linear; its arithmetic never reaches
    the output).

    `run.draft_quant`: 'int8' runs the draft's products from int8 weights (eaglekit.kernels.int8: half its bytes a
    step; the output is the target's either way, the accept length may move); 'none' as stored; 'auto' (or None) is
    `auto_draft_quant`. What ran is kept as `draft.precision` ('int8' or the stored dtype).

    `run.prompt_graphs`: prompts (the target's prefill, the draft's extend over a prompt) through one graph compiled
    for every length (target.compile_prompts(); eaglekit.kernels.compiling.compile_prompt), with or without
    `compile`; the engine compiles it before its first prefill.

    `run.experts`: how a mixture-of-experts target runs its routed experts ('auto', 'grouped', 'triton':
    DeepSeekTarget.set_experts), set before anything compiles; another than 'auto' for a dense target is E108."""
    run = PairRuntime() if run is None else run
    device = pick_device(device)
    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    draft = None
    if draft_dir is not None:
        draft = load_draft(draft_dir, device=device, dtype=target.dtype, embed_weight=target.embed_weight())
        draft.fuse()
    plan = plan_run(target, draft, device, run)
    if draft is not None:
        set_draft_precision(target, draft, device, str(plan.draft_precision.value))
    if target.experts is not None:
        target.set_experts(plan.experts.value)  # (before anything compiles)
    if plan.compile.value:
        compile_pair(target, draft)
    if plan.prompt_graphs.value:
        target.compile_prompts()
        if draft is not None:
            draft.compile_prompts()
    target.plan = plan
    set_pair_products(target, draft, run.products, device, run.batched, run.rows)  # (adds the plan's products)
    return target, draft


def _experts(target, experts: str) -> Decision[str | None]:
    """The experts part of a plan: `experts` checked against the target."""
    from .options import EXPERTS

    if experts not in EXPERTS:
        raise InputError(
            f"experts={experts!r} is not one of {', '.join(EXPERTS)}",
            code="E108",
            fix=f"pass one of {', '.join(EXPERTS)}",
        )
    if target.experts is None:
        if experts != "auto":
            raise InputError(
                f"--experts {experts} applies to mixture-of-experts targets (the DeepSeek family); this "
                f"target ({target.backend or type(target).__name__}) has none",
                code="E108",
                fix="leave out --experts for this target",
            )
        return Decision(None, "a dense target")
    return (
        Decision(None, "the target's default (auto)")
        if experts == "auto"
        else Decision(experts, "asked for (--experts)")
    )


def set_experts(target, experts: str = "auto") -> None:
    """load_pair's `experts` for a target loaded some other way (see load_pair); before the target compiles."""
    d = _experts(target, experts)
    if target.experts is not None:
        target.set_experts(d.value)


def auto_draft_quant(target, draft, device) -> str:
    """The fastest draft precision whose accept length stays within 1% of the stored draft's: int8 on a GPU for a
    bf16/fp16 pair (the draft step streams half the bytes; on the H200 the 8B-shape cycle over the step for (5,1,6)
    went 1.38 -> 1.28; the demo pair's accept length 3.191 with int8 against 3.186 as stored:
    docs/performance.md#d24); as stored elsewhere (a CPU draft is too small to
    gain). The output is the target's either way."""
    gpu = str(device).startswith("cuda")
    half = target.dtype in (torch.bfloat16, torch.float16)
    return "int8" if gpu and half and draft.quantizes else "none"


def set_draft_precision(target, draft, device, draft_quant: str | None = None) -> None:
    """load_pair's `draft_quant` for a draft loaded some other way (see load_pair): quantized as asked ('auto' or
    None: auto_draft_quant), what ran kept as `draft.precision`."""
    if draft_quant in (None, "auto"):
        draft_quant = auto_draft_quant(target, draft, device)
    if draft_quant != "none":
        draft.quantize(draft_quant)
    draft.precision = draft_quant if draft_quant != "none" else str(draft.dtype).replace("torch.", "")


def set_pair_products(
    target,
    draft,
    products: str = "auto",
    device="cpu",
    batched: bool = False,
    rows: int | None = None,
    why: str = "asked for (--products)",
) -> Choice:
    """load_pair's `products` for a target and draft loaded some other way (see load_pair). The kind that runs and
    why are kept on the target as `products_choice` (eaglekit.kernels.products.Choice): `--json`, the demo's table
    and the doctor report them (and the plan, where load_pair made one). `why`: the reason a named kind (not 'auto')
    is reported with."""
    from .kernels import hopper
    from .kernels.products import CPU_KINDS, Choice, check_kind, choose, pick_cpu

    if products not in PRODUCTS:
        raise InputError(
            f"products={products!r} is not one of {', '.join(PRODUCTS)}",
            code="E108",
            fix=f"pass one of {', '.join(PRODUCTS)}",
        )
    if products == "auto":
        choice = choose(target, device, batched, rows)
        if choice.kind == "pick":
            target.products_pick = pick_cpu(target)
            ms = ", ".join(f"{k} {a:.1f} + {b:.1f} ms" for k, (a, b) in target.products_pick["ms"].items())
            choice = Choice(target.products_pick["products"], f"timed here (a step + a 6-row verify): {ms}")
        if choice.kind == "hopper":
            try:
                target.set_products("hopper")
            except hopper.Unavailable as e:  # (a build that failed: the same guarantee through Triton kernels)
                choice = Choice("invariant", f"batch-invariant Triton kernels (hopper's failed to build: {e})")
        if choice.kind not in (None, "hopper"):
            target.set_products(choice.kind)
    else:
        refused = check_kind(products, target, device)
        if refused is not None:
            raise InputError(f"--products {products} cannot run here: {refused[0]}", fix=refused[1], code="E108")
        target.set_products(products)
        choice = Choice(products, why)
    target.products_choice = choice
    if target.plan is not None:
        target.plan.products = choice
    if choice.kind is None:  # F.linear; compiled layers: inductor does the products its own way
        return choice
    if draft is not None:
        # the draft's arithmetic never reaches the output: it keeps the fast products when the target is invariant
        draft.set_products(choice.kind if choice.kind in CPU_KINDS else None)
        # with the hopper kernels built for the target, the draft's decode attention takes theirs where its heads fit
        draft.set_attention("hopper" if choice.kind == "hopper" else "sdpa")
    return choice


def compiled(target) -> bool:
    """Whether the target's decode-time layers run compiled (load_pair's `compile`)."""
    from .kernels.products import compiled as _compiled

    return _compiled(target)
