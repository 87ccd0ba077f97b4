"""`eaglekit trace diff A B`: two EAGLE3_DEBUG traces (JSON lines) side by side; name the first point where they part.

Records are matched at (cycle, point), the first record of each pair (eaglekit.observe.trace writes one per call;
the vLLM plugin, eaglekit.integrations.vllm.plugin, the same fields plus `engine`). What is comparable between two
engines decoding the same prompt with the same chain (reference: vLLM 0.32.0 against eaglekit):

  target.capture, every cycle   shape (tokens x C*H), layers (after_layers), statistics. Cycle 0 is the prefill;
                                cycle i the i-th verify (k + 1 tokens for a chain of k in both engines). When one
                                engine ran the prompt in chunks (vLLM's chunked prefill), its chunks are merged
                                into one record first (counts, means and variances pool exactly).
  draft points, cycle 0         shape and statistics: the draft extend over the prompt is the same computation.
  draft points, cycles >= 1     widths (last dimension) and layers only: vLLM runs its draft extend over all k + 1
                                verified slots (rejected ones as padding) while eaglekit runs it over the accepted
                                path, and the two order their draft steps differently inside a cycle.

Leading dimensions of size 1 (eaglekit's batch of one) are dropped before shapes are compared. A statistic parts
when |a - b| > atol + rtol * max(|a|, |b|); NaN / inf counts must be equal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import InputError

ORDER = (
    "target.capture",
    "draft.input.features",
    "draft.input.fc",
    "draft.input.embedding",
    "draft.concat",
    "draft.input.hidden",
)
STATS = ("mean", "std", "absmax")


def load(path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise InputError(
            f"trace file {p} does not exist", fix="write one with EAGLE3_DEBUG=1 EAGLE3_DEBUG_FILE=PATH", code="E101"
        )
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(
                f"{p}:{n} is not a JSON line", fix="pass a file written through EAGLE3_DEBUG_FILE", code="E105"
            ) from None
        if not isinstance(rec, dict) or "point" not in rec or "cycle" not in rec:
            raise InputError(
                f"{p}:{n} is not a trace record (no point / cycle)",
                code="E105",
                fix="pass a file written through EAGLE3_DEBUG_FILE",
            )
        out.append(rec)
    if not out:
        raise InputError(
            f"trace file {p} holds no records", fix="was EAGLE3_DEBUG=1 set when it was written?", code="E105"
        )
    return out


def _shape(r) -> list[int]:
    s = list(r.get("shape") or [])
    while len(s) > 1 and s[0] == 1:
        s = s[1:]
    return s


def _first(records) -> dict:
    """(cycle, point) -> the first record there; engine.config records are kept apart."""
    out: dict[tuple[int, str], dict] = {}
    for r in records:
        if r["point"] in ORDER:
            out.setdefault((int(r["cycle"]), r["point"]), r)
    return out


def _pool(recs: list[dict]) -> dict:
    """One record for consecutive chunks of the same capture: token counts add, statistics pool exactly."""
    ns = [_shape(r)[0] for r in recs]
    N = sum(ns)
    w = [n * math.prod(_shape(r)[1:]) for n, r in zip(ns, recs)]
    W = sum(w)
    mean = sum(wi * r["mean"] for wi, r in zip(w, recs)) / W
    var = sum(wi * (r["std"] ** 2 + (r["mean"] - mean) ** 2) for wi, r in zip(w, recs)) / W
    out = dict(recs[0])
    out.update(
        shape=[N] + _shape(recs[0])[1:],
        tokens=N,
        mean=mean,
        std=math.sqrt(var),
        absmax=max(r["absmax"] for r in recs),
        nan=sum(r["nan"] for r in recs),
        inf=sum(r["inf"] for r in recs),
        merged_cycles=[int(r["cycle"]) for r in recs],
    )
    out.pop("per_layer", None)
    return out


def _merge_chunked_prefill(a: dict, b: dict) -> tuple[dict, dict, str | None]:
    """If one side's prefill capture is shorter than the other's and its next captures add up to it, that side ran
    the prompt in chunks: merge them into cycle 0 and renumber its later cycles."""
    ta, tb = a.get((0, "target.capture")), b.get((0, "target.capture"))
    if not ta or not tb:
        return a, b, None
    for short, long_, name in ((a, b, "A"), (b, a, "B")):
        need = _shape(long_[(0, "target.capture")])[0]
        got, c = 0, 0
        chunks = []
        while (c, "target.capture") in short and got < need:
            chunks.append(short[(c, "target.capture")])
            got += _shape(chunks[-1])[0]
            c += 1
        if len(chunks) > 1 and got == need:
            merged = {}
            for (cy, pt), r in short.items():
                if cy < len(chunks) and pt == "target.capture":
                    continue
                if cy < len(chunks) - 1:
                    continue  # draft work between chunks has no counterpart
                merged[(max(cy - len(chunks) + 1, 0), pt)] = r
            merged[(0, "target.capture")] = _pool(chunks)
            note = f"{name}'s prefill ran in {len(chunks)} chunks (cycles 0-{len(chunks) - 1}), merged into cycle 0"
            return (merged, long_, note) if name == "A" else (long_, merged, note)
    return a, b, None


def _close(x, y, rtol, atol) -> bool:
    if x is None or y is None:
        return x is None and y is None
    if isinstance(x, float) and math.isnan(x) or isinstance(y, float) and math.isnan(y):
        return (isinstance(x, float) and math.isnan(x)) and (isinstance(y, float) and math.isnan(y))
    return abs(x - y) <= atol + rtol * max(abs(x), abs(y))


def _compare(ra, rb, full: bool, rtol, atol) -> list[str]:
    """The differences of one matched pair, most telling first (layers, then shape/width, then statistics)."""
    out = []
    la, lb = ra.get("layers"), rb.get("layers")
    if la is not None and lb is not None and list(la) != list(lb):
        out.append(f"layers (after_layers) {list(la)} vs {list(lb)}")
    sa, sb = _shape(ra), _shape(rb)
    if full:
        if sa != sb:
            out.append(f"shape {sa} vs {sb}")
    elif sa[-1:] != sb[-1:]:
        out.append(f"width {sa[-1:]} vs {sb[-1:]}")
    if full and sa == sb:
        for k in ("nan", "inf"):
            if ra.get(k, 0) != rb.get(k, 0):
                out.append(f"{k} count {ra.get(k)} vs {rb.get(k)}")
        for k in STATS:
            if not _close(ra.get(k), rb.get(k), rtol, atol):
                out.append(f"{k} {ra.get(k):.6g} vs {rb.get(k):.6g}")
        ha, hb = ra.get("head") or [], rb.get("head") or []
        if len(ha) == len(hb) and not all(_close(x, y, rtol, max(atol, 1e-5)) for x, y in zip(ha, hb)):
            out.append(f"head {ha} vs {hb}")
        pa, pb = ra.get("per_layer"), rb.get("per_layer")
        if pa and pb and len(pa) == len(pb):
            for x, y in zip(pa, pb):
                if not all(_close(x[k], y[k], rtol, atol) for k in STATS):
                    out.append(
                        f"layer {x.get('after_layer')}/{y.get('after_layer')} stats "
                        f"mean {x['mean']:.4g} vs {y['mean']:.4g}, std {x['std']:.4g} vs {y['std']:.4g}"
                    )
    return out


def engine_of(records) -> str:
    names = {r.get("engine", "eaglekit") for r in records}
    return "/".join(sorted(names))


def diff(path_a, path_b, rtol: float = 1e-3, atol: float = 1e-4) -> dict:
    ra, rb = load(path_a), load(path_b)
    a, b = _first(ra), _first(rb)
    a, b, note = _merge_chunked_prefill(a, b)
    both = sorted(set(a) & set(b), key=lambda k: (k[0], ORDER.index(k[1])))
    only_a = sorted({p for _, p in set(a) - set(b)} - {p for _, p in both}, key=ORDER.index)
    only_b = sorted({p for _, p in set(b) - set(a)} - {p for _, p in both}, key=ORDER.index)
    parts, compared_full, compared_width = [], 0, 0
    for cy, pt in both:
        full = pt == "target.capture" or cy == 0
        d = _compare(a[(cy, pt)], b[(cy, pt)], full, rtol, atol)
        compared_full += full
        compared_width += not full
        if d:
            parts.append(
                {
                    "cycle": cy,
                    "point": pt,
                    "differences": d,
                    "a": {k: a[(cy, pt)].get(k) for k in ("shape", "layers", "mean", "std", "absmax")},
                    "b": {k: b[(cy, pt)].get(k) for k in ("shape", "layers", "mean", "std", "absmax")},
                }
            )
    cyc = sorted({c for c, _ in both})
    compared = (
        (
            f"{len(both)} (cycle, point) pairs over cycles {cyc[0]}-{cyc[-1]}: {compared_full} in full (shape, "
            f"layers, statistics at rtol {rtol:g}, atol {atol:g}; target.capture at every cycle, the draft points "
            f"at cycle 0), {compared_width} by width and layers only (draft points at cycles >= 1, where the "
            f"engines batch the draft extend differently)"
        )
        if both
        else "nothing: no (cycle, point) in common"
    )
    cfg = [r for r in ra + rb if r["point"] == "engine.config"]
    return {
        "a": {"path": str(path_a), "engine": engine_of(ra), "records": len(ra)},
        "b": {"path": str(path_b), "engine": engine_of(rb), "records": len(rb)},
        "compared": compared,
        "pairs": [list(k) for k in both],
        "merged": note,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "agree": not parts and bool(both),
        "first": parts[0] if parts else None,
        "partings": len(parts),
        "parts": parts[:20],
        "engine_config": cfg[-1] if cfg else None,
    }


def format_diff(res: dict) -> str:
    a, b = res["a"], res["b"]
    lines = [
        f"A: {a['path']} ({a['engine']}, {a['records']} records)",
        f"B: {b['path']} ({b['engine']}, {b['records']} records)",
        f"compared: {res['compared']}",
    ]
    if res["merged"]:
        lines.append(f"aligned: {res['merged']}")
    if res["only_in_a"] or res["only_in_b"]:
        lines.append(f"not compared (one side only): A {res['only_in_a'] or '-'}, B {res['only_in_b'] or '-'}")
    c = res.get("engine_config")
    if c and c.get("aux_layer_ids") is not None:
        lines.append(
            f"engine config: {c['engine']} resolved aux layer ids {c['aux_layer_ids']} ('input of layer') = "
            f"after_layers {c.get('after_layers')} ({c.get('ids_source')})"
        )
    f = res["first"]
    if f is None:
        lines.append("agree: no difference at any compared point" if res["agree"] else "nothing to compare")
    else:
        what = "the target capture" if f["point"] == "target.capture" else f"the draft input ({f['point']})"
        lines.append(f"PART at cycle {f['cycle']} {f['point']} ({what}): {'; '.join(f['differences'])}")
        if res["partings"] > 1:
            lines.append(f"  {res['partings'] - 1} later (cycle, point) pairs differ too")
    return "\n".join(lines)
