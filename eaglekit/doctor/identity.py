"""Which target a draft was made for, and how sure the doctor is of it.

The config fingerprint (E208) tells targets of other shapes apart; a same-shape target with other weights (a
fine-tune, another revision) shares it, and its draft still runs, at lower acceptance, with nothing to compare
that acceptance with. The evidence, strongest first:
  weights    the draft records the fingerprint of its target's weights (eaglekit.train.fingerprint, written by
             eaglekit train and eaglekit export --target): equal hashes settle it; otherwise the relative
             distance of the sampled weights is the measure (E220).
  features   the draft records the statistics of the features it was trained on (eaglekit train): the probe's
             features at the layer each slot matches best, against them (E221 beyond FEATURES_FAR).
  reference  the user gives the position-1 acceptance the doctor measured on the draft's own target
             (--reference-acceptance): this target's far below it (E284).
Without any of them the check cannot be made (W281), and the verdict cannot be clean.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .report import Finding

# features distance (eaglekit.train.fingerprint.distance, at the slot's best layer) beyond which the target is
# another one: the demo pair's own measures 0.39 at most over the doctor's probe text; copies of its target with
# every weight multiplied by 1 + s * N(0, 1) measure 1.47 (s = 2%), 1.43 (5%), 1.09 (10%), 1.13 (20%)
FEATURES_FAR = 0.8
# the statistics of fewer probe tokens than this are too noisy to compare (2 prompts of 8 tokens measure 1.4 on
# the demo pair's own target)
MIN_FEATURE_TOKENS = 1000
# acceptance below the reference by more than this (absolute) or 3 standard errors, whichever is larger
REFERENCE_SLACK = 0.05

DECIDE_TARGET = ("a record of the draft's target: re-export the draft against the target it was trained on (eaglekit "
                 "export OUT --to vllm|sglang --draft D --target T writes the fingerprint of T's weights), or pass "
                 "--reference-acceptance A, the position-1 acceptance eaglekit doctor reports for the draft on its "
                 "own target")


@dataclass
class Identity:
    decided: bool = False  # the evidence settles which target the draft was made for
    same: bool | None = None  # ... and it is this one
    how: str | None = None  # weights | features | reference
    findings: list[Finding] = field(default_factory=list)


def weights_check(config, target_dir) -> Identity:
    from ..train.fingerprint import weights_distance, weights_fingerprint

    rec = config.target_weights
    if not rec:
        return Identity()
    cur = weights_fingerprint(target_dir)
    if cur is None:
        return Identity(findings=[Finding("W281", "warning", "the draft records its target's weights, but this "
                                          "target has no safetensors to compare them with", DECIDE_TARGET)])
    if cur["sha256"] == rec.get("sha256"):
        return Identity(True, True, "weights", [Finding("I308", "info", f"the target's weights are the ones the "
                                                        f"draft records (fingerprint {cur['sha256']})")])
    d = weights_distance(rec, cur)
    size = f"the sampled weights differ by {d:.1%} (relative)" if d is not None else "an older fingerprint"
    return Identity(True, False, "weights", [Finding(
        "E220", "error", f"the draft was made for a target with other weights of the same shapes: its recorded "
        f"weights fingerprint {rec.get('sha256')} is not this target's {cur['sha256']}; {size}",
        "serve the draft with the target it was trained on, or train / fine-tune a draft for this one (eaglekit "
        "train --init-draft D keeps its vocabulary)", {"recorded": rec.get("sha256"), "target": cur["sha256"],
                                                        "distance": d})])


def features_check(recorded: dict, sketch, base, n_layers: int, identity: Identity | None) -> Identity:
    """The probe's features (every layer, in `sketch`) against the recorded statistics: each slot at its best layer."""
    from ..train.fingerprint import match

    out = identity or Identity()
    if sketch.n < MIN_FEATURE_TOKENS:
        out.findings.append(Finding("W285", "warning", f"the probe's {sketch.n} tokens are too few to compare the "
                                    f"target's features with the statistics the draft recorded (it takes "
                                    f"{MIN_FEATURE_TOKENS})", "a longer probe (--time-budget, more prompts)"))
        return out
    m = match(recorded, sketch, list(range(-1, n_layers)))
    worst = max(x["distance"] for x in m)
    ev = {"distance": worst, "threshold": FEATURES_FAR, "slots": [{k: x[k] for k in ("slot", "layer", "distance")}
                                                                  for x in m]}
    if worst > FEATURES_FAR:
        out.findings.append(Finding(
            "E221", "error", f"the features this target produces are far from the statistics the draft recorded at "
            f"training: distance {worst:.2f} at the closest layer (the draft's own target measures under "
            f"{FEATURES_FAR}): the draft was made for another target (other weights of the same shapes)",
            "serve the draft with the target it was trained on, or train / fine-tune a draft for this one", ev))
        out.decided, out.same, out.how = True, False, "features"
    else:
        out.findings.append(Finding("I309", "info", f"the captured features match the statistics the draft recorded "
                                    f"at training (distance {worst:.2f}, under {FEATURES_FAR}): the draft's own "
                                    f"target, or one that computes the same features", None, ev))
        out.decided, out.same, out.how = True, True, "features"
    return out


def reference_check(p1: float, positions: int, reference: float) -> Finding:
    se = (max(p1 * (1 - p1), 1e-4) / max(positions, 1)) ** 0.5
    slack = max(REFERENCE_SLACK, 3 * se)
    ev = {"position1": p1, "reference": reference, "slack": round(slack, 4), "positions": positions}
    if p1 < reference - slack:
        return Finding("E284", "error", f"the configured wiring accepts {p1:.1%} at position 1, below the reference "
                       f"{reference:.1%} measured on the draft's own target by more than {slack:.1%}: this is not the "
                       f"target the draft was made for (or a fault the probe does not vary)",
                       "serve the draft with the target it was trained on", ev)
    return Finding("I310", "info", f"position-1 acceptance {p1:.1%} is within {slack:.1%} of the reference "
                   f"{reference:.1%}", None, ev)
