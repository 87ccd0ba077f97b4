"""The registry: cases (small functions of their params) and suites (ordered lists of cases).

    @case("demo-decode", doc="...", defaults={"prompts": 32}, quick={"prompts": 4})
    def demo_decode(p, ctx) -> dict:           # p: the params; ctx: shared by the cases of one run
        return {"metrics": {...}, "identity": {...}, "details": {...}}

A case reads its params from `p` only (defaults, then --quick's overrides, then --param key=value), so a result's
params say exactly what ran. `ctx` lets a later case reuse what an earlier one built (the 8B target, the step time).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Case:
    name: str
    fn: Callable
    doc: str
    defaults: dict = field(default_factory=dict)
    quick: dict = field(default_factory=dict)
    needs: str = "cpu"  # "cpu": runs anywhere; "cuda": needs a GPU


@dataclass
class Suite:
    name: str
    doc: str
    cases: list[tuple[str, dict]]  # (case name, the suite's params for it over the case's defaults)
    needs: str = "cpu"


CASES: dict[str, Case] = {}
SUITES: dict[str, Suite] = {}


def case(name: str, doc: str, defaults: dict | None = None, quick: dict | None = None, needs: str = "cpu"):
    def register(fn):
        CASES[name] = Case(name, fn, doc, dict(defaults or {}), dict(quick or {}), needs)
        return fn
    return register


def suite(name: str, doc: str, cases, needs: str = "cpu") -> None:
    SUITES[name] = Suite(name, doc, [(c, {}) if isinstance(c, str) else c for c in cases], needs)


def load() -> None:
    """Import the case modules (each registers its cases and suites)."""
    from .cases import batch, compare, cpu, h200, poison, prefill, real, serve  # noqa: F401


def coerce(text: str):
    """--param values: ints, floats, booleans, None, comma lists of ints ('1,4,8'), or the text itself."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if "," in text:
        return [coerce(x) for x in text.split(",")]
    return text


def params_for(c: Case, suite_params: dict, quick: bool, overrides: dict) -> dict:
    p = dict(c.defaults)
    p.update(suite_params)
    if quick:
        p.update(c.quick)
    unknown = set(overrides) - set(p)
    p.update({k: v for k, v in overrides.items() if k in p})
    return p, unknown


def run_case(c: Case, p: dict, ctx: dict) -> dict:
    """One case, guarded: an exception becomes the case's `error`, and the suite goes on."""
    t0 = time.time()
    row = {"case": c.name, "params": p, "metrics": {}, "identity": {}}
    try:
        out = c.fn(p, ctx) or {}
        row["metrics"] = out.get("metrics", {})
        row["identity"] = out.get("identity", {})
        if out.get("details"):
            row["details"] = out["details"]
    except Exception as e:  # noqa: BLE001 -- keep going: the other cases still report
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {e}"
    row["seconds"] = round(time.time() - t0, 1)
    return row


def shapes(v) -> list[str]:
    """A `shapes` param as 'steps,topk,draft_tokens' strings: '3,1,4;5,4,8', or one shape that --param made a list."""
    if isinstance(v, list):
        return [",".join(str(x) for x in v)]
    return [s for s in str(v).split(";") if s]


def as_list(v) -> list:
    """A list param that --param may have made a single value ('--param sizes=8')."""
    return v if isinstance(v, list) else [v]
