"""Tables for people: metrics of a run, phase breakdowns, per-position acceptance (rich, to stderr)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .metrics import GenerationMetrics, fmt

_console = Console(stderr=True)


def print_table(table: Table) -> None:
    _console.print(table)


def metrics_table(m: GenerationMetrics, title: str = "generation") -> Table:
    t = Table(title=title, show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("new tokens", str(m.new_tokens))
    t.add_row("tokens/s", f"{m.tokens_per_s:.1f}")
    if m.speculative:
        t.add_row("verify count", str(m.verify_count))
        t.add_row("accept length (tokens per verify)", fmt(m.accept_length))
        t.add_row("accept rate", fmt(m.accept_rate, ".1%"))
        for k, v in enumerate(m.per_position, 1):
            t.add_row(f"  acceptance at position {k}", f"{v:.1%}")
        t.add_row("accepted-length histogram", " ".join(f"{a}:{n}" for a, n in enumerate(m.histogram)))
    return t


def phase_table(phases: dict[str, float], title: str = "cycle profile") -> Table:
    total = sum(phases.values()) or 1.0
    t = Table(title=title)
    t.add_column("phase")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for k, v in sorted(phases.items(), key=lambda kv: -kv[1]):
        t.add_row(k, f"{v * 1e3:.1f}", f"{v / total:.1%}")
    return t


def per_position_table(rows: dict[str, list[float]], title: str = "acceptance per draft position") -> Table:
    width = max((len(v) for v in rows.values()), default=0)
    t = Table(title=title)
    t.add_column("")
    for k in range(1, width + 1):
        t.add_column(f"pos {k}", justify="right")
    for name, vals in rows.items():
        t.add_row(name, *[f"{v:.1%}" for v in vals], *[""] * (width - len(vals)))
    return t


def sweep_table(res: dict) -> Table:
    t = Table(
        title=f"sweep: {res['prompts']} prompts x {res['max_new_tokens']} tokens, temperature "
        f"{res['temperature']}, baseline {res['baseline_tokens_per_s']:.1f} tok/s on {res['device']}"
    )
    for c in ("steps", "topk", "draft tokens", "accept length", "tokens/s", "speedup"):
        t.add_column(c, justify="right")
    best = res["best"]
    for r in sorted(res["rows"], key=lambda r: -r["tokens_per_s"]):
        mark = " <- best" if r is best or r == best else ""
        t.add_row(
            str(r["steps"]),
            str(r["topk"]),
            str(r["draft_tokens"]),
            fmt(r["accept_length"]),
            f"{r['tokens_per_s']:.1f}",
            f"{r['speedup']:.2f}x{mark}",
        )
    return t


def products_line(products: dict | None) -> str:
    """ "products: KIND (reason)" for a products choice as JSON ({"kind", "reason"}: eaglekit.kernels.products.Choice);
    kind None is F.linear, or what inductor makes of it where the layers are compiled (the reason says which)."""
    if not products:
        return "products: not chosen (the draft did not load)"
    return f"products: {products.get('kind') or 'default'} ({products.get('reason')})"


def doctor_report(res: dict) -> None:
    c = _console
    pair = res.get("pair")
    if pair:  # what ran: a verdict's figures (and a cannot-tell's timings) depend on it
        c.print(
            f"pair: target backend {pair.get('target_backend')} on {pair.get('device')}, {pair.get('dtype')}; "
            f"{products_line(pair.get('products'))}",
            markup=False,
            highlight=False,
        )
    if res["findings"]:
        t = Table(title="findings")
        for col in ("code", "severity", "message"):
            t.add_column(col)
        for f in res["findings"]:
            t.add_row(f["code"], f["severity"], f["message"] + (f"\nfix: {f['fix']}" if f.get("fix") else ""))
        c.print(t)
    if res["trace"]:
        t = Table(title="trace at the capture points (first cycles)")
        for col in ("cycle", "point", "shape", "layers", "mean", "std", "absmax", "nan/inf"):
            t.add_column(col)
        for r in res["trace"][:8]:
            t.add_row(
                str(r["cycle"]),
                r["point"],
                str(tuple(r["shape"])),
                str(r.get("layers") or ""),
                f"{r['mean']:.3g}",
                f"{r['std']:.3g}",
                f"{r['absmax']:.3g}",
                f"{r['nan']}/{r['inf']}",
            )
        c.print(t)
    if res["probe"]:
        t = Table(
            title=f"probe: acceptance per wiring, teacher-forced over the target's continuations "
            f"({res.get('probe_prompts')})"
        )
        for col in (
            "wiring",
            "after_layers",
            "per position",
            "simulated / decoded accept length",
            "configured minus this (paired, ± s.e.)",
        ):
            t.add_column(col)
        for r in res["probe"]:
            if "accept_length" in r:
                dec = f" / {r['decoded_accept_length']:.2f}" if "decoded_accept_length" in r else ""
                pm = (
                    f"{r['diff']:+.3f} ± {r['se']:.3f} (z {r['z']:.1f})" + ("" if r.get("decided") else ", undecided")
                    if "diff" in r
                    else ""
                )
                t.add_row(
                    r["wiring"],
                    str(r["after_layers"]),
                    " ".join(f"{x:.1%}" for x in r["per_position"]),
                    f"{r['accept_length']:.2f}{dec}",
                    pm,
                )
            else:
                t.add_row(r["wiring"], str(r["after_layers"]), f"refused [{r['refused']}]", "", "")
        c.print(t)
    if res.get("profile_ms"):
        c.print(phase_table({k: v / 1e3 for k, v in res["profile_ms"].items()}, title="cycle profile (16 tokens)"))
    if res.get("status") == "could_not_run":
        c.print("[bold red]COULD NOT RUN[/]: " + res["verdict"].removeprefix("doctor could not run: "))
    else:
        c.print(
            (
                "[bold red]FAULT[/]: "
                if res["fault"]
                else "[bold yellow]CANNOT TELL[/]: "
                if not res.get("conclusive", True)
                else "[bold green]OK[/]: "
            )
            + res["verdict"]
        )
    c.print(f"({res['seconds']}s)")
