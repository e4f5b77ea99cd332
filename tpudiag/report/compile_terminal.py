"""Renders a `CompileReport` (tpudiag.compile/1) for the terminal: per-module table, then per module the
top ops by estimated TPU time with slot-utilization bars and a one-line "what limits this op".
Every module, op, source, error and finding goes to rich as `plain` text, never as markup; tables
and lines are fitted to the width by `fit` (an op name or a path is never split, a figure never cut)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpudiag.report.fit import Col, header_panel, say, table
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import (fmt_bytes, fmt_ghz, fmt_int, fmt_pct, fmt_runs, fmt_s, fusion_summary_lines, printable,
                                  setup_lines, short_source)


def _busiest(util: dict | None, n: int = 2) -> Text:
    """The op's busiest VLIW slots from the final bundles, e.g. `mxu 82% vstore 44%`."""
    if not util:
        return Text("-", style="bright_black")
    text = Text()
    for i, (slot, value) in enumerate(sorted(util.items(), key=lambda kv: -kv[1])[:n]):
        text.append(f"{' ' if i else ''}{printable(slot)} {fmt_pct(value, 0)}", style="green" if value >= 0.5 else "")
    return text


def _collectives_table(m, console: Console, top: int) -> None:
    """The module's collectives, the most exposed first (the model's order)."""
    cols = [Col("op", "name", "left", most=40), Col("kind", "name", "left"), Col("size"), Col("group", drop=2),
            Col("axes", "name", "left", drop=3), Col("hops", drop=4), Col("est."), Col("exposed"),
            Col("schedule", "text", "left", drop=1)]
    rows = [[c.name, c.kind, fmt_bytes(c.message_bytes), f"{c.group_size} x{c.groups}",
             ",".join(c.mesh_axes) if c.mesh_axes else "-", "-" if c.ici_hops is None else str(c.ici_hops),
             fmt_runs(c.estimated_s, c.runs), fmt_s(c.exposed_s),
             f"async, {fmt_s(c.scheduled_between_s)} between" if c.is_async else "sync"]
            for c in m.collectives[:top]]
    table(console, cols, rows, title=f"{m.name}: collectives on the slice (ICI model)")
    if len(m.collectives) > top:
        say(console, f"{len(m.collectives) - top} more collective(s) in report.json", style="bright_black")


# A module's op table: where it does not fit, the busiest slots and the cycles (the estimate in
# other units) are left out before the op's name (up to 48 characters) is cut; `limit` (prose) wraps.
_OP_COLUMNS = [Col("op", "name", "left", most=48), Col("est."), Col("limit", "text", "left"), Col("cycles", drop=2),
               Col("bytes"), Col("busiest slots", justify="left", drop=3), Col("source", justify="left", drop=1)]


@renders("tpudiag.compile", "terminal")
def render_compile_terminal(report, console: Console, top: int = 10, modules: int = 3) -> None:
    """A `CompileReport` (tpudiag.compile/1). `modules`: how many modules (the slowest by estimated
    time) get an op table; the rest are in the module table and in report.json / --md."""
    t = report.target
    head = Text()
    head.append(printable(report.source.get('input', '?')), style="bold")
    head.append(f"   target {printable(t.chip)} ({printable(t.topology)}, {t.chips} chips)   status ")
    head.append(printable(report.status), style="green" if report.status == "ok" else "bold red")
    if report.shadow_exit_code:  # a script that failed: what it ran before that was compiled
        reason = (report.source.get("shadow_run") or {}).get("reason") or f"exit {report.shadow_exit_code}"
        head.append(f"\nthe program failed ({printable(reason)}); the computations it ran before that were compiled",
                    style="bold red")
    per = "chip" if t.devices_per_chip == 1 else f"device (1/{t.devices_per_chip} chip)"
    head.append(f"\n{t.peak_bf16_flops_per_s / 1e12:.0f} TFLOP/s bf16, {t.hbm_bytes_per_s / 1e9:.0f} GB/s HBM, "
                f"{t.hbm_bytes / 2**30:.0f} GiB per {per}; clock {fmt_ghz(t.clock_hz)}")
    if t.note:
        head.append(f"\n{printable(t.note)}", style="yellow")
    picked = report.source.get("selection")
    if picked:
        head.append(f"\ncompiled {len(picked['compiled'])} of {picked['modules']} module(s) ({printable(picked['asked'])})")
    header_panel(console, head, "tpudiag compile")

    cols = [Col("module", "name", "left", most=48), Col("status", "text", "left"), Col("est. TPU time"),
            Col("XLA optimal", drop=1), Col("peak HBM"), Col("ops", drop=2), Col("static profile", "text", "left")]
    rows = []
    setup = report.grouped_setup  # one row for all of them
    for m in report.modules:
        if m in setup:
            continue
        tot = m.totals
        full = getattr(tot, "estimated_s", None) is not None  # a compiled module, not only its memory
        rows.append([m.name, "ok" if m.ok else plain(f"failed: {m.error}", style="red"),
                     fmt_s(m.estimated_s), fmt_s(tot.xla_optimal_s if full else None),
                     Text(fmt_bytes(m.memory.get("peak_hbm_bytes")), style="" if m.fits else "bold red") if tot else "-",
                     str(tot.ops) if full else "-", m.static_profile])
    if setup:
        rows.append([f"{len(setup)} setup module(s)", "ok", fmt_s(sum(m.estimated_s or 0.0 for m in setup)), "-",
                     fmt_bytes(max(m.memory.get("peak_hbm_bytes") or 0 for m in setup)),
                     str(sum(m.totals.ops for m in setup if getattr(m.totals, "ops", None) is not None)),
                     ", ".join(dict.fromkeys(m.static_profile for m in setup))])
    table(console, cols, rows, title="Modules")
    for line in setup_lines(report):
        say(console, line, style="bright_black")

    ranked = [m for m in report.ranked_modules if m not in setup]
    for m in ranked[:modules]:
        console.print()
        rows = [[o.name, fmt_runs(o.estimated_s, o.runs), o.limit, fmt_int(o.estimated_cycles),
                 fmt_bytes(o.bytes_accessed), _busiest(o.utilization), short_source(o.source, keep=1)]
                for o in m.ops[:top]]
        table(console, _OP_COLUMNS, rows, title=f"{m.name}: top ops by estimated TPU time")
        if m.collectives:
            _collectives_table(m, console, top)
        if m.fusions:
            for line in fusion_summary_lines(m.fusions, top=2):
                say(console, line, style="bright_black")
        for f in m.findings:
            say(console, f"note: {f}", style="yellow")
    if len(ranked) > modules:
        say(console, Text(f"\n{len(ranked) - modules} more module(s): `tpudiag report --md` or report.json has every op",
                          style="bright_black"))
    for m in report.failed_modules:
        say(console, f"{m.name}: failed to compile: {m.error}", style="red")
    if report.suggestions is not None:
        from tpudiag.report.suggest_render import summary_lines

        console.print()
        say(console, Text("Suggestions", style="bold"))
        for line in summary_lines(report.suggestions, (report.artifacts or {}).get("run_dir")):
            say(console, f"  {line}")
    console.print()
    say(console, Text(f"Artifacts  {printable((report.artifacts or {}).get('run_dir', ''))}", style="bold"))


@renders("tpudiag.targets", "terminal")
def render_targets_terminal(doc: dict, console: Console) -> None:
    """The tpudiag.targets/1 document: one row per TPU generation."""
    title = "TPU targets (per chip: bf16 peak, HBM, ridge point, ICI, host link each way, clock)"
    table = Table(title=title, title_justify="left", show_edge=False)
    cols = [("target", "name"), ("topology", "default_topology"), ("TFLOP/s", "peak_bf16_flops_per_s"),
            ("HBM GiB", "hbm_bytes"), ("HBM GB/s", "hbm_bytes_per_s"), ("FLOP/B", "ridge_flops_per_byte"),
            ("ICI GB/s", "ici_bytes_per_s"), ("host GB/s", "host_link_bytes_per_s"), ("GHz", "clock_hz")]
    scale = {"peak_bf16_flops_per_s": 1e12, "hbm_bytes": 2**30, "hbm_bytes_per_s": 1e9, "ici_bytes_per_s": 1e9,
             "host_link_bytes_per_s": 1e9, "clock_hz": 1e9}
    for label, _ in cols:
        table.add_column(label, justify="left" if label in ("target", "topology") else "right", no_wrap=True)
    for r in doc["targets"]:
        cells = []
        for _, key in cols:
            v = r.get(key)
            if isinstance(v, (int, float)) and key in scale:
                v = f"{v / scale[key]:.{2 if key == 'clock_hz' else 0}f}"
            elif isinstance(v, float):
                v = f"{v:.0f}"
            cells.append(plain("-" if v is None else v))
        table.add_row(*cells)
    console.print(table)
