"""Renders a `ProfileReport` (tpudiag.report/1) for the terminal with rich: header, breakdown bar,
top ops with source lines, compile table, and where the artifacts are. It reads the model's
attributes and computes nothing. Every name, path, reason and warning goes to rich as `plain` text,
never as markup; tables and lines are fitted to the width by `fit` (a name or a path is never split,
a figure never cut)."""

from __future__ import annotations

import shlex

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from tpudiag.report.fit import Col, header_panel, say, table
from tpudiag.report.registry import renders
from tpudiag.report.units import (BREAKDOWN_PARTS, device_lines, fmt_pct, fmt_s, fusion_summary_lines, printable,
                                  setup_line, short_source)

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


def _header(report, console: Console) -> None:
    status_style = "green" if report.status == "ok" else "bold red"
    t = Text()
    t.append(printable(report.program or report.artifacts.get('xplane', '?')), style="bold")
    t.append("   status ")
    t.append(printable(report.status), style=status_style)
    if report.reason:
        t.append(f" ({printable(report.reason)})", style=status_style)
    elif report.status == "ok" and not report.artifacts.get("xplane"):
        # The program ran to its end but left no trace: tpudiag exits 2 ("nothing was traced").
        t.append(" (the program ran; nothing was traced)", style="bold yellow")
    t.append(f"\nbackend {printable(report.backend)}   devices {len(report.devices)}   traced {fmt_s(report.wall_s)}")
    if report.process_wall_s is not None:
        t.append(f" of {fmt_s(report.process_wall_s)} process wall")
    if report.steps.count:
        t.append(f"   steps {report.steps.count} (median {fmt_s(report.steps.median_s)})")
    header_panel(console, t, "tpudiag profile")


def _breakdown(report) -> Group:
    bd, share = report.breakdown, report.breakdown_share
    cells = [Text(f"{label} {fmt_s(getattr(bd, key))} ({fmt_pct(share[label])})", style=_COLORS[label])
             for key, label in BREAKDOWN_PARTS]
    legend = Table.grid(padding=(0, 2))
    for _ in range(3):
        legend.add_column(justify="left")
    legend.add_row(*cells[:3])
    legend.add_row(*cells[3:])
    title = "Where the time went" if report.device is None else "The whole trace window (host and device)"
    return Group(Text(title, style="bold"), _bar(share), legend)


# Names are cut with an ellipsis past `most` (the JSON has them whole); numbers and source lines
# never are. Where the table does not fit, the module column is left out first (80-column CI logs).
_OP_COLUMNS = (Col("op", "name", "left", most=40), Col("module", "name", "left", drop=1, most=18),
               Col("category", "name", "left", most=14), Col("count"), Col("self"), Col("share"),
               Col("source", justify="left"))


def _ops_table(report, top: int, console: Console) -> None:
    ops = report.ops
    rows = [[o.name, o.module, o.category, str(o.occurrences), fmt_s(o.self_s), fmt_pct(o.share),
             short_source(o.source, keep=1)] for o in ops[:top]]
    table(console, list(_OP_COLUMNS), rows, title=f"Top ops by self time ({min(top, len(ops))} of {len(ops)})")


def _compile_table(report, top: int, console: Console) -> None:
    hits = report.totals.compile_cache_hits
    title = f"Compilation: {fmt_s(report.totals.compile_s)} (tracing, lowering, backend compile)"
    cols = [Col("function", "name", "left", most=40), Col("compiles"), Col("tracing"), Col("lowering"), Col("backend")]
    rows = [[c.function, str(c.compiles), fmt_s(c.tracing_s), fmt_s(c.lowering_s), fmt_s(c.backend_compile_s)]
            for c in report.compile[:top]]
    table(console, cols, rows, title=title + (f", {hits} persistent-cache hits" if hits else ""))


def _tpu_estimate(report, top: int, console: Console) -> None:
    est, backend = report.tpu_estimate, report.backend
    t = est.target
    chip, backend = printable(t.chip), printable(backend)
    measured = est.ops is not None  # the run itself was on a TPU
    head = Text(f"{'Measured beside estimated' if measured else 'Estimated'} on TPU {chip} "
                f"({printable(t.topology)})", style="bold")
    if measured and est.step.tpu_estimated_s is not None and est.step.measured_s is not None:
        head.append(f"   step: device op time {fmt_s(est.step.measured_s)} measured (median step), "
                    f"{fmt_s(est.step.tpu_estimated_s)} estimated")
    elif est.step.tpu_estimated_s is not None and report.steps.median_s:
        head.append(f"   step: measured {fmt_s(report.steps.median_s)} on {backend}, "
                    f"estimated {fmt_s(est.step.tpu_estimated_s)} on {chip}")
    say(console, head)
    status = [m.status if not m.error else f"failed: {m.error}" for m in est.modules[:top]]
    if measured:
        cols = [Col("module", "name", "left", most=40), Col("runs"), Col("measured / run"), Col("estimated / run"),
                Col("est. / meas."), Col("status", "text", "left")]
        table(console, cols, [[m.name, str(m.executions), fmt_s(m.measured_per_run_s), fmt_s(m.tpu_estimated_s),
                               _ratio(m.estimate_ratio), st] for m, st in zip(est.modules[:top], status)])
        cols = [Col("op", "name", "left", most=40), Col("module", "name", "left", drop=1, most=18),
                Col("measured"), Col("estimated"), Col("est. / meas."), Col("estimate from", "text", "left")]
        table(console, cols, [[o.name, o.module, fmt_s(o.measured_s), fmt_s(o.estimated_s), _ratio(o.ratio),
                               o.cycles_source] for o in est.ops[:top]],
              title=f"Ops by measured time, per module execution ({min(top, len(est.ops))} of {len(est.ops)})")
    else:
        cols = [Col("module", "name", "left", most=40), Col("runs"), Col(f"{backend} op time"), Col("TPU est. / run"),
                Col("TPU est. total"), Col("status", "text", "left")]
        table(console, cols, [[m.name, str(m.executions), fmt_s(m.cpu_self_s), fmt_s(m.tpu_estimated_s),
                               fmt_s(m.tpu_estimated_total_s), st] for m, st in zip(est.modules[:top], status)])
    cols = [Col("source", justify="left"), Col(f"{backend} op time"), Col("TPU est.")]
    table(console, cols, [[short_source(ln.source, keep=1), fmt_s(ln.cpu_self_s), fmt_s(ln.tpu_estimated_s)]
                          for ln in est.lines[:top]], title="By source line")
    say(console, est.note, style="bright_black")
    if est.suggestions is not None:
        from tpudiag.report.suggest_render import summary_lines

        say(console, Text("\nSuggestions", style="bold"))
        for line in summary_lines(est.suggestions, report.artifacts.get("run_dir")):
            say(console, f"  {line}")


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


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
            logdir = shlex.quote(f"{run}/{a.get('trace_logdir', 'trace')}")  # pasted into a shell as it is
            t.append(f"\n  open with      xprof --logdir {logdir}")
        if a.get("hlo_dump"):
            t.append(f"\n  HLO dump       {run}/{a['hlo_dump']}")
    elif a.get("xplane"):
        t.append(f"\n  trace          {a['xplane']}")
    return t


@renders("tpudiag.report", "terminal")
def render_terminal(report, console: Console, top: int = 15, top_compiles: int = 10) -> None:
    """A `ProfileReport` (tpudiag.report/1): the first `top` ops and `top_compiles` compiles."""
    _header(report, console)
    if report.device is not None:  # a TPU: the device's own time first, per step
        say(console, Text("The device", style="bold"))
        for line in device_lines(report.device):
            say(console, line)
        console.print()
    console.print(_breakdown(report))
    console.print()
    if report.ops:
        _ops_table(report, top, console)
    else:
        say(console, "No op executed in the traced window.")
    if report.compile:
        console.print()
        _compile_table(report, top_compiles, console)
    lines = [line for summary in report.fusions for line in fusion_summary_lines(summary)]
    if lines or report.fusions_setup:
        console.print()
        say(console, Text("Fusion breaks (tensors written to memory between kernels; `tpudiag fusions RUN` has all)",
                          style="bold"))
        for line in lines:
            say(console, line)
        if report.fusions_setup:
            say(console, setup_line(report.fusions_setup), style="bright_black")
    if report.tpu_estimate is not None:
        console.print()
        _tpu_estimate(report, top, console)
    for w in report.warnings:
        say(console, f"warning: {w}", style="yellow")
    console.print()
    say(console, _artifacts(report))
