"""The live doctor on vLLM: run the pair in vLLM and in eaglekit on the same prompts, compare, name the cause.

    vLLM side      eaglekit.integrations.vllm.run in a subprocess with a python that has vLLM (the offline LLM API,
                   enforce_eager, greedy, a chain of k = num_speculative_tokens); acceptance per position from
                   vLLM's own counters: num_accepted_tokens_per_pos[i] / num_drafts.
    eaglekit side  our Decoder with TreeShape(k, 1, k + 1) on the same token ids, twice: under the wiring vLLM
                   resolved (the aux layer ids it logged, "input of layer i" = after_layers i - 1) and under the
                   reference wiring (the draft's own capture, or the probe's best when the probe finds a fault).

The first must equal vLLM (same function, same wiring: if not, vLLM computes something else, and the fc width,
vocab mapping and norm options it reports are compared with ours). The second is what the draft can do: vLLM
below it beyond NOISE is a wiring fault inside the engine, named with the ids vLLM resolved and the ids to write.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ...capture import CaptureSpec
from ...errors import EaglekitError, InputError
from ...options import DoctorOptions, ModelOptions

# acceptance is deterministic under greedy decoding; what remains is float rounding flipping an argmax now and
# then (fp32 on a CPU: none seen on the demo pair). Mean per-position acceptance, absolute.
NOISE = 0.02
REPO = Path(__file__).resolve().parents[2]


def engine_python(given: str | None = None) -> str:
    """--engine-python, else this interpreter if it imports vllm, else $EAGLEKIT_VLLM_PYTHON."""
    if given:
        if not Path(given).exists():
            raise InputError(
                f"--engine-python {given} does not exist", fix="pass the python of a venv with vLLM", code="E101"
            )
        return given
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    env = os.environ.get("EAGLEKIT_VLLM_PYTHON")
    if env:
        return engine_python(env)
    raise InputError(
        "no python with vLLM was found: this interpreter cannot import vllm and EAGLEKIT_VLLM_PYTHON is not set",
        fix="pass --engine-python PATH (a venv with vllm; on a CPU: bash "
        "tests/engine/setup_venv.sh VENV builds one) or set EAGLEKIT_VLLM_PYTHON",
        code="E170",
    )


@dataclass(frozen=True)
class VllmJob:
    """What one vLLM run decodes: the pair's folders, the prompts (token ids), the chain k = num_speculative_tokens,
    the tokens per prompt and the stop ids, the dtype; optionally an EAGLE3_DEBUG trace (file, steps) and the
    context length (None: the longest prompt's need rounded up to 64, at least 256). `to_json` is the job file
    eaglekit.integrations.vllm.run reads."""

    target: str | Path
    draft: str | Path | None
    prompts: list[list[int]]
    k: int
    max_tokens: int
    eos_ids: tuple | list = ()
    dtype: str = "float32"
    trace_file: str | None = None
    trace_steps: int | None = None
    max_model_len: int | None = None

    def to_json(self) -> dict:
        """the runner's job file (integrations.vllm.run): absolute paths (the subprocess runs in a temporary folder)."""
        longest = max(len(p) for p in self.prompts) + self.max_tokens + self.k + 8
        return {
            "target": str(Path(self.target).resolve()),
            "draft": str(Path(self.draft).resolve()) if self.draft else None,
            "k": self.k,
            "prompts": self.prompts,
            "max_tokens": self.max_tokens,
            "eos_ids": list(self.eos_ids),
            "dtype": self.dtype,
            "max_model_len": self.max_model_len or max(256, -(-longest // 64) * 64),
            "trace_file": str(Path(self.trace_file).resolve()) if self.trace_file else None,
            "trace_steps": self.trace_steps,
        }


def run_vllm(python: str, job: VllmJob, timeout: float = 1800) -> dict:
    """One vLLM run of `job` in a subprocess; returns the runner's result, or raises EaglekitError(E171) with vLLM's
    own last error lines when vLLM refuses or crashes (a mis-wired draft can do either)."""
    with tempfile.TemporaryDirectory(prefix="eaglekit-vllm-") as tmp:
        jp, op = Path(tmp) / "job.json", Path(tmp) / "out.json"
        jp.write_text(json.dumps(job.to_json()))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        t0 = time.time()
        try:
            p = subprocess.run(
                [python, "-m", "eaglekit.integrations.vllm.run", str(jp), str(op)],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise EaglekitError(
                f"vLLM did not finish within {timeout:.0f}s",
                code="E172",
                fix="fewer --prompts or a smaller --max-new-tokens",
            ) from None
        if p.returncode != 0 or not op.is_file():
            raise EaglekitError(
                f"vLLM could not run the pair: {_last_error(p.stderr + p.stdout)}",
                code="E171",
                fix="see the findings below for the cause eaglekit can see in the draft folder",
            )
        res = json.loads(op.read_text())
        res["seconds"] = round(time.time() - t0, 1)
        return res


def _last_error(text: str) -> str:
    """vLLM's own reason, from the end of its log: the last exception line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if any(w in ln for w in ("Error", "error:", "Exception", "assert")) and not ln.startswith("File "):
            return ln[-400:]
    return (lines[-1] if lines else "no output")[-400:]


def vllm_acceptance(counters: dict, k: int) -> dict:
    drafts = counters.get("vllm:spec_decode_num_drafts", 0) or 0
    per_pos = list(counters.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [0] * k)
    acc = counters.get("vllm:spec_decode_num_accepted_tokens", sum(per_pos)) or 0
    return {
        "verify_count": int(drafts),
        "accepted": int(acc),
        "accept_length": 1 + acc / drafts if drafts else 0.0,
        "per_position": [a / drafts if drafts else 0.0 for a in per_pos],
    }


def eaglekit_acceptance(target, draft, prompts, k: int, max_new: int, capture: CaptureSpec) -> dict:
    from ...decoding.decoder import Decoder
    from ...decoding.tree import TreeShape
    from ...observe.metrics import aggregate

    dec = Decoder(target, draft, TreeShape.make(k, 1, k + 1), capture=capture, allow_other_target=True)
    runs = [dec.generate(p, max_new) for p in prompts]
    m = aggregate([r.metrics for r in runs])
    return {
        "verify_count": m.verify_count,
        "accepted": sum(m.accepted),
        "accept_length": m.accept_length,
        "per_position": m.per_position,
        "outputs": [r.token_ids for r in runs],
        "after_layers": list(capture.after_layers),
    }


def compare(
    target_dir, draft_dir, prompts, k: int, max_new: int, python: str, target=None, draft=None, dtype: str = "float32"
) -> dict:
    """vLLM and eaglekit on the same prompts and chain: per-position acceptance side by side, identical outputs.
    eaglekit runs under the wiring vLLM resolved (so any difference is not the wiring)."""
    from ...options import PairRuntime
    from ...pair import load_pair

    if target is None:
        # F.linear's products, as when vLLM was first matched against us (onednn rounds fp32 differently)
        target, draft = load_pair(target_dir, draft_dir, "auto", "cpu", dtype, run=PairRuntime(products="aten"))
    v = run_vllm(python, VllmJob(target_dir, draft_dir, prompts, k, max_new, target.info.eos_token_ids, dtype))
    resolved = v["config"].get("after_layers")
    spec = CaptureSpec(tuple(resolved)) if resolved else draft.config.capture
    ours = eaglekit_acceptance(target, draft, prompts, k, max_new, spec)
    va = vllm_acceptance(v["counters"], k)
    va["outputs"] = v["outputs"]
    diff = max((abs(a - b) for a, b in zip(va["per_position"], ours["per_position"])), default=0.0)
    return {
        "k": k,
        "vllm": va,
        "eaglekit": ours,
        "engine_config": v["config"],
        "identical_outputs": va["outputs"] == ours["outputs"],
        "max_per_position_diff": diff,
        "vllm_seconds": v["seconds"],
        "vllm_version": v.get("vllm_version"),
    }


def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def _finding(code, severity, message, fix=None) -> dict:
    return {"code": code, "severity": severity, "message": message, "fix": fix}


def _ids_fix(after_layers, fmt=None) -> str:
    """The ids in the convention of the folder diagnosed (a vLLM folder: vLLM's 'input of layer' ids), with how
    vLLM reads them; a folder of another layout served by vLLM gets its own convention and the vLLM note."""
    from ...doctor.fixes import ids_fix

    return (
        ids_fix(after_layers, fmt, engine="vllm") + "; or re-export: eaglekit export OUT --to vllm --draft D --target T"
    )


def _crash_cause(doctor: dict) -> tuple[str, str] | None:
    """The static finding that explains an engine crash: the first error of the folder and pair checks (not the
    probe's: a probe finding is about acceptance, not about what an engine can load)."""
    from ...errors import CODES

    for f in doctor.get("findings") or []:
        if f.get("severity") == "error" and f.get("code") not in ("E290", "E282", "E222", "E284"):
            fix = f.get("fix") or (CODES.get(f["code"]) or (None, "see the finding"))[1]
            return f"the static check [{f['code']}] explains it: {f['message']}", fix
    return None


def engine_findings(
    doctor: dict, draft_dir, num_layers: int, hidden: int, draft, cmp: dict | None, error: EaglekitError | None, k: int
) -> tuple[list[dict], str | None]:
    """Findings of the engine comparison, and a verdict sentence when it found a fault."""
    if error is None and cmp is None:  # eaglekit refused the pair: the static findings carry the cause
        return [], None
    from ...interop.formats import read_folder

    try:
        fmt = read_folder(draft_dir)[2]
    except EaglekitError:
        fmt = None
    raw = json.loads((Path(draft_dir) / "config.json").read_text())
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    fc_in = draft.fc.in_features if draft is not None else _fc_width(draft_dir)
    if error is not None:
        cause, fix = _engine_crash(doctor, error, ids, fc_in, hidden, draft, fmt)
        return [_finding("E293", "error", cause, fix)], cause
    assert cmp is not None  # error is None here, and the first return took both None
    out = _function_findings(cmp, fc_in, draft)
    verdict = _wiring_verdict(cmp, ids, k)
    if verdict is not None:
        out.append(_finding("E291", "error", verdict, _ids_fix(cmp["reference"]["after_layers"], fmt)))
    return out, verdict


def _engine_crash(
    doctor: dict, error: EaglekitError, ids, fc_in: int | None, hidden: int, draft, fmt
) -> tuple[str, str]:
    """E293's cause and fix where vLLM refused or crashed on the pair: the config's aux ids where their width is not
    the fc's, else the first static error of the folder and pair checks, else a field vLLM reads otherwise."""
    cause = (
        error.message
        if error.message.startswith("vLLM ran")
        else f"vLLM could not run the pair ({error.message.split(': ', 1)[-1]})"
    )
    if ids and fc_in and len(ids) * hidden != fc_in:
        extra = " (id 0 is the embedding output)" if 0 in ids else ""
        cause += (
            f"; the cause visible in the folder: its config lists {len(ids)} aux layer ids {list(ids)}"
            f"{extra}, so vLLM captures {len(ids)} x {hidden} = {len(ids) * hidden} features, but the "
            f"draft's fc was trained on {fc_in} = {fc_in // hidden} x {hidden}"
        )
        good = (
            draft.config.capture
            if draft is not None and draft.config.capture and draft.config.capture.width(hidden) == fc_in
            else None
        )
        ref = _reference_wiring(doctor, good)
        if ref is None and 0 in ids and (len(ids) - 1) * hidden == fc_in:
            ref = tuple(i - 1 for i in ids if i != 0)  # the capture without the embedding fits the fc
        if ref is not None:
            return cause, _ids_fix(ref, fmt)
        return cause, f"list exactly {fc_in // hidden} ids, the layers the draft was trained on"
    static = _crash_cause(doctor)
    if static is not None:
        return cause + f"; {static[0]}", static[1]
    cause += (
        "; no static check of eaglekit explains it (the folder passes them): the folder uses a field "
        "or layout this vLLM reads otherwise"
    )
    return cause, (
        "re-export the draft in the layout vLLM reads (eaglekit export OUT --to vllm --draft D --target "
        "T) and run the doctor on the export; if that runs, compare the two config.json files"
    )


def _function_findings(cmp: dict, fc_in: int | None, draft) -> list[dict]:
    """Where vLLM computes another draft function than eaglekit under the same wiring: the fc's width (E294), the
    vocabulary mapping (E295), the acceptance or the outputs (E292)."""
    out: list[dict] = []
    conf = cmp["engine_config"]
    resolved = conf.get("after_layers")
    if conf.get("fc_in") is not None and fc_in is not None and conf["fc_in"] != fc_in:
        out.append(
            _finding(
                "E294",
                "error",
                f"vLLM built the draft's fc for {conf['fc_in']} input features, "
                f"eaglekit reads {fc_in} from the weights",
                "make num_aux_hidden_states / the number of ids in config.json agree with fc.weight's width",
            )
        )
    d2t = conf.get("d2t") or {}
    if draft is not None and d2t.get("sha256"):
        from ...draft.checkpoint import vocab_map_sha

        ours = vocab_map_sha(draft.d2t)
        if ours != d2t["sha256"]:
            out.append(
                _finding(
                    "E295",
                    "error",
                    f"vLLM's vocabulary mapping (d2t hash {d2t['sha256']}) differs from eaglekit's ({ours})",
                    "write d2t as offsets (target id = i + d2t[i]) in model.safetensors; eaglekit export does",
                )
            )
    elif draft is not None and draft.config.draft_vocab_size != draft.config.vocab_size and not d2t:
        out.append(
            _finding(
                "E295",
                "error",
                "vLLM has no vocabulary mapping for a reduced draft vocabulary",
                "store d2t in model.safetensors",
            )
        )
    v, same = cmp["vllm"], cmp["eaglekit"]
    dv = _mean(v["per_position"]) - _mean(same["per_position"])
    if abs(dv) > NOISE or not cmp["identical_outputs"]:
        out.append(
            _finding(
                "E292",
                "error",
                f"under the same wiring (after_layers {resolved}) vLLM accepts "
                f"{_pp(v['per_position'])} per position and eaglekit {_pp(same['per_position'])}"
                + ("" if cmp["identical_outputs"] else "; the decoded outputs differ")
                + ": vLLM computes another draft function (norm options, fc_norm, vocabulary mapping, "
                "dtype); vLLM reports "
                + json.dumps(
                    {
                        x: conf.get(x)
                        for x in ("fc_in", "norm_before_fc", "fc_norm", "norm_before_residual", "draft_vocab_size")
                    }
                ),
                "check the draft's norm options and d2t against what vLLM reports",
            )
        )
    return out


def _wiring_verdict(cmp: dict, ids, k: int) -> str | None:
    """E291's verdict where vLLM captures other layers than the draft was trained on (cmp's `reference`); None
    where it captures those."""
    conf, v = cmp["engine_config"], cmp["vllm"]
    resolved = conf.get("after_layers")
    ref = cmp.get("reference")
    if ref is None or resolved is None or list(ref["after_layers"]) == list(resolved):
        return None
    # the engine captures other layers than the draft was trained on: a fault whatever the size of the gap on
    # these few prompts (the teacher-forced probe, over every position, is what says which wiring is right)
    gap = _mean(ref["per_position"]) - _mean(v["per_position"])
    given = conf.get("aux_layer_ids")
    verdict = (
        f"inside vLLM the draft accepts {_pp(v['per_position'])} per position (accept length "
        f"{v['accept_length']:.4f}, chain of {k}), {gap:+.4f} below what it accepts fed the layers it was "
        f"trained on ({_pp(ref['per_position'])}, accept length {ref['accept_length']:.4f}): vLLM resolved "
        f"aux layer ids {given} ({conf.get('ids_source', '')}; read as 'input of layer i') = after_layers "
        f"{resolved}, the draft was trained at after_layers {list(ref['after_layers'])} = vLLM ids "
        f"{[i + 1 for i in ref['after_layers']]}"
    )
    if given and list(given) != sorted(set(given)):
        verdict += f"; vLLM sorts and de-duplicates the ids ({list(given)} -> {sorted(set(given))})"
    if ids and len(ids) == len(ref["after_layers"]):
        off = {a - (b + 1) for a, b in zip(ids, ref["after_layers"])}
        if off == {-1}:
            verdict += (
                "; the config's ids are one layer low: they look written in the 'output of layer' "
                "convention (SGLang config ids, SpecForge) where vLLM reads 'input of layer'"
            )
        elif off == {1}:
            verdict += "; the config's ids are one layer high"
    return verdict


def _fc_width(draft_dir) -> int | None:
    """fc's input width read from the weights alone (the draft may not load: that is what is being diagnosed)."""
    try:
        from ...interop.formats import normalize

        w = normalize(draft_dir)[1].get("fc.weight")
        return int(w.shape[1]) if w is not None else None
    except EaglekitError:
        return None


def _pp(xs) -> str:
    return "/".join(f"{x:.4f}" for x in xs)


def _reference_wiring(doctor: dict, fallback: CaptureSpec | None):
    """The wiring the draft was trained on, as far as eaglekit can tell: the probe's best (teacher-forced), which
    is the configured one unless the probe found a fault; else the draft's own recorded capture."""
    ran = [r for r in doctor.get("probe") or [] if "per_position" in r]
    if ran:
        conf = next((r for r in ran if r["wiring"] == "configured"), ran[0])
        best = max(ran, key=lambda r: (sum(r["per_position"]), r is conf))
        from ...doctor import MARGIN

        gain = (sum(best["per_position"]) - sum(conf["per_position"])) / len(conf["per_position"])
        return tuple(best["after_layers"] if gain > MARGIN else conf["after_layers"])
    return tuple(fallback.after_layers) if fallback is not None else None


def run_engine_doctor(
    model: ModelOptions, opts: DoctorOptions | None = None, k: int = 3, python: str | None = None
) -> dict:
    """`eaglekit doctor --engine vllm`: the doctor's own report (checks, trace, probe) extended with the engine run.
    Same JSON shape as `doctor`, plus an `engine` object; `fault` covers both. `model` and `opts` as for
    eaglekit.doctor.run_doctor (None: DoctorOptions()); `k`: the chain's length; `python`: one that imports vLLM
    (engine_python)."""
    from ...decoding.tree import TreeShape
    from ...doctor import _probe_prompts, run_doctor
    from ...draft import load_draft
    from ...models import load_target

    assert model.target is not None and model.draft is not None  # --target and --draft are required
    opts = opts or DoctorOptions()
    device = model.device_name  # a bad --device is refused before vLLM's python is looked for
    python = engine_python(python)  # before anything slow: exit 2 at once without vLLM
    t0 = time.time()
    res = run_doctor(model, opts, shape=TreeShape.make(k, 1, k + 1))
    if res["status"] == "could_not_run":  # a file of the pair cannot be read: nothing to hand to vLLM either
        return res
    res["eaglekit_alone"] = {k: res.get(k) for k in ("status", "exit_code", "verdict", "decide")}
    res["eaglekit_alone"]["findings"] = [dict(f) for f in res["findings"]]
    target = load_target(model.target, backend=model.backend, device=device, dtype=model.dtype_name)
    target_dir = target.folder or model.target  # a .gguf: vLLM is handed the folder made from it
    try:
        draft = load_draft(model.draft, device=target.device, dtype=target.dtype, embed_weight=target.embed_weight())
    except EaglekitError:
        draft = None
    prompts, _ = _probe_prompts(target_dir, opts.prompt_file, opts.prompts, target.info.vocab_size)
    engine: dict = {
        "name": "vllm",
        "python": python,
        "chain": k,
        "prompts": len(prompts),
        "max_new_tokens": opts.max_new_tokens,
    }
    v, err = _run_in_vllm(python, target, target_dir, model.draft, prompts, k, opts.max_new_tokens, engine)
    cmp = None
    if v is not None:
        cmp, err = _against_eaglekit(res, v, engine, target, draft, prompts, k, opts.max_new_tokens)
    found, text = engine_findings(res, model.draft, target.info.num_layers, target.info.hidden_size, draft, cmp, err, k)
    if cmp is not None and _sorted_by_vllm(res, cmp["engine_config"].get("after_layers")):
        _record_as_vllm_runs(res, target, draft, model.draft, target_dir, cmp["engine_config"]["after_layers"])
    res["findings"] += found
    res["engine"] = engine
    _engine_verdict(res, found, text, cmp, engine, k)
    res["seconds"] = round(time.time() - t0, 1)
    return res


def _run_in_vllm(
    python: str, target, target_dir, draft_dir, prompts: list[list[int]], k: int, max_new: int, engine: dict
) -> tuple[dict | None, EaglekitError | None]:
    """The pair in vLLM, in the target's dtype. -> (run_vllm's result, None), or (None, the error) where vLLM
    refused, crashed or timed out (E171, E172: the engine report's `error`)."""
    vdtype = str(target.dtype).replace("torch.", "")
    try:
        job = VllmJob(target_dir, draft_dir, prompts, k, max_new, target.info.eos_token_ids, vdtype)
        return run_vllm(python, job), None
    except EaglekitError as e:
        if e.code not in ("E171", "E172"):
            raise
        engine["error"] = e.message
        return None, e


def _against_eaglekit(
    res: dict, v: dict, engine: dict, target, draft, prompts: list[list[int]], k: int, max_new: int
) -> tuple[dict | None, EaglekitError | None]:
    """vLLM's acceptance against eaglekit's on the same prompts, under the wiring vLLM resolved and, where it is
    another, the one the draft was trained on; the figures into `engine`. -> (the comparison, None); (None, E171)
    where vLLM ran a draft eaglekit refuses to load; (None, None) where eaglekit refuses the pair."""
    va = vllm_acceptance(v["counters"], k)
    engine.update(
        {
            "vllm_version": v.get("vllm_version"),
            "vllm_seconds": v["seconds"],
            "resolved": v["config"],
            "vllm_acceptance": _strip(va),
        }
    )
    if draft is None:  # vLLM ran what eaglekit refuses: report vLLM's figures, the cause comes from the folder
        return None, EaglekitError(
            f"vLLM ran the draft (acceptance per position {_pp(va['per_position'])}, accept "
            f"length {va['accept_length']:.4f}) although eaglekit refuses it",
            code="E171",
        )
    resolved = v["config"].get("after_layers")
    try:
        same = eaglekit_acceptance(
            target,
            draft,
            prompts,
            k,
            max_new,
            CaptureSpec(tuple(resolved))
            if resolved
            else draft.config.capture or CaptureSpec.default(target.info.num_layers),
        )
    except EaglekitError as e:  # eaglekit refuses the pair (E217, E208 ...): a fault the findings name
        engine["eaglekit_refused"] = f"[{e.code}] {e.message}"
        return None, None
    va["outputs"] = v["outputs"]
    cmp = {
        "vllm": va,
        "eaglekit": same,
        "engine_config": v["config"],
        "identical_outputs": va["outputs"] == same["outputs"],
    }
    ref = _reference_wiring(res, draft.config.capture)
    if (
        ref is not None
        and resolved is not None
        and list(ref) != list(resolved)
        and CaptureSpec(ref).width(target.info.hidden_size) == draft.fc.in_features
    ):
        cmp["reference"] = eaglekit_acceptance(target, draft, prompts, k, max_new, CaptureSpec(ref))
    engine.update({"eaglekit_acceptance_same_wiring": _strip(same), "identical_outputs": cmp["identical_outputs"]})
    if "reference" in cmp:
        engine["eaglekit_acceptance_reference_wiring"] = _strip(cmp["reference"])
    return cmp, None


def _engine_verdict(res: dict, found: list[dict], text: str | None, cmp: dict | None, engine: dict, k: int) -> None:
    """The verdict, status and exit code of the doctor and the engine run together: a fault of either is a fault;
    conclusive where the comparison ran and nothing is left undecided."""
    from ...doctor.report import EXIT, status_of

    errors = [f for f in found if f["severity"] == "error"]
    static_errors = [f for f in res["findings"] if f["severity"] == "error" and f not in errors]
    undecided = [f for f in res["findings"] if f["code"] in _UNDECIDED]
    if errors:
        lead = text or "; ".join(f"[{f['code']}] {f['message']}" for f in errors)
        res["verdict"] = f"engine vLLM: {lead}. eaglekit alone: {res['verdict']}"
    elif cmp is not None:
        va = cmp["vllm"]
        res["verdict"] = (
            f"engine vLLM: acceptance per position {_pp(va['per_position'])} (accept length "
            f"{va['accept_length']:.4f}, {va['verify_count']} verifies, chain of {k}) equals eaglekit's "
            f"under the same wiring (after_layers {cmp['engine_config'].get('after_layers')}); "
            f"outputs identical. eaglekit alone: {res['verdict']}"
        )
    elif "eaglekit_refused" in engine:
        res["verdict"] = (
            f"engine vLLM ran the pair (acceptance per position "
            f"{_pp(engine['vllm_acceptance']['per_position'])}); eaglekit refuses it: "
            f"{engine['eaglekit_refused']}. eaglekit alone: {res['verdict']}"
        )
    res["fault"] = bool(errors or static_errors)
    res["conclusive"] = res["fault"] or (cmp is not None and not undecided)
    res["status"] = status_of(res["fault"], res["conclusive"])
    res["exit_code"] = EXIT[res["status"]]
    if res["status"] == "cannot_tell" and not res["verdict"].startswith("cannot tell"):
        res["verdict"] = "cannot tell: " + res["verdict"]
        if cmp is None and not res.get("decide"):
            res["decide"] = ["a vLLM run that completes and a pair eaglekit runs, to compare"]
    if res["status"] != "cannot_tell":
        res["decide"] = []


# the findings that leave a verdict undecided: the probe could not tell the wirings apart (W280), nothing tells
# the draft's target (W281), too little evidence for the d2t (W285)
_UNDECIDED = ("W280", "W281", "W285")


def _sorted_by_vllm(res: dict, resolved) -> bool:
    """The probe's fault 'ids out of ascending order' does not hold inside vLLM, which sorts them: where the probe's
    best wiring is what vLLM resolved, the finding becomes a warning about the folder (eaglekit and SGLang read it
    in the order written). True where it did."""
    moved = False
    for f in res["findings"]:
        ev = f.get("evidence") or {}
        if (
            f["code"] == "E290"
            and resolved is not None
            and ev.get("best") == list(resolved)
            and sorted(ev.get("configured") or []) == list(resolved)
        ):
            f.update(
                code="W282",
                severity="warning",
                message=(
                    f"the folder's ids are out of ascending order (after_layers {ev['configured']}): vLLM sorts them "
                    f"and runs the draft as trained (after_layers {list(resolved)}); eaglekit and SGLang read them in "
                    f"the order written, where it is a fault: {f['message']}"
                ),
            )
            res["verdict"] = res["verdict"].replace("[E290]", "[W282 in vLLM; E290 for eaglekit and SGLang]")
            moved = True
    return moved


def _record_as_vllm_runs(res: dict, target, draft, draft_dir, target_dir, resolved) -> None:
    """The training record's acceptance (E223 / I311) was measured in the order the folder writes the ids; where
    vLLM sorts them, what vLLM runs is the sorted wiring, so the record is held against that wiring instead: a drop
    that the order alone caused goes, a drop with another cause stays an error."""
    if not any(f["code"] in ("E223", "I311", "I312") for f in res["findings"]):
        return
    from ...doctor.recorded import acceptance_findings
    from ...doctor.report import Finding
    from ...train.record import read_record

    static = [
        Finding(f["code"], f["severity"], f["message"], f.get("fix"), f.get("evidence") or {}) for f in res["findings"]
    ]
    record = read_record(draft_dir)
    assert record is not None  # E223, I311 and I312 come from measuring the record again
    again = acceptance_findings(record, target, draft, CaptureSpec(tuple(resolved)), target_dir, static)
    kept = [f for f in res["findings"] if f["code"] not in ("E223", "I311", "I312")]
    for f in again:
        d = asdict(f)
        d["message"] = f"in vLLM's order (after_layers {list(resolved)}): {d['message']}"
        kept.append(d)
    res["findings"][:] = kept


def _strip(a: dict) -> dict:
    return {
        k: (round(v, 6) if isinstance(v, float) else [round(x, 6) for x in v] if k == "per_position" else v)
        for k, v in a.items()
        if k != "outputs"
    }


def print_engine(engine: dict) -> None:
    """Per-position acceptance side by side: vLLM's counters, eaglekit under vLLM's wiring, and the reference."""
    from rich.console import Console
    from rich.table import Table

    c = Console()
    if "error" in engine:
        c.print(f"[bold red]vLLM could not run the pair[/]: {engine['error']}")
        return
    r = engine["resolved"]
    cols = [("vLLM (its own counters)", engine["vllm_acceptance"])]
    if "eaglekit_acceptance_same_wiring" in engine:
        cols.append((f"eaglekit, same wiring {r.get('after_layers')}", engine["eaglekit_acceptance_same_wiring"]))
    if "eaglekit_acceptance_reference_wiring" in engine:
        ref = engine["eaglekit_acceptance_reference_wiring"]
        cols.append((f"eaglekit, trained wiring {ref['after_layers']}", ref))
    t = Table(
        title=f"vLLM {engine.get('vllm_version')} vs eaglekit: chain of {engine['chain']}, {engine['prompts']} "
        f"prompts, {engine['max_new_tokens']} new tokens; vLLM resolved aux ids {r.get('aux_layer_ids')} "
        f"({r.get('ids_source')}), fc {r.get('fc_in')} -> {r.get('fc_out')}"
    )
    t.add_column("")
    for name, _ in cols:
        t.add_column(name, justify="right")
    t.add_row("verifies", *[str(a["verify_count"]) for _, a in cols])
    t.add_row("accept length", *[f"{a['accept_length']:.4f}" for _, a in cols])
    for i in range(engine["chain"]):
        t.add_row(
            f"acceptance at position {i + 1}",
            *[f"{a['per_position'][i]:.4f}" if i < len(a["per_position"]) else "" for _, a in cols],
        )
    if "identical_outputs" in engine:
        t.add_row("outputs identical", "yes" if engine["identical_outputs"] else "NO")
    c.print(t)


def zoo_main(argv=None) -> int:
    """The fault zoo (eaglekit.doctor.zoo) through the engine doctor: `python -m eaglekit.integrations.vllm.doctor
    [zoo options] [--engine-python PY]`. The zoo's cases marked `engine` run; each starts vLLM once (~1-3 min on two
    cores)."""
    import argparse

    from ...doctor.zoo import main

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--engine-python", default=None)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--budget", type=float, default=45.0, help="the doctor probe's time budget")
    known, rest = ap.parse_known_args(argv)
    python = engine_python(known.engine_python)

    opts = DoctorOptions(prompts=known.prompts, max_new_tokens=known.max_new_tokens, time_budget=known.budget)

    def runner(model: ModelOptions) -> dict:
        return run_engine_doctor(model, opts, python=python)

    return main(rest, runner=runner, title="eaglekit doctor --engine vllm")


if __name__ == "__main__":
    try:
        sys.exit(zoo_main())
    except EaglekitError as e:  # (a coded error says what to do: no traceback, as the eaglekit command prints it)
        print(f"eaglekit doctor --engine vllm: error {e}", file=sys.stderr)
        sys.exit(2)
