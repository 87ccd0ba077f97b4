"""`eaglekit doctor`: every known wiring fault between a target and its EAGLE-3 draft, in one command, and how
sure it is.

1. Checks of the folder and of the pair (checks.py, eaglekit.draft.pair_problems), each a Finding with a
   stable code (reference.md section 7).
2. A short trace at the three capture points and a cycle profile of the configured wiring.
3. The probe (probe.py): teacher-forced acceptance under the configured wiring and its alternatives, compared
   pairwise over the same positions, enlarged until it can tell them apart or `time_budget` ends.
4. The feature fingerprint (eaglekit.train.fingerprint): a draft trained by eaglekit records the statistics of
   each capture slot's features; matched against every target layer they name the layer each slot was trained
   on, where acceptance cannot tell neighbours apart.
5. A verdict that says what was found and how sure: a fault, no fault, or "cannot tell these wirings apart on
   this probe".

`diagnose` returns a DoctorReport (report.py); `run_doctor` its JSON (what `eaglekit doctor --json` prints).
Exit status: 0 no fault found, 1 a fault found, 2 doctor could not run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..capture import CaptureSpec
from ..errors import EaglekitError, InputError
from .checks import folder_findings, recorded_fingerprint
from .probe import GENERIC_PROMPTS, Z, Probe, grow, paired_difference, probe_prompts, wirings
from .report import DoctorReport, Finding, WiringRow

# kept for callers that compare wirings by mean acceptance (the engine doctor's reference wiring)
MARGIN = 0.01
# position-1 acceptance under which a draft "accepts nothing": a trained draft of its target is far above it
DEAD = 0.05
# default time budget of a run: the clean demo pair settles in its first round, well inside it
TIME_BUDGET_S = 45.0

__all__ = ["DoctorReport", "Finding", "GENERIC_PROMPTS", "MARGIN", "TIME_BUDGET_S", "WiringRow", "Z", "diagnose",
           "paired_difference", "run_doctor", "wirings"]

_WHY = {
    "shifted -1": "this draft was trained one layer lower than configured: its ids mean 'input of layer i' (vLLM, "
                  "EAGLE reference) and were read as 'output of layer i' (SGLang config ids, SpecForge): an "
                  "off-by-one convention mix-up",
    "shifted +1": "this draft was trained one layer higher than configured: its ids mean 'output of layer i' (SGLang "
                  "config ids, SpecForge) and were read as 'input of layer i': an off-by-one convention mix-up",
    "default [1, n//2-1, n-4]": "this draft was trained on the default capture, not on the configured ids "
                                "(an engine that ignored its ids would match; its config does not)",
    "embedding instead of the low layer": "this draft was trained with the embedding as its low feature",
    "last layer only": "this draft was trained on the last layer's output",
}


def _probe_prompts(target_dir, prompt_file, n, vocab):
    """The first n probe prompts (the engine doctor decodes the same ones)."""
    prompts, source = probe_prompts(target_dir, prompt_file, vocab)
    return prompts[:n], source


def _fix(layers: list[int]) -> str:
    return (f"capture after_layers {layers} (= input of layers {[i + 1 for i in layers]}): eaglekit generate "
            f"--capture-layers {','.join(str(i) for i in layers)}, or set eagle_config.eagle_aux_hidden_state_layer_ids "
            f"to {layers} in the draft's config.json (eaglekit export writes each engine's convention)")


def _bar(progress: bool):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=None, desc="doctor", unit="step", file=sys.stderr, dynamic_ncols=True, leave=False)


def _stage(bar, text: str) -> None:
    if bar is not None:
        bar.set_description_str(f"doctor: {text}")
        bar.refresh()


def diagnose(target_dir, draft_dir, prompt_file=None, n_prompts: int = 12, max_new_tokens: int = 64,
             capture: CaptureSpec | None = None, backend="auto", device="cpu", dtype=None, shape=None,
             time_budget: float = TIME_BUDGET_S, progress: bool = False) -> DoctorReport:
    """`capture`: the wiring you serve with, if not the one the draft declares (the story's server added
    the embedding to the captures). `time_budget`: seconds after which the probe stops growing."""
    from ..decoding.engine import Decoder
    from ..decoding.tree import TreeShape
    from ..draft import load_draft, pair_problems
    from ..models import load_target
    from ..observe import trace
    from ..observe.metrics import aggregate
    from ..pair import set_pair_products
    from ..train.fingerprint import match, usable

    t0 = time.time()
    bar = _bar(progress)
    try:
        shape = shape or TreeShape(3, 1, 4)
        _stage(bar, "loading the target")
        target = load_target(target_dir, backend=backend, device=device, dtype=dtype)  # failure: exit 2
        H, n_layers = target.info.hidden_size, target.info.num_layers
        draft_dir = Path(draft_dir)
        if not (draft_dir / "config.json").is_file():
            raise InputError(f"no draft config.json in {draft_dir}", fix="pass an EAGLE-3 draft folder", code="E101")
        findings = folder_findings(draft_dir, n_layers)
        _stage(bar, "loading the draft")
        try:
            draft = load_draft(draft_dir, device=target.device, dtype=target.dtype, embed_weight=target.embed_weight())
        except EaglekitError as e:
            findings.append(Finding.of(e))
            return _conclude(findings, None, None, t0)
        draft.fuse()
        set_pair_products(target, draft, "auto", target.device)  # on a CPU: the faster products here (load_pair's)
        configured = capture or draft.config.capture or CaptureSpec.default(n_layers)
        _, problems = pair_problems(draft, target, configured)
        findings += [Finding.of(p) for p in problems]

        def fits(spec):
            return (spec is not None and spec.width(H) == draft.fc.in_features
                    and all(-1 <= i < n_layers for i in spec.after_layers))

        # the probe needs a wiring of the width the fc was trained on; a refused one is replaced by the draft's own
        base = next((s for s in (configured, draft.config.capture, CaptureSpec.default(n_layers)) if fits(s)), None)
        if base is not None and base != configured:
            findings.append(Finding("I304", "info", f"the configured wiring cannot run, so the probe starts from "
                                    f"after_layers {list(base.after_layers)}"))
        prompts, source = probe_prompts(target_dir, prompt_file, target.info.vocab_size)
        ctx = _Context(source=source, label="configured wiring" if base == configured else "draft's declared wiring")
        if base is None:
            return _conclude(findings, None, ctx, t0)
        _stage(bar, "trace and profile")
        sink: list = []
        trace.configure(enabled=True, steps=2, sink=sink, stream=open("/dev/null", "w"))
        try:
            dec = Decoder(target, draft, shape, capture=base, allow_other_target=True, profile=True)
            ctx.profile = {k: round(v * 1e3, 3) for k, v in dec.generate(prompts[0], 16).metrics.phases.items()}
        except EaglekitError as e:
            findings.append(Finding.of(e))
            return _conclude(findings, None, ctx, t0)
        finally:
            trace.configure(enabled=False)
        ctx.trace = [{k: r.get(k) for k in ("cycle", "point", "shape", "dtype", "layers", "mean", "std", "absmax",
                                            "nan", "inf")} for r in sink
                     if r["point"] in ("target.capture", "draft.input.features", "draft.input.fc", "draft.concat")]

        probe = Probe(target, draft, base, shape.steps)
        recorded = recorded_fingerprint(draft_dir)
        fp_ok = usable(recorded) and len(recorded["slots"]) == base.num_captures

        def fingerprint():
            return match(recorded, probe.sketch, list(range(-1, n_layers))) if fp_ok else None

        def settled(p: Probe) -> bool:
            _stage(bar, f"probe: {p.positions} positions")
            rows = p.rows()
            ran = [r for r in rows if r.per_position]
            if max(r.per_position[0] for r in ran) < DEAD:
                return True
            if all(r.decided for r in ran if r.diff is not None):
                return True
            fp = fingerprint()
            return fp is not None and all(m["confident"] for m in fp)

        _stage(bar, "probe")
        ctx.rounds = grow(probe, prompts, n_prompts, max_new_tokens, time_budget, t0, settled, bar)
        ctx.rows = probe.rows()
        ctx.fingerprint = fingerprint()
        ctx.positions = probe.positions
        _stage(bar, "decoding")
        dec = Decoder(target, draft, shape, capture=base, allow_other_target=True)
        conf = next(r for r in ctx.rows if r.wiring == "configured")
        conf.decoded_accept_length = round(aggregate([dec.generate(p, max_new_tokens).metrics
                                                      for p in prompts[:min(3, n_prompts)]]).accept_length, 4)
        return _conclude(findings, base, ctx, t0)
    finally:
        if bar is not None:
            bar.close()


class _Context:
    """What the probe stage hands to the verdict."""

    def __init__(self, source=None, label="configured wiring"):
        self.source, self.label = source, label
        self.rows: list[WiringRow] = []
        self.trace: list[dict] = []
        self.profile: dict = {}
        self.fingerprint: list[dict] | None = None
        self.rounds: list[dict] = []
        self.positions = 0


def _conclude(findings: list[Finding], base: CaptureSpec | None, ctx: "_Context | None", t0: float) -> DoctorReport:
    ctx = ctx or _Context()
    errors = [f for f in findings if f.severity == "error"]
    ran = [r for r in ctx.rows if r.per_position]
    conclusive = True
    if base is not None and ran:
        probe_text, extra, conclusive = _probe_verdict(ran, base, ctx)
        findings += extra
    elif errors:
        probe_text = "the pair cannot run as configured"
    else:
        probe_text = "no probe could run"
    if errors:
        text = "; ".join(f"[{f.code}] {f.message}" for f in errors) + ". Probe: " + probe_text
    else:
        text = probe_text
    fault = any(f.severity == "error" for f in findings)
    return DoctorReport(text, fault, conclusive, findings, ctx.rows, ctx.source, ctx.trace, ctx.profile,
                        ctx.fingerprint, ctx.rounds, round(time.time() - t0, 1))


def _pm(r: WiringRow) -> str:
    return f"{r.diff:+.3f} ± {r.se:.3f}"


def _probe_verdict(ran: list[WiringRow], base: CaptureSpec, ctx: "_Context") -> tuple[str, list[Finding], bool]:
    """-> (verdict text, findings of the probe, conclusive)."""
    conf = next(r for r in ran if r.wiring == "configured")
    layers = list(base.after_layers)
    N = ctx.positions
    p1 = conf.per_position[0]
    al = conf.decoded_accept_length if conf.decoded_accept_length is not None else conf.accept_length
    where = f"{N} positions, {len(ctx.rounds)} round{'s' if len(ctx.rounds) != 1 else ''}"
    out: list[Finding] = []
    best_p1 = max(r.per_position[0] for r in ran)
    if best_p1 < DEAD:
        msg = (f"the draft accepts almost nothing under every wiring tried (best {best_p1:.1%} at position 1 over "
               f"{where}; a trained draft of its target accepts tens of percent): it is untrained, or it was made for "
               f"another target")
        out.append(Finding("E282", "error", msg, "train the draft for this target (eaglekit train), or pass the draft "
                           "made for it", {"best_position1": best_p1, "positions": N}))
        return msg, out, True
    others = [r for r in ran if r.diff is not None]
    better = sorted((r for r in others if r.decided and r.diff < 0), key=lambda r: r.diff)
    undecided = [r for r in others if not r.decided]
    fp = ctx.fingerprint
    fp_confident = fp is not None and all(m["confident"] for m in fp)
    fp_layers = [m["layer"] for m in fp] if fp else None
    texts = []
    if better:
        b = better[0]
        msg = (f"the {ctx.label} accepts {p1:.0%} at position 1 (accept length {al:.2f}); after_layers "
               f"{b.after_layers} ({b.wiring}) accepts {b.per_position[0]:.0%} (accept length {b.accept_length:.2f}), "
               f"the {ctx.label} minus it {_pm(b)} accepted tokens per position (z {b.z:.1f}, {where}): "
               f"{_WHY.get(b.wiring, 'this draft was trained with another wiring')}")
        out.append(Finding("E290", "error", msg, _fix(b.after_layers),
                           {"configured": layers, "best": b.after_layers, "diff": b.diff, "se": b.se, "z": b.z,
                            "positions": N}))
        texts.append(f"{msg}; fix: {_fix(b.after_layers)}")
    if fp_confident and fp_layers != layers:
        name = next((r.wiring for r in ran if r.after_layers == fp_layers), None)
        msg = (f"the feature fingerprint recorded at training names after_layers {fp_layers}"
               f"{f' ({name})' if name else ''} for the draft's slots; the {ctx.label} is after_layers {layers}")
        out.append(Finding("E281", "error", msg, _fix(fp_layers), {"slots": fp}))
        if not better:
            texts.append(f"{msg} (acceptance alone "
                         f"{'cannot tell them apart on this probe' if undecided else 'agrees'}); fix: {_fix(fp_layers)}")
    if texts:
        return "; ".join(texts), out, True
    if fp:
        out.append(Finding("I306", "info", f"the feature fingerprint names after_layers {fp_layers} for the draft's "
                           f"slots" + ("" if fp_confident else " (not every slot with a clear margin)"), None,
                           {"slots": fp}))
    head = (f"the {ctx.label} (after_layers {layers}) accepts {p1:.0%} at position 1 (teacher-forced), accept length "
            f"{al:.2f}")
    if not undecided:
        worst = min(others, key=lambda r: r.z) if others else None
        lead = (f"; it beats each of the {len(others)} alternatives on the same positions, the closest "
                f"({worst.wiring}, after_layers {worst.after_layers}) by {_pm(worst)} accepted tokens per position "
                f"(z {worst.z:.1f}, {where})") if worst else ""
        fp_note = "; the feature fingerprint names the same layers" if fp_confident else ""
        return f"{head}{lead}{fp_note}; no wiring fault found", out, True
    ties = ", ".join(f"{r.wiring} (after_layers {r.after_layers}: {_pm(r)}, z {r.z:.1f})" for r in undecided)
    if fp_confident:
        return (f"{head}; acceptance cannot tell it apart from {ties} on this probe ({where}), but the feature "
                f"fingerprint names after_layers {fp_layers} for the draft's slots, the configured ones; no wiring "
                f"fault found"), out, True
    msg = (f"cannot tell these wirings apart on this probe: the {ctx.label} (after_layers {layers}) minus {ties}, in "
           f"accepted tokens per position over {where} (|z| < {Z:.0f}); the probe stopped at its time budget")
    out.append(Finding("W280", "warning", msg, "give the probe more time (--time-budget) or more prompts "
                       "(--prompt-file); a draft trained by eaglekit records a feature fingerprint that settles it",
                       {"undecided": [r.wiring for r in undecided], "positions": N}))
    return f"{head}; {msg}", out, False


def run_doctor(target_dir, draft_dir, prompt_file=None, n_prompts: int = 12, max_new_tokens: int = 64,
               capture: CaptureSpec | None = None, backend="auto", device="cpu", dtype=None, shape=None,
               time_budget: float = TIME_BUDGET_S, progress: bool = False) -> dict:
    """The report as JSON (the shape `eaglekit doctor --json` prints)."""
    return diagnose(target_dir, draft_dir, prompt_file, n_prompts, max_new_tokens, capture, backend, device, dtype,
                    shape, time_budget, progress).to_json()
