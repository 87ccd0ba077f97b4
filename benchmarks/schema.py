"""The one result schema of the suite, "eaglekit-bench/1":

    {"schema": "eaglekit-bench/1", "suite": str, "date": ISO-8601 UTC, "git_sha": str | None, "command": str,
     "machine": {"cpu", "cpu_count", "gpu", "torch", "transformers", "triton", "python", "platform", ...},
     "notes": str, "seconds": float,
     "cases": [{"case": str, "params": {...}, "metrics": {name: {"median", "p10", "p90", "n", "unit"}},
                "identity": {name: bool | int | str}, "details": {...}, "error": str (only when the case failed)}]}

A metric measured once has n = 1 and p10 = p90 = median. `identity` holds the exactness checks a case makes (greedy
output equal to the target's, token for token); `details` anything else worth keeping (phase tables, the GPU's clocks).
Files are written with eaglekit.io.atomic_write_json: a reader never sees half a result.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

SCHEMA = "eaglekit-bench/1"
ROOT = Path(__file__).resolve().parents[1]
METRIC_KEYS = ("median", "p10", "p90", "n", "unit")


class SchemaError(ValueError):
    """A file that is not a result of this schema (or a malformed one)."""


def _quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), so p10/p90 of a few samples stay inside them."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def stats(samples, unit: str) -> dict:
    """A metric from repeated measurements: median, 10th and 90th percentile, count, unit."""
    xs = [float(x) for x in samples]
    if not xs:
        raise ValueError("a metric needs at least one sample")
    return {"median": _r(statistics.median(xs)), "p10": _r(_quantile(xs, 0.1)), "p90": _r(_quantile(xs, 0.9)),
            "n": len(xs), "unit": unit}


def value(x: float, unit: str) -> dict:
    """A metric measured once (an aggregate over a run, a ratio of two medians)."""
    return stats([x], unit)


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=ROOT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_sha() -> str | None:
    sha = _run(["git", "rev-parse", "HEAD"])
    if sha and _run(["git", "status", "--porcelain", "--untracked-files=no"]):
        sha += "+dirty"  # the working tree differs from the commit: the figures are not that commit's alone
    return sha


def git_head(tree: Path) -> str | None:
    """The short commit of another checkout (a case that runs one beside this one): its own repository's HEAD, or for
    a tree exported by `git archive` (no repository of its own: git would answer for the one around it) the commit
    its COMMIT file names; None where neither says."""
    top = subprocess.run(["git", "-C", str(tree), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode == 0 and Path(top.stdout.strip()).resolve() == Path(tree).resolve():
        r = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return r.stdout.strip() or None
    named = Path(tree) / "COMMIT"
    return (named.read_text().strip() or None) if named.is_file() else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What ran the suite: every figure depends on it, so every result carries it."""
    import torch

    info = {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}
    for mod in ("transformers", "triton"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 -- an optional package absent or broken: the result says so instead of failing
            info[mod] = None
    if hasattr(os, "getloadavg"):
        info["load_average_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    if info["gpu"]:
        info["cuda"] = torch.version.cuda
        nv = _run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,memory.total", "--format=csv,noheader"])
        info["nvidia_smi"] = nv
    return info


def new_result(suite: str, notes: str = "", argv: list[str] | None = None) -> dict:
    """`argv`: the suite's command-line arguments (default sys.argv's), kept as the command that made the file."""
    return {"schema": SCHEMA, "suite": suite,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_sha": git_sha(),
            "command": " ".join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)]),
            "machine": machine(), "notes": notes, "cases": []}


def validate(res: dict) -> dict:
    """Refuse what is not a result of this schema, naming the first thing wrong."""
    if not isinstance(res, dict) or res.get("schema") != SCHEMA:
        found = res.get("schema") if isinstance(res, dict) else type(res).__name__
        raise SchemaError(f"not an {SCHEMA} result (schema: {found!r}); the files before the suite "
                          f"(benchmarks/results/README.md) have shapes of their own")
    for key in ("suite", "date", "machine", "cases"):
        if key not in res:
            raise SchemaError(f"result lacks {key!r}")
    for c in res["cases"]:
        if "case" not in c or "metrics" not in c:
            raise SchemaError(f"a case lacks 'case' or 'metrics': {str(c)[:80]}")
        for name, m in c["metrics"].items():
            missing = [k for k in METRIC_KEYS if k not in m]
            if missing:
                raise SchemaError(f"case {c['case']!r} metric {name!r} lacks {', '.join(missing)}")
    return res


def write(path, res: dict) -> Path:
    from eaglekit.io import atomic_write_json

    atomic_write_json(path, validate(res))
    return Path(path)


def read(path) -> dict:
    try:
        res = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SchemaError(f"cannot read {path}: {e}") from None
    return validate(res)
