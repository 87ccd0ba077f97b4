"""The `eaglekit` commands about a pair's wiring: doctor (the checks, a trace, the probe and a verdict) and export (a
draft written for SGLang, vLLM or SpecForge in that engine's layer-id convention)."""

from __future__ import annotations

import json
import sys

from ..errors import EaglekitError
from ..options import DOCTOR_DEVICE, DoctorOptions, ModelOptions
from .common import add_capture, add_runtime, add_tp, capture_override, check_folders, decode_options, model_options
from .registry import command


# --- doctor ----------------------------------------------------------------------------------------
@command("doctor", "find wiring faults between a target and its draft: checks, trace, probe, verdict")
def cmd_doctor(args) -> int:
    """Runs every check of the pair (capture width and range, declared conventions, d2t and t2d, lm_head rows,
    target_hidden_size, fingerprints, norm options, NaN features), a short trace at the three capture points,
    and a probe: acceptance per position under the configured wiring and its alternatives (ids shifted by -1 and
    +1, the default set, the embedding instead of the low layer, the last layer only). Ends with a verdict.
    Exit status 0: clean (the configured wiring shown best, the target shown to be the draft's); 1: a fault was
    found; 2: doctor could not run; 3: cannot tell (the verdict says what would decide it)."""
    from ..doctor import run_doctor

    try:
        model, decode = model_options(args), decode_options(args)
        # no bar with --engine: the engine doctor's stages after the probe (the vLLM run) do not report to it
        opts = DoctorOptions.from_args(args, progress=not (args.no_progress or args.engine))
        if args.prompt_file:
            from ..io import need_file

            need_file(args.prompt_file, "--prompt-file")
        check_folders(model.target, model.draft)
        if args.record:  # a pair the user trusts: its training record, for later runs to be held against
            _record_pair(args, model, decode.max_new_tokens)
            return 0
        if args.engine:  # the same doctor, plus the pair run inside vLLM and compared (integrations.vllm.doctor)
            from ..integrations.vllm.doctor import run_engine_doctor

            res = run_engine_doctor(model, opts, args.steps, args.engine_python)
        else:
            res = run_doctor(model, opts)
    except EaglekitError as e:
        _print_could_not_run(e, args.json)
        return 2
    _name_each_finding_once(res)
    _print_doctor(res, args.json)
    # the doctor's own verdict, the same with and without --json: 0 clean, 1 a fault, 2 could not run (a file of the
    # pair could not be read: eaglekit.doctor.report.UNREADABLE), 3 cannot tell
    rc = res.get("exit_code", 1 if res["fault"] else 0)
    if res.get("status") == "could_not_run":
        from ..doctor.report import unreadable

        first = (unreadable(res["findings"]) or res["findings"] or [{"code": "E100", "message": res["verdict"]}])[0]
        print(f"eaglekit doctor: could not run: [{first['code']}] {first['message']}", file=sys.stderr)
    return rc


def _record_pair(args, model: ModelOptions, max_new_tokens: int) -> None:
    """--record: the pair measured on the probe prompts and its training record written into the draft folder
    (with --json, the record's gist as one object)."""
    from ..doctor.recorded import write_pair_record

    rec = write_pair_record(
        model.target,
        model.draft,
        args.prompt_file,
        max_new_tokens,
        model.capture,
        model.backend,
        model.device_name,
        model.dtype_name,
        log=(lambda m: None) if args.json else print,
    )
    if args.json:
        print(
            json.dumps(
                {k: rec[k] for k in ("written_by", "steps", "acceptance", "config", "d2t_sha256", "target", "run")}
            )
        )


def _print_could_not_run(e: EaglekitError, as_json: bool) -> None:
    """Why the doctor could not run (exit status 2)."""
    if as_json:  # the report's shape (eaglekit.doctor.report), with nothing probed
        print(
            json.dumps(
                {
                    "status": "could_not_run",
                    "exit_code": 2,
                    "decide": [],
                    "verdict": f"doctor could not run: {e}",
                    "fault": False,
                    "conclusive": False,
                    "pair": {},
                    "findings": [
                        {"code": e.code, "severity": "error", "message": e.message, "fix": e.fix, "evidence": {}}
                    ],
                    "probe": [],
                }
            )
        )
    else:
        print(f"eaglekit doctor: could not run: {e}", file=sys.stderr)


def _name_each_finding_once(res: dict) -> None:
    """The same finding can reach the report twice (a refused pair is found by the checks and again when the
    trace's decoder refuses it): each is listed once, and named once in the verdict."""
    unique: dict[tuple, dict] = {}
    for f in res.get("findings", ()):
        unique.setdefault((f.get("code"), f.get("message")), f)
    res["findings"] = list(unique.values())
    for f in res["findings"]:
        item = f"; [{f.get('code')}] {f.get('message')}" + (f" (fix: {f['fix']})" if f.get("fix") else "")
        v = res.get("verdict") or ""
        if (i := v.find(item[2:])) >= 0 and (j := v.find(item, i + 1)) >= 0:
            res["verdict"] = v[:j] + v[j + len(item) :]


def _print_doctor(res: dict, as_json: bool) -> None:
    """The report on stdout: one JSON object, or the report (and the engine's comparison) as text."""
    if as_json:
        print(json.dumps(res))
        return
    import contextlib

    from ..observe.report import doctor_report

    with contextlib.redirect_stderr(sys.stdout):  # the report is the command's output: `doctor ... > file`
        doctor_report(res)
    if res.get("engine"):
        from ..integrations.vllm.doctor import print_engine

        print_engine(res["engine"])


def _doctor_args(p):
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    DoctorOptions.add_args(p, only=("prompt_file", "prompts", "max_new_tokens"))
    p.add_argument("--json", action="store_true", help='one object: {"verdict", "findings", "probe", ...}')
    ModelOptions.add_args(p, only=("capture_layers",))
    DoctorOptions.add_args(p, only=("time_budget",))
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--record",
        action="store_true",
        help="for a pair you trust (a draft made elsewhere): measure it on the probe prompts and write its "
        "training record (eaglekit_record.json) into the draft folder, which later runs of the doctor "
        "compare with; no verdict",
    )
    DoctorOptions.add_args(p, only=("reference_acceptance",))
    add_runtime(p, device=DOCTOR_DEVICE)
    add_tp(p)
    p.add_argument(
        "--engine",
        choices=["vllm"],
        default=None,
        help="also run the pair inside this engine (vLLM's offline LLM API, eager, greedy) and compare its "
        "own per-position acceptance with eaglekit's on the same prompts",
    )
    p.add_argument(
        "--engine-python",
        default=None,
        help="python of a venv with the engine (default: this one if it imports vllm, else $EAGLEKIT_VLLM_PYTHON)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=3,
        help="chain length k (vLLM num_speculative_tokens; eaglekit TreeShape(k, 1, k+1)); default 3",
    )


cmd_doctor.add_args = _doctor_args


# --- interop ---------------------------------------------------------------------------------------
@command("export", "write a draft for SGLang, vLLM or SpecForge with that engine's layer-id convention")
def cmd_export(args) -> int:
    """Writes OUT so that the engine captures exactly the tensors the draft was trained on. sglang: the
    LlamaForCausalLMEagle3 layout, eagle_config ids in the 'output of layer' meaning (= after_layers).
    specforge: the same, with the embedding. vllm: the speculators layout, 'input of layer' ids at the top
    level and nested. d2t as offsets, t2d derived. Reads any supported format (see eaglekit inspect)."""
    from ..interop.export import export
    from ..io import no_file_at, no_overlap
    from ..models import resolve_dtype
    from ..pair import load_pair

    capture_override(args)  # a malformed --capture-layers before anything loads
    no_file_at(args.out, "the output folder")
    no_overlap(args.out, "the output folder", {"--draft": args.draft, "--target": args.target})
    check_folders(args.target, args.draft)
    target, draft = load_pair(args.target, args.draft, args.backend, "cpu", "float32")
    assert draft is not None  # --draft is required
    from ..draft import check_pair

    draft.config.capture = check_pair(draft, target, capture_override(args), args.allow_other_target)
    warnings = export(
        draft, args.out, args.to, target, resolve_dtype(args.out_dtype), True if args.with_embedding else None
    )
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    spec = draft.config.capture
    ids = list(spec.input_of()) if args.to == "vllm" else list(spec.after_layers)
    print(
        f"wrote {args.to} draft to {args.out}: capture ids {ids} ("
        f"{'input of layer' if args.to == 'vllm' else 'output of layer'}) = after_layers {list(spec.after_layers)}",
        file=sys.stderr,
    )
    if args.to == "vllm":
        from ..interop.export import verifier_name

        name, kind = verifier_name(args.target)
        print(f"speculators_config.verifier.name_or_path = {name} ({kind})", file=sys.stderr)
    return 0


def _export_args(p):
    p.add_argument("out", help="output folder")
    p.add_argument("--draft", required=True)
    p.add_argument("--to", required=True, choices=["sglang", "vllm", "specforge"])
    p.add_argument(
        "--target",
        required=True,
        help="the target the draft serves (checked, and the source of the embedding and of the default capture)",
    )
    p.add_argument("--out-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--with-embedding", action="store_true", help="store embed_tokens.weight (sglang: off by default)")
    add_capture(p)
    ModelOptions.add_args(p, only=("backend", "threads"))  # (it runs the pair on the CPU: the fingerprints)
    p.set_defaults(device="cpu")  # (no --device: the pair runs on the CPU, the device its threads are chosen for)


cmd_export.add_args = _export_args
