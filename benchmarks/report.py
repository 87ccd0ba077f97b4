"""Result files as text: two side by side (compare) and one as a markdown table (table)."""

from __future__ import annotations


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _spread(m: dict) -> str:
    return f"{_fmt(m['median'])} ({_fmt(m['p10'])}-{_fmt(m['p90'])}, n {m['n']})" if m["n"] > 1 else _fmt(m["median"])


def _machine(res: dict) -> str:
    m = res["machine"]
    return f"{m.get('gpu') or m.get('cpu')}, torch {m.get('torch')}, {res['date']}, {res.get('git_sha') or '?'}"


def compare_lines(a: dict, b: dict) -> list[str]:
    """Every metric of every case the two results share, A's and B's median with p10-p90, and B / A of the medians.
    A case that ran with other params in each is shown, its params named: a ratio then compares settings too."""
    out = [f"A: {a['suite']}  {_machine(a)}", f"B: {b['suite']}  {_machine(b)}", ""]
    rows = [("case / metric", "unit", "A", "B", "B/A")]
    bcases = {c["case"]: c for c in b["cases"]}
    for ca in a["cases"]:
        cb = bcases.get(ca["case"])
        if cb is None:
            rows.append((f"{ca['case']} (only in A)", "", "", "", ""))
            continue
        differ = {k: (ca["params"].get(k), cb["params"].get(k)) for k in set(ca["params"]) | set(cb["params"])
                  if ca["params"].get(k) != cb["params"].get(k)}
        rows.append((ca["case"] + (f"  params differ: {differ}" if differ else ""), "", "", "", ""))
        for name, ma in ca["metrics"].items():
            mb = cb["metrics"].get(name)
            if mb is None:
                rows.append((f"  {name}", ma["unit"], _spread(ma), "-", ""))
                continue
            ratio = f"{mb['median'] / ma['median']:.3f}" if ma["median"] else "-"
            rows.append((f"  {name}", ma["unit"], _spread(ma), _spread(mb), ratio))
        for k in sorted(set(ca["identity"]) | set(cb["identity"])):
            rows.append((f"  identity {k}", "", _fmt(ca["identity"].get(k)), _fmt(cb["identity"].get(k)), ""))
        for side, c in (("A", ca), ("B", cb)):
            if "error" in c:
                rows.append((f"  error in {side}", "", c["error"][:60], "", ""))
    rows += [(f"{c['case']} (only in B)", "", "", "", "") for c in b["cases"]
             if c["case"] not in {x["case"] for x in a["cases"]}]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        out.append("  ".join(r[i].ljust(widths[i]) if i == 0 else r[i].rjust(widths[i]) for i in range(5)).rstrip())
    return out


def markdown_table(res: dict, link: str | None = None) -> str:
    """One row per metric: the case (linked to the result file), the metric, median, p10-p90, n; identity checks
    as rows of their own. What the README's headline table and the docs' tables are regenerated from."""
    lines = [f"<!-- python -m benchmarks table {link or ''}: {res['suite']}, {_machine(res)} -->",
             "| case | metric | median | p10 - p90 | n |", "|---|---|---|---|---|"]
    for c in res["cases"]:
        name = f"[{c['case']}]({link})" if link else c["case"]
        for metric, m in c["metrics"].items():
            unit = f" ({m['unit']})" if m["unit"] else ""
            lines.append(f"| {name} | {metric}{unit} | {_fmt(m['median'])} | {_fmt(m['p10'])} - {_fmt(m['p90'])} "
                         f"| {m['n']} |")
        for k, v in c["identity"].items():
            lines.append(f"| {name} | identity: {k} | {_fmt(v)} | | |")
        if "error" in c:
            lines.append(f"| {name} | error | {c['error'][:80]} | | |")
    return "\n".join(lines)
