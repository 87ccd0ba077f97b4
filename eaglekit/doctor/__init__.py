"""`eaglekit doctor`: every known wiring fault between a target and its EAGLE-3 draft, in one command, and how
sure it is.

1. Checks of the folder and of the pair (checks.py, eaglekit.draft.pair_problems), each a Finding with a
   stable code (the fault classes of docs/faults.md).
2. A short trace at the three capture points and a cycle profile of the configured wiring.
3. The training record (recorded.py, eaglekit.train.record), where the folder has one, before the probe (a record
   that settles the wiring shortens the probe to one round): the config's function fields, the d2t, the tokenizer
   and chat template against what was recorded, and the draft measured again on the recorded sample, its
   acceptance compared with the recorded one within a confidence interval.
4. The probe (probe.py): teacher-forced acceptance under the configured wiring and its alternatives, compared
   pairwise over the same positions, enlarged until it can tell them apart or `time_budget` ends.
5. The feature fingerprint (eaglekit.train.fingerprint): a draft trained by eaglekit records the statistics of
   each capture slot's features; matched against every target layer over the probe's text they name a layer per
   slot. That naming is evidence in the report (I306), never a verdict: the statistics move with the text as much
   as from one layer to the next (the demo draft's own target names after_layers [1, 5, 7] for [1, 5, 8] over the
   built-in prompts: docs/performance.md#d40), so acceptance decides.
6. Which target the draft was made for (identity.py): the target weights' fingerprint the draft recorded when
   it was trained or exported, else a reference acceptance given by the user (the features' statistics name layers,
   not targets: identity.py); and the vocabulary mapping on its own evidence (vocab.py).
7. A verdict of three: a fault (with its cause and the fix in the folder's own convention, fixes.py); clean,
   only when the configured wiring is shown best with the stated confidence and the target is shown to be the
   draft's; else cannot tell, with what would decide it.

`diagnose` returns a DoctorReport (report.py); `run_doctor` its JSON (what `eaglekit doctor --json` prints).
Exit status: 0 clean, 1 a fault found, 2 doctor could not run, 3 cannot tell (report.EXIT).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..capture import CaptureSpec
from ..errors import EaglekitError, InputError
from ..options import DOCTOR_TIME_BUDGET_S, DoctorOptions, ModelOptions
from .checks import capture_width_finding, folder_findings, recorded_fingerprint
from .fixes import ids_fix, unsorted_note
from .identity import DECIDE_TARGET, Identity, reference_check, weights_check
from .probe import GENERIC_PROMPTS, Probe, Z, grow, paired_difference, probe_prompts, wirings
from .recorded import REC, acceptance_findings, products_of, settles_wiring, static_findings
from .recorded import SOURCE as RECORD_SOURCE
from .report import EXIT, DoctorReport, Finding, WiringRow, status_of
from .vocab import mapping_is_wrong, vocab_evidence

if TYPE_CHECKING:
    from ..draft.checkpoint import FolderFormat
    from ..draft.model import Eagle3Draft
    from ..models.base import Target

# kept for callers that compare wirings by mean acceptance (the engine doctor's reference wiring)
MARGIN = 0.01
# position-1 acceptance under which a draft "accepts nothing": a trained draft of its target is far above it
DEAD = 0.05
# the default time budget of a run (options.DOCTOR_TIME_BUDGET_S), under the name the tests and benchmarks import
TIME_BUDGET_S = DOCTOR_TIME_BUDGET_S

__all__ = [
    "EXIT",
    "GENERIC_PROMPTS",
    "MARGIN",
    "TIME_BUDGET_S",
    "DoctorReport",
    "Finding",
    "WiringRow",
    "Z",
    "diagnose",
    "paired_difference",
    "run_doctor",
    "status_of",
    "wirings",
]

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
    "ascending order": "this draft was trained on the same layers in ascending order",
}
# the codes that say the vocabulary mapping is wrong: acceptance near zero is then their effect, not a verdict of
# its own on the draft
_VOCAB_FAULTS = ("E207", "E210", "E212", "E217", "E222")


def _probe_prompts(target_dir, prompt_file, n, vocab):
    """The first n probe prompts (the engine doctor decodes the same ones)."""
    prompts, source = probe_prompts(target_dir, prompt_file, vocab)
    return prompts[:n], source


# the folder format of the draft being diagnosed, for the fixes (set by _load)
_FORMAT: dict[str, FolderFormat | None] = {}


def _fix(layers: list[int]) -> str:
    return ids_fix(layers, _FORMAT.get("fmt"))


def _bar(progress: bool):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=None, desc="doctor", unit="step", file=sys.stderr, dynamic_ncols=True, leave=False)


def _stage(bar, text: str) -> None:
    if bar is not None:
        bar.set_description_str(f"doctor: {text}")
        bar.refresh()


def diagnose(model: ModelOptions, opts: DoctorOptions | None = None, shape=None) -> DoctorReport:
    """`model`: the pair (target, draft) and how it loads (backend, device, dtype); its `capture_layers`: the wiring
    you serve with, if not the one the draft declares (the story's server added the embedding to the captures). Its
    other fields are not read: the doctor chooses the products itself. `opts`: the probe's prompts and their length,
    `time_budget` (seconds after which the probe stops growing), `reference_acceptance` (the configured wiring's
    position-1 acceptance measured on the draft's own target, the doctor's teacher-forced figure there: for a draft
    that records no target, what tells its target) and the progress bar; None: DoctorOptions()."""
    from ..decoding.tree import TreeShape

    opts = opts or DoctorOptions()
    device = model.device_name  # a bad --device is refused before the bar starts
    t0 = time.time()
    bar = _bar(opts.progress)
    try:
        shape = shape or TreeShape(3, 1, 4)
        run = _load(model, device, bar)
        if run.draft is None:  # the loader refused the draft: the findings say why
            return _conclude(run.findings, None, None, t0, run.pair)
        identity, configured = _check_pair(run, model.capture)
        base = _probe_base(run, configured)
        prompts, source = probe_prompts(run.target_dir, opts.prompt_file, run.target.info.vocab_size)
        ctx = _Context(source=source, label="configured wiring" if base == configured else "draft's declared wiring")
        ctx.identity, ctx.reference = identity, opts.reference_acceptance
        ctx.vocab_recorded = _vocab_recorded(run)
        ctx.budget = opts.time_budget
        if base is None:
            return _conclude(run.findings, None, ctx, t0, run.pair)
        _stage(bar, "trace and profile")
        if not _trace_and_profile(run, base, shape, prompts[0], ctx):
            return _conclude(run.findings, None, ctx, t0, run.pair)
        if run.record is not None:  # first: a record that settles the wiring shortens the probe to one round
            _stage(bar, "the training record's sample")
            run.findings += acceptance_findings(
                run.record, run.target, run.loaded_draft, base, run.target_dir, run.findings, fix_ids=_fix
            )
            ctx.wiring_by_record = settles_wiring(run.findings)
        _probe(run, base, shape, prompts, opts, ctx, t0, bar)
        _stage(bar, "decoding")
        _decode(run, base, shape, prompts, opts, ctx)
        return _conclude(run.findings, base, ctx, t0, run.pair)
    finally:
        if bar is not None:
            bar.close()


@dataclass
class _Loaded:
    """The pair as diagnose loaded it, and the findings so far: one list, each stage adds to it."""

    target: Target
    target_dir: str | Path  # a .gguf target: the folder made from it
    draft_dir: Path
    findings: list[Finding]
    pair: dict[str, object]  # what ran, for the report's pair section
    draft: Eagle3Draft | None = None  # None: the loader refused the draft
    record: dict | None = None  # the draft's training record (recorded.py), where the folder has one

    @property
    def loaded_draft(self) -> Eagle3Draft:
        assert self.draft is not None  # every stage after _load runs on a draft that loaded
        return self.draft


def _load(model: ModelOptions, device: str, bar) -> _Loaded:
    """The target, the checks of the draft's folder, then the draft. A draft the loader refuses is a finding (and
    `draft` None): for a capture whose width the fc refuses, the capture is the cause and the refusal its symptom,
    kept as evidence."""
    from ..draft import load_draft
    from ..models import load_target

    assert model.target is not None and model.draft is not None  # --target and --draft are required
    _stage(bar, "loading the target")
    target = load_target(model.target, backend=model.backend, device=device, dtype=model.dtype_name)  # failure: exit 2
    target_dir = target.folder or model.target  # a .gguf: the folder made from it
    # what ran, for the report's pair section: the products are chosen once the draft has loaded
    pair: dict[str, object] = {
        "target_backend": target.backend,
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "products": None,
    }
    draft_dir = Path(model.draft)
    if not (draft_dir / "config.json").is_file():
        raise InputError(f"no draft config.json in {draft_dir}", fix="pass an EAGLE-3 draft folder", code="E101")
    H, n_layers = target.info.hidden_size, target.info.num_layers
    run = _Loaded(target, target_dir, draft_dir, folder_findings(draft_dir, n_layers), pair)
    _FORMAT.clear()
    _stage(bar, "loading the draft")
    try:
        run.draft = load_draft(draft_dir, device=target.device, dtype=target.dtype, embed_weight=target.embed_weight())
    except EaglekitError as e:
        width = capture_width_finding(draft_dir, H, n_layers) if e.code == "E107" else None
        if width is not None:
            width.evidence["loader"] = f"[{e.code}] {e.message}"
            run.findings.append(width)
        else:
            run.findings.append(Finding.of(e))
        return run
    _FORMAT["fmt"] = run.draft.source_format
    return run


def _check_pair(run: _Loaded, capture: CaptureSpec | None) -> tuple[Identity, CaptureSpec]:
    """The static findings of a loaded pair: which target the draft records, its length against the target's, the
    pair's contract under the configured wiring, and the training record's fields; the products chosen on the way.
    -> (the draft's target as far as it records it, the configured wiring)."""
    from ..draft import pair_problems
    from ..pair import set_pair_products
    from ..train.record import read_record

    target, draft, findings = run.target, run.loaded_draft, run.findings
    run.record = read_record(run.draft_dir)  # what the draft accepted at training, and with what (recorded.py)
    identity = weights_check(draft.config, run.target_dir, run.record)
    findings += identity.findings
    if draft.config.max_position_embeddings < target.info.max_position_embeddings:
        findings.append(
            Finding(
                "W283",
                "warning",
                f"the draft's max_position_embeddings is {draft.config.max_position_embeddings}, "
                f"the target's {target.info.max_position_embeddings}: past the draft's length its rope positions are "
                f"ones it never saw, and acceptance collapses on long inputs",
                f"set max_position_embeddings to {target.info.max_position_embeddings} in the draft's config.json "
                f"(the rope settings of the target), or keep inputs below {draft.config.max_position_embeddings}",
            )
        )
    draft.fuse()
    kind = products_of(run.record, target)  # the record's, so its runs come back bit for bit; else load_pair's
    choice = set_pair_products(
        target, draft, kind, target.device, why=f"the training record's ({REC} was measured with {kind})"
    )
    run.pair["products"] = {"kind": choice.kind, "reason": choice.reason}
    configured = capture or draft.config.capture or CaptureSpec.default(target.info.num_layers)
    _, problems = pair_problems(draft, target, configured)
    findings += [Finding.of(p) for p in problems]
    if run.record is not None:
        findings += static_findings(run.record, run.draft_dir, draft, run.target_dir, findings)
    return identity, configured


def _probe_base(run: _Loaded, configured: CaptureSpec) -> CaptureSpec | None:
    """The wiring the probe starts from: the probe needs one of the width the fc was trained on, so a refused
    configured wiring is replaced by the draft's own, else the default (I304 says so). None: none of them fits."""
    draft, H, n_layers = run.loaded_draft, run.target.info.hidden_size, run.target.info.num_layers

    def fits(spec):
        return (
            spec is not None
            and spec.width(H) == draft.fc.in_features
            and all(-1 <= i < n_layers for i in spec.after_layers)
        )

    base = next((s for s in (configured, draft.config.capture, CaptureSpec.default(n_layers)) if fits(s)), None)
    if base is not None and base != configured:
        run.findings.append(
            Finding(
                "I304",
                "info",
                f"the configured wiring cannot run, so the probe starts from after_layers {list(base.after_layers)}",
            )
        )
    return base


def _vocab_recorded(run: _Loaded) -> bool:
    """Whether the draft's d2t is the one recorded with it (its config's hash, or the training record's)."""
    from ..draft.checkpoint import vocab_map_sha

    draft = run.loaded_draft
    return bool(draft.config.vocab_map_sha) or bool(
        run.record and run.record.get("d2t_sha256") == vocab_map_sha(draft.d2t)
    )


def _trace_and_profile(run: _Loaded, base: CaptureSpec, shape, prompt: list[int], ctx: _Context) -> bool:
    """`prompt` decoded under `base` for 16 tokens, profiled, its first two cycles traced: the phases (ms) and the
    trace rows at the capture points into ctx. -> False where the decoder refuses the pair (the refusal is then a
    finding)."""
    from ..decoding.decoder import Decoder
    from ..observe import trace

    sink: list = []
    trace.configure(enabled=True, steps=2, sink=sink, stream=open("/dev/null", "w"))
    try:
        dec = Decoder(run.target, run.loaded_draft, shape, capture=base, allow_other_target=True, profile=True)
        ctx.profile = {k: round(v * 1e3, 3) for k, v in dec.generate(prompt, 16).metrics.phases.items()}
    except EaglekitError as e:
        run.findings.append(Finding.of(e))
        return False
    finally:
        trace.configure(enabled=False)
    ctx.trace = [
        {k: r.get(k) for k in ("cycle", "point", "shape", "dtype", "layers", "mean", "std", "absmax", "nan", "inf")}
        for r in sink
        if r["point"] in ("target.capture", "draft.input.features", "draft.input.fc", "draft.concat")
    ]
    return True


def _probe(
    run: _Loaded, base: CaptureSpec, shape, prompts: list[list[int]], opts: DoctorOptions, ctx: _Context, t0: float, bar
) -> None:
    """The probe under `base` and its alternatives, grown until every comparison is decided, the draft is shown to
    accept nothing, or the time budget (counted from t0) ends; its rows, the fingerprint's naming of the layers and
    the vocabulary evidence into ctx."""
    from ..train.fingerprint import match, usable

    n_layers = run.target.info.num_layers
    probe = Probe(run.target, run.loaded_draft, base, shape.steps)
    recorded = recorded_fingerprint(run.draft_dir)
    fp_ok = usable(recorded) and len(recorded["slots"]) == base.num_captures

    def settled(p: Probe) -> bool:
        _stage(bar, f"probe: {p.positions} positions")
        if ctx.wiring_by_record:
            return True
        ran = [r for r in p.rows() if r.per_position]
        if _dead(ran):
            # a draft that accepts nothing: untrained, another target's, or a d2t pointing its rows elsewhere; the
            # last shows on the vocabulary evidence alone, so without a recorded d2t the probe grows until it has
            # enough (vocab.MIN_IDS ids) or the budget ends
            if ctx.vocab_recorded:
                return True
            ev = vocab_evidence(p.vocab_pairs, p.hot)
            return ev is None or ev.get("wrong") is not None
        return all(r.decided for r in ran if r.diff is not None)

    _stage(bar, "probe")
    t_probe = time.time()
    ctx.rounds = grow(probe, prompts, opts.prompts, opts.max_new_tokens, opts.time_budget, t0, settled, bar)
    ctx.probe_seconds = time.time() - t_probe
    ctx.rows = probe.rows()
    ctx.fingerprint = match(recorded, probe.sketch, list(range(-1, n_layers))) if fp_ok else None
    ctx.positions = probe.positions
    ctx.vocab = vocab_evidence(probe.vocab_pairs, probe.hot)


def _decode(
    run: _Loaded, base: CaptureSpec, shape, prompts: list[list[int]], opts: DoctorOptions, ctx: _Context
) -> None:
    """The configured row's accept length decoded (not teacher-forced) over the first three prompts."""
    from ..decoding.decoder import Decoder
    from ..observe.metrics import aggregate, rounded

    conf = next(r for r in ctx.rows if r.wiring == "configured")
    if _dead([r for r in ctx.rows if r.per_position]):
        return  # a draft that accepts nothing decodes at accept length ~1, a cycle a token: the verdict needs no figure
    dec = Decoder(run.target, run.loaded_draft, shape, capture=base, allow_other_target=True)
    # None where no verify ran (--max-new-tokens 0 or 1): the verdict reads the teacher-forced figure then
    conf.decoded_accept_length = rounded(
        aggregate(
            [dec.generate(p, opts.max_new_tokens).metrics for p in prompts[: min(3, opts.prompts)]]
        ).accept_length,
        4,
    )


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
        self.identity = None  # identity.Identity: which target the draft was made for, and how sure
        self.reference: float | None = None
        self.vocab: dict | None = None
        self.vocab_recorded = False
        self.probe_seconds = 0.0
        self.budget = TIME_BUDGET_S
        self.wiring_by_record = False  # the training record's sample settled the wiring (recorded.settles_wiring)


def _conclude(
    findings: list[Finding], base: CaptureSpec | None, ctx: _Context | None, t0: float, pair: dict | None = None
) -> DoctorReport:
    ctx = ctx or _Context()
    unique: dict[tuple, Finding] = {}  # a refusal met twice (the pair check, then the decoder's) is one finding
    for f in findings:
        unique.setdefault((f.code, f.message), f)
    findings = list(unique.values())
    ran = [r for r in ctx.rows if r.per_position]
    decide: list[str] = []
    vocab_known = _vocab_findings(findings, ctx, bool(ran), decide)
    shown = False
    if base is not None and ran:
        probe_text, extra, shown, more = _probe_verdict(ran, base, ctx, findings)
        findings += extra
        decide += more
        shown = shown or ctx.wiring_by_record
        target_known = _identity_findings(findings, ctx, ran, decide)
    else:
        target_known = True  # nothing ran: the verdict is the refusal (a fault) or "no probe could run"
        errors = [f for f in findings if f.severity == "error"]
        probe_text = "the pair cannot run as configured" if errors else "no probe could run"
        if not errors:
            decide.append("a pair that runs: see the findings")
    errors = [f for f in findings if f.severity == "error"]
    fault = bool(errors)
    conclusive = fault or (shown and target_known and vocab_known)
    if errors:
        # the probe's own E290 / E281 are in probe_text; the training record's E290 is not
        text = "; ".join(
            f"[{f.code}] {f.message}" + (f" (fix: {f.fix})" if f.fix and not _in_probe_text(f) else "")
            for f in errors
            if not _in_probe_text(f)
        )
        text = (text + ". Probe: " if text else "") + probe_text
    elif not conclusive:
        why = [f.message for f in findings if f.code in ("W281", "W285")]
        text = "cannot tell: " + "; ".join([probe_text] + why) + ". What would decide it: " + "; ".join(decide)
    else:
        text = probe_text
    return DoctorReport(
        text,
        fault,
        conclusive,
        findings,
        ctx.rows,
        ctx.source,
        ctx.trace,
        ctx.profile,
        ctx.fingerprint,
        ctx.rounds,
        round(time.time() - t0, 1),
        [] if conclusive else decide,
        pair or {},
    )


def _vocab_findings(findings: list[Finding], ctx: _Context, ran: bool, decide: list[str]) -> bool:
    """The d2t on its own evidence; -> whether the mapping is known right (or already a fault)."""
    if any(f.code in _VOCAB_FAULTS for f in findings) or ctx.vocab_recorded:
        return True  # a recorded hash that matched settles it (pair_problems reports E217 where it does not)
    ev = ctx.vocab
    if mapping_is_wrong(ev):
        ex = "; ".join(
            f"draft id {e['draft_id']}: the target chose {e['target_chose']} at {e['times']} of its "
            f"{e['proposed']} proposals, d2t maps it to {e['d2t_maps_to']}"
            for e in ev["examples"]
        )
        findings.append(
            Finding(
                "E222",
                "error",
                f"the vocabulary mapping (d2t) is not the one the draft's lm_head was trained with: of "
                f"the {ev['ids']} draft ids with a usual token on the probe (the target chose one token at 3 or more "
                f"of the id's proposals, and at half of them), {ev['wrong']:.0%} stand for "
                f"another target token than d2t maps them to (the target chose the mapped token at "
                f"{ev['share_mapped']:.0%} of those positions, the id's usual token at {ev['share_usual']:.0%}; {ex})",
                "restore the d2t saved with the draft (model.safetensors, offsets: target id = i + d2t[i]); never "
                "regenerate the vocabulary mapping of a trained draft",
                ev,
            )
        )
        return True
    if not ran:
        return True
    if ev is None or ev.get("wrong") is None:
        findings.append(
            Finding(
                "W285",
                "warning",
                f"the draft records no d2t hash and the probe proposed too few "
                f"distinct tokens ({(ev or {}).get('ids', 0)} ids at least 3 times) to check the "
                f"vocabulary mapping on its own evidence",
                None,
                ev or {},
            )
        )
        decide.append(
            f"for the d2t: a longer probe (--time-budget {int(2 * max(ctx.budget, 30))}) or a recorded "
            f"d2t hash (eaglekit export writes one)"
        )
        return False
    return True


def _identity_findings(findings: list[Finding], ctx: _Context, ran: list[WiringRow], decide: list[str]) -> bool:
    """Which target the draft was made for; -> whether the evidence settles it."""
    ident = ctx.identity
    if ident is not None and ident.decided:
        findings += [f for f in ident.findings if f not in findings]
        return True
    if ctx.reference is not None:
        conf = next(r for r in ran if r.wiring == "configured")
        findings.append(reference_check(_position1(conf), conf.positions or ctx.positions, ctx.reference))
        return True
    if any(f.code in ("E208", "E215", "E282") for f in findings):
        return True
    decide.append(DECIDE_TARGET)
    if ident is not None and ident.findings:  # a weights record with no safetensors to compare it with (W281)
        findings += [f for f in ident.findings if f not in findings]
        return False
    features = (
        " (the feature statistics it recorded name the layers it was trained on, not its target: they vary "
        "more with the probe text than with the target's weights)"
        if ctx.fingerprint is not None
        else ""
    )
    findings.append(
        Finding(
            "W281",
            "warning",
            "the draft records no fingerprint of its target's weights"
            + features
            + ": whether this is that target, or a same-shape one with other weights, could not be "
            "checked",
            DECIDE_TARGET,
        )
    )
    return False


def _dead(ran: list[WiringRow]) -> bool:
    """Whether the draft accepts (nearly) nothing under every wiring that ran."""
    return bool(ran) and max(_position1(r) for r in ran) < DEAD


def _in_probe_text(f: Finding) -> bool:
    return f.code in ("E290", "E281") and f.evidence.get("source") != RECORD_SOURCE


def _position1(r: WiringRow) -> float:
    """Position-1 acceptance of a row that ran (every such row has its per_position)."""
    assert r.per_position is not None
    return r.per_position[0]


def _diff(r: WiringRow) -> float:
    """`diff` of a row compared with the configured one (such a row has diff, se and z)."""
    assert r.diff is not None
    return r.diff


def _z(r: WiringRow) -> float:
    """`z` of a row compared with the configured one."""
    assert r.z is not None
    return r.z


def _pm(r: WiringRow) -> str:
    return f"{r.diff:+.3f} ± {r.se:.3f}"


def _longer(ctx: _Context, rows: list[WiringRow]) -> str:
    """How long a probe would settle the undecided comparisons: positions grow as (Z / |z|)^2."""
    zmin = min(abs(r.z or 0.0) for r in rows)
    if zmin < 0.5:
        return (
            "acceptance may never tell them apart (|z| < 0.5: the draft accepts about the same under both, so "
            "either wiring serves it about as fast)"
        )
    need = ctx.positions * (Z / zmin) ** 2
    secs = ctx.probe_seconds * need / max(ctx.positions, 1) + 15
    return (
        f"a longer probe: about {int(need)} positions (now {ctx.positions}), about {int(secs)} s here "
        f"(--time-budget {int(secs) + 10}, or more prompts with --prompt-file)"
    )


# the probe's verdict: (its text, the findings it adds, the configured wiring shown right or a fault found, what would
# decide it)
_Verdict = tuple[str, list[Finding], bool, list[str]]


@dataclass
class _Configured:
    """The configured wiring's figures, as each verdict states them."""

    layers: list[int]  # its after_layers
    p1: float  # position-1 acceptance, teacher-forced
    al: float | None  # accept length: decoded where a decode ran, else teacher-forced
    positions: int
    where: str  # what the figures were measured over: positions and rounds


def _probe_verdict(ran: list[WiringRow], base: CaptureSpec, ctx: _Context, findings: list[Finding]) -> _Verdict:
    """-> (verdict text, findings of the probe, the configured wiring shown right or a fault found, decide)."""
    conf = next(r for r in ran if r.wiring == "configured")
    N = ctx.positions
    al = conf.decoded_accept_length if conf.decoded_accept_length is not None else conf.accept_length
    c = _Configured(
        list(base.after_layers),
        _position1(conf),
        al,
        N,
        f"{N} positions, {len(ctx.rounds)} round{'s' if len(ctx.rounds) != 1 else ''}",
    )
    best_p1 = max(_position1(r) for r in ran)
    if best_p1 < DEAD:
        return _dead_verdict(best_p1, c, findings)
    others = [r for r in ran if r.diff is not None]
    better = sorted((r for r in others if r.decided and _diff(r) < 0), key=_diff)
    if better:
        return _wiring_fault(better[0], c, ctx.label)
    out = _fingerprint_note(ctx)
    head = (
        f"the {ctx.label} (after_layers {c.layers}) accepts {c.p1:.0%} at position 1 (teacher-forced), accept "
        f"length {c.al:.2f}"
    )
    if any(f.code == "E290" and f.evidence.get("source") == RECORD_SOURCE for f in findings):
        return f"{head}; the training record's sample names the wiring the draft was trained on (above)", out, True, []
    undecided = [r for r in others if not r.decided]
    if not undecided:
        return f"{head}{_closest(others, c)}; no wiring fault found", out, True, []
    text, extra, shown, decide = _undecided_verdict(undecided, c, ctx, findings)
    return f"{head}; {text}", out + extra, shown, decide


def _dead_verdict(best_p1: float, c: _Configured, findings: list[Finding]) -> _Verdict:
    """The draft accepts (nearly) nothing under every wiring tried: the effect of a vocabulary mapping fault where
    one was found, else a fault of its own (E282: an untrained draft, or another target's)."""
    vocab = [f for f in findings if f.code in _VOCAB_FAULTS]
    if vocab:
        msg = (
            f"the draft accepts almost nothing under every wiring tried (best {best_p1:.1%} at position 1 over "
            f"{c.where}): the effect of the vocabulary mapping fault [{vocab[0].code}]"
        )
        return msg, [], True, []
    msg = (
        f"the draft accepts almost nothing under every wiring tried (best {best_p1:.1%} at position 1 over "
        f"{c.where}; a trained draft of its target accepts tens of percent): it is untrained, or it was made for "
        f"another target"
    )
    return (
        msg,
        [
            Finding(
                "E282",
                "error",
                msg,
                "train the draft for this target (eaglekit train), or pass the draft made for it",
                {"best_position1": best_p1, "positions": c.positions},
            )
        ],
        True,
        [],
    )


def _wiring_fault(b: WiringRow, c: _Configured, label: str) -> _Verdict:
    """The wiring fault (E290) where the probe shows `b`, the best of the alternatives it told apart, above the
    configured wiring."""
    note = unsorted_note(c.layers) if b.wiring == "ascending order" else None
    if note is None:
        note = _shift_note(c.layers, b.after_layers)
    msg = (
        f"the {label} accepts {c.p1:.0%} at position 1 (accept length {c.al:.2f}); after_layers "
        f"{b.after_layers} ({b.wiring}) accepts {_position1(b):.0%} (accept length {b.accept_length:.2f}), "
        f"the {label} minus it {_pm(b)} accepted tokens per position (z {b.z:.1f}, {c.where}): "
        f"{_WHY.get(b.wiring, 'this draft was trained with another wiring')}" + (f"; {note}" if note else "")
    )
    fault = Finding(
        "E290",
        "error",
        msg,
        _fix(b.after_layers),
        {
            "configured": c.layers,
            "best": b.after_layers,
            "diff": b.diff,
            "se": b.se,
            "z": b.z,
            "positions": c.positions,
        },
    )
    return f"[E290] {msg}; fix: {_fix(b.after_layers)}", [fault], True, []


def _shift_note(layers: list[int], best: list[int]) -> str | None:
    """How far the configured ids sit from the best wiring's, where every id is off by the same nonzero count."""
    off = {i - j for i, j in zip(layers, best)}
    if len(off) != 1 or 0 in off:
        return None
    k = off.pop()
    return f"the configured ids are {abs(k)} layer{'s' if abs(k) > 1 else ''} {'high' if k > 0 else 'low'}"


def _fingerprint_note(ctx: _Context) -> list[Finding]:
    """The layers the feature fingerprint names (I306), where the draft records one: evidence, never a verdict."""
    if not ctx.fingerprint:
        return []
    fp_layers = [m["layer"] for m in ctx.fingerprint]
    return [
        Finding(
            "I306",
            "info",
            f"the feature fingerprint names after_layers {fp_layers} for the draft's "
            f"slots over this probe's text (evidence, not a verdict: the recorded statistics move with "
            f"the text as much as from one layer to the next, so acceptance decides)",
            None,
            {"slots": ctx.fingerprint},
        )
    ]


def _closest(others: list[WiringRow], c: _Configured) -> str:
    """The margin by which the configured wiring beats the closest of the alternatives ("" where none ran)."""
    if not others:
        return ""
    worst = min(others, key=_z)
    return (
        f"; it beats each of the {len(others)} alternatives on the same positions, the closest "
        f"({worst.wiring}, after_layers {worst.after_layers}) by {_pm(worst)} accepted tokens per position "
        f"(z {worst.z:.1f}, {c.where})"
    )


def _undecided_verdict(undecided: list[WiringRow], c: _Configured, ctx: _Context, findings: list[Finding]) -> _Verdict:
    """Alternatives the probe does not tell apart from the configured wiring: no fault where the training record's
    sample names the trained wiring, else cannot tell (W280) with what a longer probe would take. The text follows
    the verdict's head."""
    ties = ", ".join(f"{r.wiring} (after_layers {r.after_layers}: {_pm(r)}, z {r.z:.1f})" for r in undecided)
    if ctx.wiring_by_record:
        ev = next(f for f in findings if f.code == "I311").evidence
        msg = (
            f"the wiring is the one the draft was trained on ({REC}), and on its recorded sample the draft accepts "
            f"what it accepted at training (accepts {ev['now']:.2f} where it accepted {ev['recorded']:.2f} at "
            f"training); "
            f"the probe's first round does not tell {ties} apart from it ({c.where}), and needs not: the record "
            f"names the trained wiring"
        )
        return f"{msg}; no wiring fault found", [], True, []
    longer = _longer(ctx, undecided)
    msg = (
        f"cannot tell these wirings apart on this probe: the {ctx.label} (after_layers {c.layers}) minus {ties}, "
        f"in accepted tokens per position over {c.where} (|z| < {Z:.0f}); the probe stopped at its time budget"
    )
    warning = Finding(
        "W280", "warning", msg, longer, {"undecided": [r.wiring for r in undecided], "positions": c.positions}
    )
    return msg, [warning], False, [f"for the wiring: {longer}"]


def run_doctor(model: ModelOptions, opts: DoctorOptions | None = None, shape=None) -> dict:
    """The report as JSON (the shape `eaglekit doctor --json` prints)."""
    return diagnose(model, opts, shape).to_json()
