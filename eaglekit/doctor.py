"""`eaglekit doctor`: every known wiring fault between a target and its EAGLE-3 draft, in one command.

1. Checks of the folder and of the pair, each a finding with a stable code (reference.md section 7):
   capture width and range, the conventions the folder declares, d2t present / offsets / in range /
   one-to-one, t2d, lm_head rows, target_hidden_size, target / tokenizer fingerprints, the vocabulary
   mapping hash, norm options, NaN / inf in the features.
2. A short trace at the three capture points (target capture, draft input, concatenation).
3. A probe: acceptance per position under the configured wiring and under the alternatives (ids
   shifted by -1 and +1, the default set, the embedding instead of the low layer, the last layer only).
   Same shapes, no error anywhere: only acceptance tells a wrong wiring from the right one.
4. A verdict in plain words, and a short cycle profile.

Exit status: 0 a clean pair, 1 a fault found, 2 doctor could not run.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .capture import CaptureSpec
from .errors import EaglekitError, InputError

GENERIC_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colours are",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "Once upon a time, in a small village by the sea,",
    "class Stack:\n    def __init__(self):\n",
    "To convert degrees Celsius to Fahrenheit, multiply by",
    "for i in range(10):\n",
    "The quick brown fox",
]

# a wiring must beat the configured one by this much (mean teacher-forced acceptance over the probed
# positions, absolute) to be called a fault; the demo pair's neighbours of the trained wiring lose by 1.5-3 points
MARGIN = 0.01


@dataclass
class Finding:
    code: str
    severity: str  # error | warning | info
    message: str
    fix: str | None = None


def _finding(e: EaglekitError, severity="error") -> Finding:
    return Finding(e.code, severity, e.message, e.fix)


def folder_findings(folder: Path, num_layers: int) -> list[Finding]:
    """What the draft folder itself says, before loading: declared conventions and missing records."""
    out = []
    from .interop.formats import declared_captures

    raw = json.loads((folder / "config.json").read_text())
    block = raw.get("eaglekit") or {}
    declared = declared_captures(folder)
    if len(set(declared.values())) > 1:
        parts = "; ".join(f"{k} -> after_layers {list(v)}" for k, v in declared.items())
        out.append(Finding("E219", "error", f"the folder declares different capture layers in different places: "
                           f"{parts}", "keep one set of ids, written in each place in that place's convention "
                           "(eaglekit export does)"))
    if not declared:
        d = list(CaptureSpec.default(num_layers).after_layers)
        out.append(Finding("W301", "warning", f"the folder records no capture layers: eaglekit, SGLang and vLLM all "
                           f"fall back to their default (after_layers {d}); the probe below checks that this is what "
                           f"the draft was trained on", "record the layers the draft was trained with "
                           "(eagle_config.eagle_aux_hidden_state_layer_ids)"))
    if not (block.get("target") or {}).get("fingerprint"):
        out.append(Finding("I302", "info", "the folder records no target fingerprint, so a draft made for another "
                           "target cannot be told apart by its config; the probe's acceptance is the check"))
    for flag in ("norm_before_residual", "norm_before_fc"):
        if raw.get(flag):
            out.append(Finding("I303", "info", f"{flag} is set: engines that ignore it compute another function "
                               f"(SGLang and vLLM versions differ here)"))
    return out


def _probe_prompts(target_dir, prompt_file, n, vocab):
    from .tokenizer import encode, load_tokenizer, read_prompts

    tok = load_tokenizer(target_dir, required=False)
    if tok is None:  # no tokenizer: random token prompts still compare wirings fairly
        g = torch.Generator().manual_seed(0)
        return [torch.randint(0, vocab, (24,), generator=g).tolist() for _ in range(n)], "random token ids"
    if prompt_file:
        return [encode(tok, t) for t in read_prompts(prompt_file)[:n]], str(prompt_file)
    beside = Path(target_dir).parent / "prompts.jsonl"  # a pair shipped with its prompts (the demo pair)
    if beside.is_file():
        return [encode(tok, t) for t in read_prompts(beside)[:n]], str(beside)
    return [encode(tok, t) for t in GENERIC_PROMPTS[:n]], "built-in prompts"


def wirings(configured: CaptureSpec, num_layers: int) -> list[tuple[str, CaptureSpec]]:
    lo, *rest = configured.after_layers
    cands = [
        ("configured", configured),
        ("shifted -1", configured.shifted(-1)),
        ("shifted +1", configured.shifted(+1)),
        ("default [1, n//2-1, n-4]", CaptureSpec.default(num_layers)),
        ("embedding instead of the low layer", CaptureSpec((-1, *rest))),
        ("last layer only", CaptureSpec(tuple([num_layers - 1] * configured.num_captures))),
    ]
    out, seen = [], set()
    for name, spec in cands:
        if spec.after_layers in seen or any(i < -1 or i >= num_layers for i in spec.after_layers):
            continue
        seen.add(spec.after_layers)
        out.append((name, spec))
    return out


def _accuracy(target, draft, seqs, spec, steps: int) -> list[float]:
    """Teacher-forced top-1 accuracy of the draft at each of the first `steps` positions, over every
    position of `seqs` (the target's own continuations), with the target's features taken at `spec`."""
    from .train.ttt import TargetBatch, target_distribution, ttt_forward

    hot = torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device) + draft.d2t
    corr = torch.zeros(steps)
    cnt = torch.zeros(steps)
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s], device=target.device)
            hidden, feats = target.features(ids, None, spec)
            b = TargetBatch(feats, ids, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool), hidden)
            p, in_dv = target_distribution(b, target.lm_head_weight(), hot)
            _, _, c, n = ttt_forward(draft, b, p, in_dv, length=steps)
            corr += c.float().cpu()
            cnt += n.float().cpu()
    return (corr / cnt.clamp(min=1)).tolist()


def probe(target, draft, prompts, configured: CaptureSpec, max_new: int, shape) -> list[dict]:
    """Per wiring: teacher-forced acceptance per position on the target's own continuations of the prompts
    (thousands of positions, one forward each: precise and fast), and its simulated accept length; the
    configured and the best wirings are also decoded for real."""
    from .decoding.compare import decode_set
    from .decoding.engine import Decoder
    from .observe.metrics import rounded
    from .train.ttt import simulated_accept_length

    seqs = [p + Decoder(target).generate(p, max_new).token_ids for p in prompts]
    rows = []
    for name, spec in wirings(configured, target.info.num_layers):
        if spec.width(target.info.hidden_size) != draft.fc.in_features:
            rows.append({"wiring": name, "after_layers": list(spec.after_layers), "refused": "E202"})
            continue
        acc = _accuracy(target, draft, seqs, spec, shape.steps)
        rows.append({"wiring": name, "after_layers": list(spec.after_layers),
                     "accept_length": round(simulated_accept_length(acc), 4), "per_position": [round(a, 4) for a in acc],
                     "positions": sum(len(s) for s in seqs)})
    ran = [r for r in rows if "accept_length" in r]
    best = max(ran, key=lambda r: sum(r["per_position"]))
    for r in {id(ran[0]): ran[0], id(best): best}.values():
        dec = Decoder(target, draft, shape, capture=CaptureSpec(tuple(r["after_layers"])), allow_other_target=True)
        r["decoded_accept_length"] = rounded(decode_set(dec, prompts, max_new).metrics.accept_length, 4)
    return rows


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


def verdict(rows: list[dict], configured: CaptureSpec, label: str = "configured wiring") -> tuple[str, bool]:
    ran = [r for r in rows if "accept_length" in r]
    conf = next(r for r in ran if r["wiring"] == "configured")
    best = max(ran, key=lambda r: (sum(r["per_position"]), r["wiring"] == "configured"))
    p1 = conf["per_position"][0]
    gain = (sum(best["per_position"]) - sum(conf["per_position"])) / len(conf["per_position"])
    if best is conf or gain <= MARGIN:
        return (f"the {label} (after_layers {list(configured.after_layers)}) is the best of {len(ran)} "
                f"tried: {p1:.0%} acceptance at position 1 (teacher-forced), accept length "
                f"{conf.get('decoded_accept_length', conf['accept_length']):.2f}; no wiring fault found"), False
    b1 = best["per_position"][0]
    fix = (f"capture after_layers {best['after_layers']} (= input of layers {[i + 1 for i in best['after_layers']]}): "
           f"eaglekit generate --capture-layers {','.join(str(i) for i in best['after_layers'])}, or set "
           f"eagle_config.eagle_aux_hidden_state_layer_ids to {best['after_layers']} in the draft's config.json "
           f"(eaglekit export writes each engine's convention)")
    text = (f"the {label} accepts {p1:.0%} at position 1 (accept length "
            f"{conf.get('decoded_accept_length', conf['accept_length']):.2f}); after_layers {best['after_layers']} "
            f"({best['wiring']}) accepts {b1:.0%} (accept length "
            f"{best.get('decoded_accept_length', best['accept_length']):.2f}): "
            f"{_WHY.get(best['wiring'], 'this draft was trained with another wiring')}; fix: {fix}")
    return text, True


def run_doctor(target_dir, draft_dir, prompt_file=None, n_prompts: int = 12, max_new_tokens: int = 64,
               capture: CaptureSpec | None = None, backend="auto", device="cpu", dtype=None, shape=None) -> dict:
    """`capture`: the wiring you serve with, if not the one the draft declares (the story's server added
    the embedding to the captures)."""
    from .decoding.engine import Decoder
    from .decoding.tree import TreeShape
    from .draft import load_draft, pair_problems
    from .models import load_target
    from .observe import trace

    t0 = time.time()
    shape = shape or TreeShape(3, 1, 4)
    target = load_target(target_dir, backend=backend, device=device, dtype=dtype)  # failure: exit 2
    H, n_layers = target.info.hidden_size, target.info.num_layers
    draft_dir = Path(draft_dir)
    if not (draft_dir / "config.json").is_file():
        raise InputError(f"no draft config.json in {draft_dir}", fix="pass an EAGLE-3 draft folder", code="E101")
    findings = folder_findings(draft_dir, n_layers)
    try:
        draft = load_draft(draft_dir, device=target.device, dtype=target.dtype, embed_weight=target.embed_weight())
    except EaglekitError as e:
        findings.append(_finding(e))
        return _report(findings, [], [], {}, None, t0)
    configured = capture or draft.config.capture or CaptureSpec.default(n_layers)
    _, problems = pair_problems(draft, target, configured)
    findings += [_finding(p) for p in problems]

    def fits(spec):
        return (spec is not None and spec.width(H) == draft.fc.in_features
                and all(-1 <= i < n_layers for i in spec.after_layers))

    # the probe needs a wiring of the width the fc was trained on; a refused one is replaced by the draft's own
    base = next((s for s in (configured, draft.config.capture, CaptureSpec.default(n_layers)) if fits(s)), None)
    if base is not None and base != configured:
        findings.append(Finding("I304", "info", f"the configured wiring cannot run, so the probe starts from "
                                f"after_layers {list(base.after_layers)}"))
    prompts, source = _probe_prompts(target_dir, prompt_file, n_prompts, target.info.vocab_size)
    trace_rows: list[dict] = []
    profile: dict = {}
    rows: list[dict] = []
    if base is not None:
        sink: list = []
        trace.configure(enabled=True, steps=2, sink=sink, stream=open("/dev/null", "w"))
        try:
            dec = Decoder(target, draft, shape, capture=base, allow_other_target=True, profile=True)
            profile = {k: round(v * 1e3, 3) for k, v in dec.generate(prompts[0], 16).metrics.phases.items()}
        except EaglekitError as e:
            findings.append(_finding(e))
            base = None
        finally:
            trace.configure(enabled=False)
        trace_rows = [{k: r.get(k) for k in ("cycle", "point", "shape", "dtype", "layers", "mean", "std", "absmax",
                                             "nan", "inf")} for r in sink
                      if r["point"] in ("target.capture", "draft.input.features", "draft.input.fc", "draft.concat")]
    if base is not None:
        rows = probe(target, draft, prompts, base, max_new_tokens, shape)
    label = "configured wiring" if base == configured else "draft's declared wiring"
    return _report(findings, rows, trace_rows, profile, base, t0, source, label)


def _report(findings, rows, trace_rows, profile, spec, t0, source=None, label="configured wiring") -> dict:
    errors = [f for f in findings if f.severity == "error"]
    probe_fault = False
    if rows and spec is not None and any(r["wiring"] == "configured" and "accept_length" in r for r in rows):
        text, probe_fault = verdict(rows, spec, label)
    elif errors:
        text = "the pair cannot run as configured"
    else:
        text = "no probe could run"
    if errors:
        text = "; ".join(f"[{f.code}] {f.message}" for f in errors) + ". Probe: " + text
    if probe_fault:
        findings.append(Finding("E290", "error", text.split("; fix:")[0], text.split("; fix: ")[-1]))
    return {"verdict": text, "fault": bool(errors) or probe_fault,
            "findings": [asdict(f) for f in findings], "probe": rows, "probe_prompts": source,
            "trace": trace_rows, "profile_ms": profile, "seconds": round(time.time() - t0, 1)}
