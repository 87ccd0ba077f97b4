"""python -m benchmarks list | run SUITE [--quick] [--out FILE] [--param k=v] [--notes TEXT] | compare A B | table R"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

from . import registry, schema
from .report import compare_lines, markdown_table

RESULTS = Path(__file__).resolve().parent / "results"


def cmd_list(_args) -> int:
    registry.load()
    for s in registry.SUITES.values():
        print(f"{s.name:12s} [{s.needs}] {s.doc}")
        for name, over in s.cases:
            c = registry.CASES[name]
            extra = f" {over}" if over else ""
            print(f"    {name:22s} {c.doc}{extra}")
    return 0


def default_out(suite: str) -> Path:
    day = datetime.date.today().isoformat()
    return RESULTS / f"{day}_{suite}.json"


def cmd_run(args) -> int:
    registry.load()
    if args.suite not in registry.SUITES:
        print(f"unknown suite {args.suite!r}; suites: {', '.join(registry.SUITES)}", file=sys.stderr)
        return 2
    s = registry.SUITES[args.suite]
    overrides = {}
    for kv in args.param:
        k, sep, v = kv.partition("=")
        if not sep:
            print(f"--param {kv!r}: write key=value", file=sys.stderr)
            return 2
        overrides[k.replace("-", "_")] = registry.coerce(v)
    if s.needs == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(f"suite {s.name} needs a CUDA GPU; none is visible here", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else default_out(s.name)
    res = schema.new_result(s.name, args.notes or "", args.argv)
    t0, ctx, used = time.time(), {}, set()
    for name, suite_params in s.cases:
        c = registry.CASES[name]
        p, unknown = registry.params_for(c, suite_params, args.quick, overrides)
        used |= set(overrides) - unknown
        print(f"== {name} {p}", flush=True)
        row = registry.run_case(c, p, ctx)
        res["cases"].append(row)
        res["seconds"] = round(time.time() - t0, 1)
        schema.write(out, res)  # after every case: a run cut short keeps what it measured
        for m, v in row["metrics"].items():
            print(f"   {m:32s} {v['median']:>12g} {v['unit']}  (p10 {v['p10']:g}, p90 {v['p90']:g}, n {v['n']})")
        for k, v in row["identity"].items():
            print(f"   identity {k}: {v}")
        if "error" in row:
            print(f"   ERROR {row['error']}")
    unused = set(overrides) - used
    if unused:
        print(f"note: no case of {s.name} takes {', '.join(sorted(unused))}", file=sys.stderr)
    print(f"wrote {out} ({res['seconds']} s)")
    return 1 if any("error" in r for r in res["cases"]) else 0


def cmd_compare(args) -> int:
    print("\n".join(compare_lines(schema.read(args.a), schema.read(args.b))))
    return 0


def cmd_table(args) -> int:
    print(markdown_table(schema.read(args.result), link=args.link))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the suites and their cases").set_defaults(fn=cmd_list)
    r = sub.add_parser("run", help="run a suite, write one result file")
    r.add_argument("suite")
    r.add_argument("--out", default=None, help="result file (default benchmarks/results/DATE_SUITE.json)")
    r.add_argument("--quick", action="store_true", help="each case's small settings (fewer prompts and repeats)")
    r.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="override a case parameter")
    r.add_argument("--notes", default=None, help="free text kept in the result (the machine's state, the purpose)")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("compare", help="two result files side by side, B over A")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(fn=cmd_compare)
    t = sub.add_parser("table", help="a markdown table of a result file")
    t.add_argument("result")
    t.add_argument("--link", default=None, help="the path the table's rows link to (default: the file as given)")
    t.set_defaults(fn=cmd_table)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.cmd == "table" and args.link is None:
        args.link = args.result
    try:
        return args.fn(args)
    except schema.SchemaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
