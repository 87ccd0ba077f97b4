"""Which target a draft was made for, and how sure the doctor is of it.

The config fingerprint (E208) tells targets of other shapes apart; a same-shape target with other weights (a
fine-tune, another revision) shares it, and its draft still runs, at lower acceptance, with nothing to compare
that acceptance with. The evidence, strongest first:
  weights    the draft records the fingerprint of its target's weights (eaglekit.train.fingerprint, written by
             eaglekit train and eaglekit export --target, or in its training record by eaglekit doctor --record):
             equal hashes settle it; otherwise the relative distance of the sampled weights is the measure (E220).
  reference  the user gives the position-1 acceptance the doctor measured on the draft's own target
             (--reference-acceptance): this target's far below it (E284).
Without either the check cannot be made (W281), and the verdict cannot be clean.

The statistics of the features a draft recorded at training (eaglekit.features) are no evidence of the target: they
name the layer each capture slot was trained on, but their distance to the target's depends on the probe text more
than on the weights. On the demo pair the draft's own target measures 0.31-0.86 over the demo prompts and 1.15-1.19
over the built-in ones; copies of it with every weight multiplied by 1 + s N(0, 1) measure 0.24-0.97 (s = 2%, 5%,
10%) and 0.20-0.47 (20%) over the demo prompts (docs/performance.md#d40). No
threshold separates them, so neither "far" nor "near" decides which target this is (docs/doctor.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .report import Finding

# acceptance below the reference by more than this (absolute) or 3 standard errors, whichever is larger
REFERENCE_SLACK = 0.05

DECIDE_TARGET = (
    "a record of the draft's target: re-export the draft against the target it was trained on (eaglekit "
    "export OUT --to vllm|sglang --draft D --target T writes the fingerprint of T's weights), or pass "
    "--reference-acceptance A, the position-1 acceptance eaglekit doctor reports for the draft on its "
    "own target; or, once this pair is trusted, eaglekit doctor --record, which records the target's "
    "weights with the draft's acceptance for later runs"
)


@dataclass
class Identity:
    decided: bool = False  # the evidence settles which target the draft was made for
    same: bool | None = None  # ... and it is this one
    how: str | None = None  # weights (the only record that settles it: module docstring)
    findings: list[Finding] = field(default_factory=list)


def weights_check(config, target_dir, record: dict | None = None) -> Identity:
    """`record`: the draft's training record (eaglekit.train.record), whose target weights fingerprint stands in
    for the config's where the config records none (a draft made elsewhere, recorded by `doctor --record`)."""
    from ..train.fingerprint import weights_distance, weights_fingerprint

    rec = config.target_weights or ((record or {}).get("target") or {}).get("weights")
    if not rec:
        return Identity()
    cur = weights_fingerprint(target_dir)
    if cur is None:
        return Identity(
            findings=[
                Finding(
                    "W281",
                    "warning",
                    "the draft records its target's weights, but this target has no safetensors to compare them with",
                    DECIDE_TARGET,
                )
            ]
        )
    if cur["sha256"] == rec.get("sha256"):
        return Identity(
            True,
            True,
            "weights",
            [
                Finding(
                    "I308", "info", f"the target's weights are the ones the draft records (fingerprint {cur['sha256']})"
                )
            ],
        )
    d = weights_distance(rec, cur)
    size = f"the sampled weights differ by {d:.1%} (relative)" if d is not None else "an older fingerprint"
    return Identity(
        True,
        False,
        "weights",
        [
            Finding(
                "E220",
                "error",
                f"the draft was made for a target with other weights of the same shapes: its recorded "
                f"weights fingerprint {rec.get('sha256')} is not this target's {cur['sha256']}; {size}",
                "serve the draft with the target it was trained on, or train / fine-tune a draft for this one "
                "(eaglekit train --init-draft D keeps its vocabulary)",
                {"recorded": rec.get("sha256"), "target": cur["sha256"], "distance": d},
            )
        ],
    )


def reference_check(p1: float, positions: int, reference: float) -> Finding:
    se = (max(p1 * (1 - p1), 1e-4) / max(positions, 1)) ** 0.5
    slack = max(REFERENCE_SLACK, 3 * se)
    ev = {"position1": p1, "reference": reference, "slack": round(slack, 4), "positions": positions}
    if p1 < reference - slack:
        return Finding(
            "E284",
            "error",
            f"the configured wiring accepts {p1:.1%} at position 1, below the reference "
            f"{reference:.1%} measured on the draft's own target by more than {slack:.1%}: this is not the "
            f"target the draft was made for (or a fault the probe does not vary)",
            "serve the draft with the target it was trained on",
            ev,
        )
    return Finding(
        "I310",
        "info",
        f"position-1 acceptance {p1:.1%} is within {slack:.1%} of the reference {reference:.1%}",
        None,
        ev,
    )
