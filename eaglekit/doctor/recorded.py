"""The draft held against its training record (eaglekit.train.record): what it accepted then, what it accepts now.

Faults outside the layer wiring cost acceptance without any wiring beating the configured one: a draft config's
rope_theta or norm_before_residual changed, part of the d2t shuffled with its hash removed, a flag eaglekit ignores
but an engine honours. The probe cannot see them (it varies the wiring only); the record can:

1. static, before the probe (`static_findings`): each function field of the config against the recorded value
   (E224, the field named with the value to restore), the d2t against the recorded digest (E217), the target's
   tokenizer and chat template against the recorded digests (E215);
2. before the probe (`acceptance_findings`): the draft measured again on the recorded sample, with the recorded
   chain, under the configured wiring, by the same function that wrote the record (eaglekit.train.record.measure),
   and compared position by position with the recorded runs (paired_difference: the standard error clustered by
   sequence). Where the capture moved since training and the sample measured under the recorded capture accepts as
   at training while the configured wiring fits worse (its training loss per position higher by Z standard errors:
   train.ttt.teacher_forced_hits, the quantity training minimized at the trained wiring) and accepts less, that is
   a wiring fault (E290, the recorded ids as the fix, what it costs in accepted tokens). The loss decides because it
   is far less noisy than the 0/1 hits: on the real pair ids one layer low move it at z 11.7 over 16 sequences
   where the accepted tokens need all 64 for z 4.8. Any other drop larger than Z standard errors and than DROP is
   E223, "accepts X where it accepted Y at training", followed by what changed since training; within it, I311; a
   run in another dtype or with other products whose acceptance holds is a note (I312), not a fault. The check
   ends after a few chunks of sequences where they already decide (EARLY_SEQUENCES, Z_EARLY). The doctor runs the
   products the record was measured with where this device has them (`products_of`): the right pair then gives the
   recorded runs bit for bit, and no products timing runs. A record that settles the wiring (I311 with the capture
   unchanged, or its E290: `settles_wiring`) ends the probe after its first round: on the same positions the
   probe's alternatives are told apart only by their distance from the trained wiring, which the record already
   names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .probe import Z, paired_difference
from .report import Finding

# a drop (accepted tokens per position) below which the run is "as at training" however many positions tell it
# apart: the demo pair recorded in float32 and run in bfloat16 moves it by -0.002 ± 0.005, in float16 by +0.000 ± 0.001
# (3487 positions: docs/doctor.md, "The training record")
DROP = 0.05
# the record's check ends after EARLY_SEQUENCES or more where the evidence already decides (_decided), at Z_EARLY
# standard errors: stricter than Z, as the check looks after every chunk of sequences
EARLY_SEQUENCES, Z_EARLY = 16, 4.0
REC = "its training record, eaglekit_record.json"
_TIE = (
    "eaglekit ignores this flag (the draft keeps its own lm_head of draft_vocab_size rows), so no acceptance "
    "measured here shows it; an engine that honours it ties the draft's lm_head to the token embedding and "
    "computes another function than the one trained (or refuses the shapes)"
)


def _where(draft_dir: Path, field: str) -> str:
    raw = json.loads((draft_dir / "config.json").read_text())
    layer = raw.get("transformer_layer_config")
    if layer is not None and (
        field in layer
        or field.startswith(("rope", "hidden", "intermediate", "num_", "head", "rms", "tie", "vocab", "attention"))
    ):
        return "transformer_layer_config in config.json"
    return "config.json"


def static_findings(rec: dict, draft_dir, draft, target_dir, findings: list[Finding]) -> list[Finding]:
    """The record's facts against the folder's: changed function fields, d2t, tokenizer and chat template."""
    from ..draft.checkpoint import vocab_map_sha
    from ..train.record import function_fields, tokenizer_digests

    draft_dir = Path(draft_dir)
    out = []
    now = function_fields(draft_dir)
    for k, was in (rec.get("config") or {}).get("fields", {}).items():
        if now.get(k) == was:
            continue
        why = _TIE if k == "tie_word_embeddings" else "the draft computes another function than the one trained"
        out.append(
            Finding(
                "E224",
                "error",
                f"the draft's config sets {k} = {json.dumps(now.get(k))}, but the draft "
                f"was trained with {k} = {json.dumps(was)} ({REC}): {why}",
                f"set {k} back to {json.dumps(was)} in {_where(draft_dir, k)}",
                {"field": k, "recorded": was, "now": now.get(k)},
            )
        )
    have = {f.code for f in findings}
    d2t = vocab_map_sha(draft.d2t)
    if rec.get("d2t_sha256") and d2t != rec["d2t_sha256"] and "E217" not in have:
        out.append(
            Finding(
                "E217",
                "error",
                f"the draft's d2t is not the mapping recorded at training (digest "
                f"{d2t}, recorded {rec['d2t_sha256']} in {REC}): lm_head rows propose other tokens than "
                f"they were trained for",
                "restore the d2t saved with the draft; never regenerate the vocabulary mapping of a trained draft",
                {"recorded": rec["d2t_sha256"], "now": d2t},
            )
        )
    t = rec.get("target") or {}
    cur = tokenizer_digests(target_dir)
    moved = [k for k in ("tokenizer", "chat_template") if t.get(k) != cur[k] and (t.get(k) or cur[k]) and k in t]
    if moved and "E215" not in have:
        what = " and ".join({"tokenizer": "tokenizer", "chat_template": "chat template"}[k] for k in moved)
        diff = ", ".join(f"{k}: {t.get(k) or 'none'} recorded, {cur[k] or 'none'} now" for k in moved)
        out.append(
            Finding(
                "E215",
                "error",
                f"the target folder's {what} is not the one the draft was trained with "
                f"({diff}; {REC}): "
                f"prompts are rendered into other tokens than the draft learned on",
                "serve with the tokenizer and chat template the draft was trained with",
                {k: {"recorded": t.get(k), "now": cur[k]} for k in moved},
            )
        )
    return out


def changes(rec: dict, target, target_dir, base) -> list[str]:
    """What changed since training among what the record holds, in words (config fields are E224's)."""
    from ..train.fingerprint import weights_fingerprint

    out = []
    cap = (rec.get("config") or {}).get("capture")
    if cap is not None and list(base.after_layers) != list(cap):
        out.append(f"the capture: after_layers {list(base.after_layers)} now, {cap} at training")
    t = rec.get("target") or {}
    if t.get("fingerprint") and t["fingerprint"] != target.info.fingerprint:
        out.append(f"the target's config fingerprint: {target.info.fingerprint} now, {t['fingerprint']} at training")
    w = (t.get("weights") or {}).get("sha256")
    cur = weights_fingerprint(target_dir)
    if w and cur and cur["sha256"] != w:
        out.append(f"the target's weights fingerprint: {cur['sha256']} now, {w} at training")
    run = rec.get("run") or {}
    dt = str(target.dtype).removeprefix("torch.")
    if run.get("dtype") and run["dtype"] != dt:
        out.append(f"the target's dtype: {dt} now, {run['dtype']} at training")
    choice = target.products_choice
    if run.get("products") and choice is not None and choice.kind != run["products"]:
        out.append(f"the products: {choice.kind} now, {run['products']} at training")
    return out


def _paired(rec_runs: list[str], now_runs: list[str]):
    """Per sequence, the runs at the positions counted both times (recorded, now)."""
    a, b = [], []
    for r, n in zip(rec_runs, now_runs):
        keep = [(int(x), int(y)) for x, y in zip(r, n) if x != "." and y != "."]
        if keep:
            a.append(torch.tensor([x for x, _ in keep], dtype=torch.float64))
            b.append(torch.tensor([y for _, y in keep], dtype=torch.float64))
    return a, b


def _compared(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float, float, float, float, int]:
    """-> (a's accept length, b's, a minus b in accepted tokens per position, its standard error, z, positions)."""
    N = sum(x.numel() for x in a)
    diff, se = paired_difference(a, b)
    was, is_ = 1 + float(sum(x.sum() for x in a)) / N, 1 + float(sum(y.sum() for y in b)) / N
    z = diff / se if se > 0 else (0.0 if diff == 0 else 99.0)
    return was, is_, diff, se, z, N


def _loss_gap(now: list[torch.Tensor], then: list[torch.Tensor]) -> tuple[float, float, float]:
    """-> (the configured wiring's training loss minus the trained one's, per position, its standard error clustered
    by sequence, z): positive where the configured wiring is the worse fit. Both lists cover the same positions
    (measure_each's losses) and may differ in length only where one run ended early."""
    n = min(len(now), len(then))
    diff, se = paired_difference(now[:n], then[:n])
    return diff, se, (diff / se if se > 0 else (0.0 if diff == 0 else 99.0))


def _dropped(diff: float, se: float) -> bool:
    return diff > max(Z * se, DROP)


def products_of(rec: dict | None, target) -> str:
    """The products the doctor runs: the record's where it names ones this device runs, else 'auto'."""
    from ..kernels.products import check_kind

    run = (rec or {}).get("run") or {}
    kind = run.get("products")
    if not kind or str(run.get("device", "")).split(":")[0] != target.device.type:
        return "auto"
    return "auto" if check_kind(kind, target, target.device) is not None else kind


def settles_wiring(findings: list[Finding]) -> bool:
    """Whether the training record's sample settled the wiring: the configured one is the one trained and accepts as
    at training (I311 with the capture unchanged), or the trained one accepts as at training where the configured
    one does not (E290 from the record)."""
    return any(
        (f.code == "I311" and f.evidence.get("capture_unchanged"))
        or (f.code == "E290" and f.evidence.get("source") == SOURCE)
        for f in findings
    )


SOURCE = "training record"


def _trained_capture(rec: dict, target, base):
    """The recorded capture where it differs from `base` and the target has its layers, else None."""
    from ..capture import CaptureSpec

    cap = (rec.get("config") or {}).get("capture")
    if cap is None or list(base.after_layers) == list(cap):
        return None
    trained = CaptureSpec(tuple(cap))
    return trained if all(-1 <= i < target.info.num_layers for i in trained.after_layers) else None


def _decided(rec_runs: list[str], so_far: list[list[str]], losses: list[list[torch.Tensor]]) -> bool:
    """Whether the record's check may end with the sequences measured so far (so_far: the configured wiring's runs,
    then the recorded capture's where the capture moved; losses: their training losses): the runs hold (even the
    upper end of the drop's interval at Z_EARLY standard errors is below DROP) and, where the capture moved, the
    recorded capture holds and the configured one is the worse fit by Z_EARLY standard errors of the training loss
    and accepts less (_wiring_worse)."""
    if len(so_far[0]) < EARLY_SEQUENCES:
        return False

    def holds(runs: list[str]) -> bool:
        _, _, diff, se, _, _ = _compared(*_paired(rec_runs, runs))
        return diff + Z_EARLY * se < DROP

    if len(so_far) == 1:
        return holds(so_far[0])
    now, then = so_far
    return holds(then) and _wiring_worse(_compared(*_paired(then, now)), _loss_gap(*losses), Z_EARLY)


def _wiring_worse(accepted: tuple, gap: tuple[float, float, float], z: float) -> bool:
    """The configured wiring against the trained one on the same positions (accepted: _compared(trained,
    configured); gap: _loss_gap): a higher training loss by `z` standard errors, and fewer accepted tokens (the
    point estimate: the loss decides, the runs say what it costs and must not point the other way)."""
    return gap[2] >= z and accepted[2] > 0


def _wiring_finding(
    rec: dict, trained, steps: int, now: list[str], then: list[str], base, fix_ids, losses: list[list[torch.Tensor]]
) -> Finding | None:
    """Where the capture moved since training: the sample measured again under the recorded capture. If that accepts
    as at training and the configured wiring fits the target worse than it on the same positions by Z standard
    errors of the training loss, accepting less, the wiring is the cause (E290, the fix in the folder's
    convention); else None. Both runs are this run (one dtype, one set of products), so unlike the drop against the
    record no DROP floor applies: the probe decides its wirings by the same Z alone."""
    cap = list(trained.after_layers)
    holds = _compared(*_paired(rec["runs"], then))
    accepted, gap = _compared(*_paired(then, now)), _loss_gap(*losses)
    if _dropped(holds[2], holds[3]) or not _wiring_worse(accepted, gap, Z):
        return None
    was, is_, diff, se, z, N = accepted
    ldiff, lse, lz = gap
    msg = (
        f"the draft was trained on after_layers {cap} ({REC}) and is configured with "
        f"{list(base.after_layers)}: on its recorded sample it accepts {is_:.2f} as configured and {was:.2f} under "
        f"the trained wiring ({holds[1]:.2f} at training), the configured wiring minus the trained "
        f"{0.0 - diff + 0.0:+.3f} ± {se:.3f} accepted tokens per position, its training loss {ldiff:+.3f} ± "
        f"{lse:.3f} a position (z {lz:.1f}; teacher-forced, chain of {steps}, {N} positions)"
    )
    return Finding(
        "E290",
        "error",
        msg,
        fix_ids(list(cap)),
        {
            "configured": list(base.after_layers),
            "best": list(cap),
            "diff": round(-diff, 4),
            "se": round(se, 4),
            "z": round(-z, 2),
            "loss_diff": round(ldiff, 4),
            "loss_se": round(lse, 4),
            "loss_z": round(lz, 2),
            "positions": N,
            "source": SOURCE,
        },
    )


def acceptance_findings(
    rec: dict, target, draft, base, target_dir, static: list[Finding], fix_ids=None
) -> list[Finding]:
    """The draft measured again on the recorded sample and compared with the record. `fix_ids(after_layers)`: the
    fix for a wiring fault in the folder's convention (None: no wiring verdict from the record)."""
    from ..train.record import measure_each

    steps = int(rec.get("steps") or 3)
    seqs = (rec.get("sample") or {}).get("sequences") or []
    fields = [f for f in static if f.code in ("E224", "E217", "E215")]
    # where the capture moved, the recorded one is measured in the same target pass (a wiring verdict needs both)
    trained = _trained_capture(rec, target, base) if not fields and fix_ids is not None else None
    losses: list[list[torch.Tensor]] = []
    now, *then = measure_each(
        target,
        draft,
        seqs,
        [base] + ([trained] if trained is not None else []),
        steps,
        stop=lambda runs, lost: _decided(rec["runs"], runs, lost),
        losses=losses,
    )
    a, b = _paired(rec["runs"], now)
    if not a:
        return [Finding("I311", "info", "the training record's sample has no position to measure again", None, {})]
    # (a check that ended early compares its first sequences: _paired stops at the shorter list)
    again = _against_record(
        rec,
        _compared(a, b),
        steps=steps,
        sequences=len(a),
        recorded=len(seqs),
        moved=changes(rec, target, target_dir, base),
    )
    wiring = _wiring_finding(rec, trained, steps, now, then[0], base, fix_ids, losses) if trained is not None else None
    if wiring is not None:
        return [wiring]
    if _dropped(again.diff, again.se):
        return [_drop_finding(rec, again, fields)]
    return _holds_findings(rec, again, base, fields)


@dataclass
class _Remeasured:
    """The draft measured again on the recorded sample, against the record, on the same positions."""

    was: float  # accept length at training
    is_: float  # accept length now
    diff: float  # was minus now, in accepted tokens per position
    se: float  # its standard error, clustered by sequence
    where: str  # the comparison in words: what was measured, the difference and its z
    moved: list[str]  # what changed since training, in words (changes)
    ev: dict  # the evidence of every finding made from it


def _against_record(
    rec: dict,
    compared: tuple[float, float, float, float, float, int],
    steps: int,
    sequences: int,
    recorded: int,
    moved: list[str],
) -> _Remeasured:
    """The comparison in the findings' words and evidence. `compared`: _compared(recorded runs, runs now) over the
    `sequences` measured again, of the `recorded` ones."""
    was, is_, diff, se, z, N = compared
    ev = {
        "recorded": round(was, 4),
        "now": round(is_, 4),
        "drop": round(diff, 4),
        "se": round(se, 4),
        "z": round(z, 2),
        "positions": N,
        "sequences": sequences,
        "steps": steps,
        "changed": moved,
        "written_by": rec.get("written_by"),
    }
    of = f"{sequences} of the {recorded}" if sequences < recorded else f"the {sequences}"
    where = (
        f"teacher-forced accept length, chain of {steps}, on {of} sequences it was recorded on "
        f"({N} positions): {0.0 - diff + 0.0:+.3f} ± {se:.3f} tokens per position, z {0.0 - z + 0.0:.1f}"
    )
    return _Remeasured(was, is_, diff, se, where, moved, ev)


def _drop_finding(rec: dict, again: _Remeasured, fields: list[Finding]) -> Finding:
    """The draft accepts less than at training (E223), with what changed since and the fix for the likeliest cause:
    a changed field or file first, then a run unlike the recorded one, else the pair as trained."""
    label = {"E217": "the d2t", "E215": "the tokenizer / chat template"}
    named = [f"{f.evidence.get('field') or label[f.code]} ({f.code})" for f in fields]
    since = "; ".join(again.moved + ([f"config and files: {', '.join(named)}"] if named else []))
    only_run = (
        not fields and again.moved and all(m.startswith(("the target's dtype", "the products")) for m in again.moved)
    )
    fix = (
        fields[0].fix
        if fields
        else f"run the target as at training ({(rec.get('run') or {}).get('dtype')}, products "
        f"{(rec.get('run') or {}).get('products')})"
        if only_run
        else "serve the draft as it was trained: its own target, wiring, config and files (see what changed)"
    )
    return Finding(
        "E223",
        "error",
        f"the draft accepts {again.is_:.2f} where it accepted {again.was:.2f} at training "
        f"({again.where}). Changed since training: "
        + (
            since
            or "nothing the record holds (config "
            "fields, d2t, target weights and config fingerprints, tokenizer, chat template, dtype, "
            "products): the cause is outside it"
        ),
        fix,
        again.ev,
    )


def _holds_findings(rec: dict, again: _Remeasured, base, fields: list[Finding]) -> list[Finding]:
    """Acceptance within the interval of the recorded one (I311), and a note (I312) where it holds on a run unlike
    the recorded one (another dtype or other products)."""
    cap = (rec.get("config") or {}).get("capture")
    again.ev["capture_unchanged"] = cap is not None and list(base.after_layers) == list(cap) and not fields
    out = [
        Finding(
            "I311",
            "info",
            f"the draft accepts {again.is_:.2f} where it accepted {again.was:.2f} at training "
            f"({again.where}): within the interval (a drop counts past {Z:.0f} standard errors and {DROP} "
            f"tokens)",
            None,
            again.ev,
        )
    ]
    run = [m for m in again.moved if m.startswith(("the target's dtype", "the products"))]
    if run:
        out.append(
            Finding(
                "I312",
                "info",
                f"the run differs from the training record's ({'; '.join(run)}), and acceptance holds: {again.where}",
                None,
                again.ev,
            )
        )
    return out


def write_pair_record(
    target_dir,
    draft_dir,
    prompt_file=None,
    max_new_tokens: int = 64,
    capture=None,
    backend="auto",
    device="cpu",
    dtype=None,
    log=print,
) -> dict:
    """`eaglekit doctor --record`: the record of a pair the user trusts (a draft made elsewhere), on the probe's
    prompts continued by the target, written beside the draft for later runs of the doctor to hold it against."""
    from ..capture import CaptureSpec
    from ..models import load_target
    from ..train.record import MAX_SEQUENCES, MAX_TOKENS, build_record, loaded_as_doctor, write_record
    from ..train.regen import greedy_texts
    from .probe import probe_prompts

    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)
    draft = loaded_as_doctor(target, draft_dir)
    spec = capture or draft.config.capture or CaptureSpec.default(target.info.num_layers)
    prompts, source = probe_prompts(target_dir, prompt_file, target.info.vocab_size)
    prompts = prompts[:MAX_SEQUENCES]
    # continued only as far as the sample keeps (MAX_TOKENS a sequence)
    new = max(0, min(max_new_tokens, MAX_TOKENS - min(len(p) for p in prompts)))
    seqs = greedy_texts(target, prompts, new, tuple(target.info.eos_token_ids)) if new else prompts
    rec = build_record(
        target,
        target_dir,
        draft_dir,
        seqs,
        spec,
        "eaglekit doctor --record",
        f"{source}, continued by the target ({new} tokens)",
        draft=draft,
    )
    path = write_record(draft_dir, rec)
    a = rec["acceptance"]
    log(
        f"eaglekit doctor --record: accept length {a['accept_length']:.2f} (teacher-forced, chain of {rec['steps']}) "
        f"over {a['positions']} positions of {a['sequences']} sequences; written to {path}"
    )
    return rec
