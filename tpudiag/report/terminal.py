"""Renders a `ProfileReport` (tpudiag.report/1) for the terminal with rich: header, breakdown bar,
top ops with source lines, compile table, and where the artifacts are. It reads the model's
attributes and computes nothing. Every name, path, reason and warning goes to rich as `plain` text,
never as markup."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import BREAKDOWN_PARTS, fmt_pct, fmt_s, fusion_summary_lines, printable, short_source

_COLORS = {"compute": "green", "memory": "yellow", "communication": "magenta", "host": "cyan",
           "compile": "blue", "idle": "bright_black"}
_BAR_WIDTH = 60


def _bar(share: dict[str, float | None]) -> Text:
    text = Text()
    if share["idle"] is None:
        return Text("(empty trace window)")
    used = 0
    for i, (_, label) in enumerate(BREAKDOWN_PARTS):
        n = round(_BAR_WIDTH * share[label]) if i < len(BREAKDOWN_PARTS) - 1 else _BAR_WIDTH - used
        n = max(0, min(n, _BAR_WIDTH - used))
        used += n
        text.append("█" * n, style=_COLORS[label])
    return text


def _header(report) -> Panel:
    status_style = "green" if report.status == "ok" else "bold red"
    t = Text()
    t.append(printable(report.program or report.artifacts.get('xplane', '?')), style="bold")
    t.append("   status ")
    t.append(printable(report.status), style=status_style)
    if report.reason:
        t.append(f" ({printable(report.reason)})", style=status_style)
    t.append(f"\nbackend {printable(report.backend)}   devices {len(report.devices)}   traced {fmt_s(report.wall_s)}")
    if report.process_wall_s is not None:
        t.append(f" of {fmt_s(report.process_wall_s)} process wall")
    if report.steps.count:
        t.append(f"   steps {report.steps.count} (median {fmt_s(report.steps.median_s)})")
    return Panel(t, title="tpudiag profile", title_align="left")


def _breakdown(report) -> Group:
    bd, share = report.breakdown, report.breakdown_share
    cells = [Text(f"{label} {fmt_s(getattr(bd, key))} ({fmt_pct(share[label])})", style=_COLORS[label])
             for key, label in BREAKDOWN_PARTS]
    legend = Table.grid(padding=(0, 2))
    for _ in range(3):
        legend.add_column(justify="left")
    legend.add_row(*cells[:3])
    legend.add_row(*cells[3:])
    return Group(Text("Where the time went", style="bold"), _bar(share), legend)


# (column, justify, max width). Names are cut with an ellipsis (the JSON has them whole); numbers
# and source lines never are.
_OP_COLUMNS = (("op", "left", 40), ("module", "left", 18), ("category", "left", 14), ("count", "right", None),
               ("self", "right", None), ("share", "right", None), ("source", "left", None))
# Below this width the module column is dropped so the source line still fits (80-column CI logs).
_MODULE_COLUMN_MIN_WIDTH = 100


def _ops_table(report, top: int, width: int) -> Table:
    ops = report.ops
    table = Table(title=f"Top ops by self time ({min(top, len(ops))} of {len(ops)})", title_justify="left",
                  show_edge=False, expand=False)
    columns = [c for c in _OP_COLUMNS if c[0] != "module" or width >= _MODULE_COLUMN_MIN_WIDTH]
    for col, just, max_w in columns:
        # rich shrinks only wrappable columns: op/category may shrink, the rest keep their width.
        table.add_column(col, justify=just, no_wrap=col not in ("op", "category"), overflow="ellipsis",
                         max_width=max_w)
    for o in ops[:top]:
        cells = {"op": plain(o.name), "module": plain(o.module), "category": plain(o.category),
                 "count": str(o.occurrences), "self": fmt_s(o.self_s), "share": fmt_pct(o.share),
                 "source": plain(short_source(o.source, keep=1))}
        table.add_row(*[cells[c[0]] for c in columns])
    return table


def _compile_table(report, top: int) -> Table:
    hits = report.totals.compile_cache_hits
    title = f"Compilation: {fmt_s(report.totals.compile_s)} (tracing, lowering, backend compile)"
    table = Table(title=title + (f", {hits} persistent-cache hits" if hits else ""), title_justify="left",
                  show_edge=False)
    for col, just in (("function", "left"), ("compiles", "right"), ("tracing", "right"), ("lowering", "right"),
                      ("backend", "right")):
        table.add_column(col, justify=just)
    for c in report.compile[:top]:
        table.add_row(plain(c.function), str(c.compiles), fmt_s(c.tracing_s), fmt_s(c.lowering_s),
                      fmt_s(c.backend_compile_s))
    return table


def _tpu_estimate(report, top: int) -> Group:
    est, backend = report.tpu_estimate, report.backend
    t = est.target
    chip, backend = printable(t.chip), printable(backend)
    head = Text(f"Estimated on TPU {chip} ({printable(t.topology)})", style="bold")
    if est.step.tpu_estimated_s is not None and report.steps.median_s:
        head.append(f"   step: measured {fmt_s(report.steps.median_s)} on {backend}, "
                    f"estimated {fmt_s(est.step.tpu_estimated_s)} on {chip}")
    mods = Table(show_edge=False)
    for col, just in (("module", "left"), ("runs", "right"), (f"{backend} op time", "right"),
                      ("TPU est. / run", "right"), ("TPU est. total", "right"), ("status", "left")):
        mods.add_column(Text(col), justify=just, no_wrap=col != "status")
    for m in est.modules[:top]:
        mods.add_row(plain(m.name), str(m.executions), fmt_s(m.cpu_self_s), fmt_s(m.tpu_estimated_s),
                     fmt_s(m.tpu_estimated_total_s), plain(m.status if not m.error else f"failed: {m.error}"))
    lines = Table(title="By source line", title_justify="left", show_edge=False)
    for col, just in (("source", "left"), (f"{backend} op time", "right"), ("TPU est.", "right")):
        lines.add_column(Text(col), justify=just, no_wrap=True)
    for ln in est.lines[:top]:
        lines.add_row(plain(short_source(ln.source, keep=1)), fmt_s(ln.cpu_self_s), fmt_s(ln.tpu_estimated_s))
    parts = [head, mods, lines, plain(est.note, style="bright_black")]
    if est.suggestions is not None:
        from tpudiag.report.suggest_render import summary_lines

        parts += [Text("\nSuggestions", style="bold"),
                  *[plain(f"  {line}") for line in summary_lines(est.suggestions, report.artifacts.get("run_dir"))]]
    return Group(*parts)


def _artifacts(report) -> Text:
    a = report.artifacts
    t = Text("Artifacts", style="bold")
    a = {k: printable(v) if isinstance(v, str) else v for k, v in a.items()}
    run = a.get("run_dir")
    if run:
        t.append(f"\n  run directory  {run}")
        if a.get("report"):
            t.append(f"\n  report         {run}/{a['report']}")
        if a.get("xplane"):
            t.append(f"\n  trace          {run}/{a['xplane']}")
            t.append(f"\n  open with      xprof --logdir {run}/{a.get('trace_logdir', 'trace')}")
        if a.get("hlo_dump"):
            t.append(f"\n  HLO dump       {run}/{a['hlo_dump']}")
    elif a.get("xplane"):
        t.append(f"\n  trace          {a['xplane']}")
    return t


@renders("tpudiag.report", "terminal")
def render_terminal(report, console: Console, top: int = 15, top_compiles: int = 10) -> None:
    """A `ProfileReport` (tpudiag.report/1): the first `top` ops and `top_compiles` compiles."""
    console.print(_header(report))
    console.print(_breakdown(report))
    console.print()
    if report.ops:
        console.print(_ops_table(report, top, console.width))
    else:
        console.print("No op executed in the traced window.")
    if report.compile:
        console.print()
        console.print(_compile_table(report, top_compiles))
    if report.fusions:
        console.print()
        console.print(Text("Fusion breaks (tensors written to memory between kernels; `tpudiag fusions RUN` has all)",
                           style="bold"))
        for summary in report.fusions:
            for line in fusion_summary_lines(summary):
                console.print(Text(line))
    if report.tpu_estimate is not None:
        console.print()
        console.print(_tpu_estimate(report, top))
    for w in report.warnings:
        console.print(Text(f"warning: {printable(w)}", style="yellow"))
    console.print()
    console.print(_artifacts(report))
