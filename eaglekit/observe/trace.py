"""EAGLE3_DEBUG tracing at the capture points of the hidden-state contract.

    EAGLE3_DEBUG=1            turn tracing on (stderr lines)
    EAGLE3_DEBUG_STEPS=N      only the first N cycles (prefill is cycle 0); default: every cycle
    EAGLE3_DEBUG_FILE=path    also append the records as JSON lines

Points: `target.capture` (the concatenated aux features the target produced), `draft.input.features`
(what reaches the draft), `draft.input.embedding`, `draft.input.fc` (after the fc projection),
`draft.input.hidden` (the draft's own output fed back at tree steps) and `draft.concat` (the 2H-wide
[embedding, hidden] vector entering the draft layer).

Off costs nothing: call sites test the module flag `ENABLED` before building any argument, so no
statistics are computed, no device is synchronised and no string is formatted.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys

ENABLED: bool = False
RANK: int | None = None  # set under tensor parallelism (eaglekit.distributed): records name their rank
STEPS: int | None = None
FILE: str | None = None
_sink: list | None = None
_cycle: int = 0
_stream = sys.stderr


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def configure(
    enabled: bool | None = None,
    steps: int | None = None,
    file: str | None = None,
    sink: list | None = None,
    stream=None,
) -> None:
    """(Re)read the environment, or set tracing explicitly (tests, `eaglekit doctor`).

    `sink`: a list that receives each record as a dict, in addition to the other outputs."""
    global ENABLED, STEPS, FILE, _sink, _stream, _cycle
    ENABLED = _env_flag("EAGLE3_DEBUG") if enabled is None else bool(enabled)
    env_steps = os.environ.get("EAGLE3_DEBUG_STEPS")
    STEPS = steps if steps is not None else (int(env_steps) if env_steps else None)
    FILE = file if file is not None else (os.environ.get("EAGLE3_DEBUG_FILE") or None)
    _sink = sink
    _stream = stream if stream is not None else sys.stderr
    _cycle = 0


@contextlib.contextmanager
def paused():
    """No record inside (work that is not decoding, such as an engine's warm-up, whose rows hold no request)."""
    global ENABLED
    was, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = was


def set_cycle(i: int) -> None:
    global _cycle
    _cycle = i


def active() -> bool:
    return ENABLED and (STEPS is None or _cycle < STEPS)


def stats(t) -> dict:
    """Summary of a tensor; synchronises the device (only ever called when tracing is on)."""
    import torch

    x = t.detach()
    xf = x.float()
    finite = torch.isfinite(xf)
    nan = int(torch.isnan(xf).sum())
    inf = int(torch.isinf(xf).sum())
    vals = xf[finite] if (nan or inf) else xf
    n = vals.numel()
    return {
        "shape": list(x.shape),
        "dtype": str(x.dtype).replace("torch.", ""),
        "device": str(x.device),
        "mean": float(vals.mean()) if n else math.nan,
        "std": float(vals.std()) if n > 1 else 0.0,
        "absmax": float(vals.abs().max()) if n else math.nan,
        "nan": nan,
        "inf": inf,
        "head": [round(float(v), 5) for v in xf.reshape(-1)[:4]],
    }


def record(point: str, tensor, **meta) -> dict | None:
    if not active():
        return None
    if tensor.dim() > 2:  # tokens x width whatever batches them (rows of the engine, vLLM's flattened batch)
        tensor = tensor.reshape(-1, tensor.shape[-1])
    rec = {"cycle": _cycle, "point": point, **meta, **stats(tensor)}
    if RANK is not None:
        rec["rank"] = RANK
    extras = " ".join(f"{k}={v}" for k, v in meta.items())
    return _emit(
        rec,
        f"{point:<22} shape={tuple(rec['shape'])} dtype={rec['dtype']} device={rec['device']} {extras} "
        f"mean={rec['mean']:.4g} std={rec['std']:.4g} absmax={rec['absmax']:.4g} nan={rec['nan']} "
        f"inf={rec['inf']} head={rec['head']}",
    )


def _emit(rec: dict, text: str) -> dict:
    """One record to every output: the stream (a line), EAGLE3_DEBUG_FILE (JSON lines), the sink."""
    print(f"[EAGLE3_DEBUG]{'' if RANK is None else f' rank {RANK}'} cycle {rec['cycle']} {text}", file=_stream)
    if FILE:
        with open(FILE, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if _sink is not None:
        _sink.append(rec)
    return rec


def event(point: str, **meta) -> dict | None:
    """A record without a tensor (a decision: the engine switching speculation on or off, and why)."""
    if not active():
        return None
    rec = {"cycle": _cycle, "point": point, **meta}
    if RANK is not None:
        rec["rank"] = RANK
    return _emit(rec, f"{point:<22} " + " ".join(f"{k}={v}" for k, v in meta.items()))


configure()
