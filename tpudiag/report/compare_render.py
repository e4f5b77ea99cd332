"""Renders a `Comparison` (tpudiag.compare/1, results/compare.py): a one-line verdict, the
terminal report (rich) and GitHub Markdown (for `$GITHUB_STEP_SUMMARY`).

Each shows both sides, the headline with its verdict and spread, then the modules and the top
`top` ops by absolute change. Values are seconds or bytes, as the comparison's `unit` says. They
read the model's attributes and compute nothing. Paths, arguments and names reach rich as `plain`
text and Markdown through `markdown._esc` / `markdown.code`, never as markup.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpudiag.report.fit import header_panel
from tpudiag.report.markdown import _esc, code
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import fmt_bytes, fmt_count, fmt_s, printable

BASIS = {
    "median_step": "median step time",
    "total_op_time": "total op time",
    "tpu_step_estimate": "estimated TPU step time",
    "tpu_total_estimate": "estimated TPU time (all modules)",
    "peak_hbm_largest_module": "peak HBM (largest module)",
    "roofline_work_per_step": "roofline work per step",
    "roofline_work_per_run": "roofline work (whole run)",
}
# `work`'s figures: how each is shown.
FIGURES = {"flops": ("FLOPs", "count"), "bytes_accessed": ("bytes accessed", "bytes"),
           "op_executions": ("op executions", "count"), "peak_allocation_bytes": ("peak buffer allocation", "bytes")}
VERDICT = {
    "regression": "REGRESSION",
    "within_noise": "no regression (within the measured spread)",
    "within_threshold": "no regression (within the threshold)",
    "improvement": "improvement",
    "unchanged": "no regression (unchanged)",
    "refused": "no time verdict (refused)",
}
_STYLE = {"regression": "bold red", "improvement": "green", "unchanged": "", "within_noise": "",
          "within_threshold": "", "refused": "bold yellow"}


def _fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "count":
        return fmt_count(value, "")
    return fmt_bytes(value) if unit == "bytes" else fmt_s(value)


def _signed(value, unit: str) -> str:
    if value is None:
        return "-"
    text = _fmt(value, unit)
    return f"+{text}" if value > 0 else text


def _pct(p) -> str:
    return "-" if p is None else f"{p:+.1f}%"


def _side(side) -> str:
    """`fixtures/artifacts/x  mlp.py --steps 8  (cpu, 1 device, 8 steps)` or a compile run's target."""
    argv = side.argv or ([side.program] if side.program else [])
    what = " ".join(str(a) for a in argv) or "?"
    if side.kind == "compile":
        extra = f"compile run, target {side.target}"
    else:
        extra = f"{side.backend}, {side.devices} device(s), {side.steps} steps"
        if side.target:
            extra += f", TPU estimate for {side.target}"
    status = "" if side.status in ("ok", None) else f", status {side.status}"
    return f"{side.path}  {what}  ({extra}{status})"


def _basis(h) -> str:
    return printable(BASIS.get(h.basis, h.basis))


def _headline_text(h, unit: str) -> str:
    """`median step time 3.09 ms -> 10.28 ms (+7.19 ms, +232.7%)`."""
    return f"{_basis(h)} {_fmt(h.base, unit)} -> {_fmt(h.cur, unit)} ({_signed(h.delta, unit)}, {_pct(h.delta_pct)})"


def render_compare_verdict(comparison) -> str:
    """One line: `regression: median step time 3.09 ms -> 10.28 ms (+7.19 ms, +232.7%); max 5%, spread 1.72 ms`.
    A refused time verdict: the `work` verdict that decided instead (or none), then why times could not."""
    h, unit = comparison.headline, comparison.unit
    if h.verdict == "refused":
        fb = comparison.fallback
        decided = (f"{VERDICT[fb.verdict]}: {_headline_text(fb, 's')} (executed work); max regression "
                   f"{comparison.max_regression_pct:g}%" if fb else
                   f"{VERDICT[h.verdict]}: {_headline_text(h, unit)}; no executed-work figures on both sides to "
                   "decide instead")
        return printable(f"{decided}; time verdict refused: {h.refused}")
    spread = "no noise estimate" if h.spread is None else f"spread {_fmt(h.spread, unit)}"
    return printable(f"{VERDICT[h.verdict]}: {_headline_text(h, unit)}; max regression "
                     f"{comparison.max_regression_pct:g}%, {spread}")


def _calibration_text(cal) -> str:
    """`calibration loop: base 4.10 ms (10 samples, 5% apart), cur 6.10 ms (10 samples, 105% apart);
    cur/base 1.49x (0.95-2.05x); limit 25% apart` (one line)."""

    def side(name, s):
        n = f"{s.samples} sample{'s' if s.samples != 1 else ''}"
        return f"{name} {fmt_s(s.median_s)} ({n}, {s.spread:.0%} apart)"

    return (f"calibration loop: {side('base', cal.base)}, {side('cur', cal.cur)}; cur/base {cal.ratio:.2f}x "
            f"({cal.ratio_low:.2f}-{cal.ratio_high:.2f}x); limit {cal.spread_max:.0%} apart")


def _row_cells(r, unit: str) -> list[str]:
    return [_fmt(r.base, unit), _fmt(r.cur, unit), _signed(r.delta, unit), _pct(r.delta_pct),
            r.status + (" (flagged)" if r.flagged else "")]


@renders("tpudiag.compare", "terminal")
def render_compare_terminal(comparison, console: Console, top: int = 15) -> None:
    """A `Comparison`: both sides, the headline and its verdict, the first `top` modules and ops."""
    c = comparison
    h, unit = c.headline, c.unit
    head = Text()
    head.append("base  ", style="bold")
    head.append(printable(_side(c.base)) + "\n")
    head.append("cur   ", style="bold")
    head.append(printable(_side(c.cur)) + "\n")
    head.append(f"metric {printable(c.metric)}: {_basis(h)}   max regression {c.max_regression_pct:g}%")
    if c.forced:
        head.append("   forced", style="bold yellow")
    if c.metric_reason and c.metric_reason != "asked for":
        head.append("\n" + printable(f"why this metric: {c.metric_reason}"), style="bright_black")
    header_panel(console, head, "tpudiag compare")

    line = Text()
    line.append(f"{_basis(h)}  {_fmt(h.base, unit)} -> {_fmt(h.cur, unit)}  "
                f"{_signed(h.delta, unit)} ({_pct(h.delta_pct)})  ")
    line.append("spread -" if h.spread is None else
                f"spread {_fmt(h.spread, unit)} (base {_fmt(h.base_spread, unit)}, "
                f"cur {_fmt(h.cur_spread, unit)})")
    console.print(line)
    if c.calibration:
        console.print(plain(_calibration_text(c.calibration), style="bright_black"))
    console.print(Text(VERDICT[h.verdict], style=_STYLE[h.verdict]))
    if c.run_failed:
        console.print(plain(f"FAILED RUN: {c.run_failed}: the gate fails whatever the figures say", style="bold red"))
    if h.verdict == "refused":
        console.print(plain(f"time verdict refused: {h.refused}", style="yellow"))
        fb = c.fallback
        console.print(plain(f"work verdict, which decides: {VERDICT[fb.verdict]}: {_headline_text(fb, 's')}" if fb else
                            "no executed-work figures on both sides to decide instead",
                            style=_STYLE[fb.verdict] if fb else ""))
    if c.figures:
        console.print()
        table = Table(title="Executed work", title_justify="left", show_edge=False)
        for col in ("figure", "base", "cur", "delta", "delta %", "status"):
            table.add_column(col, justify="left" if col in ("figure", "status") else "right", no_wrap=True)
        for r in c.figures:
            label, funit = FIGURES.get(r.name, (r.name, "count"))
            table.add_row(plain(label), *[plain(cell) for cell in _row_cells(r, funit)], style="red" if r.flagged else "")
        console.print(table)

    for title, rows, with_module in (("Modules", c.modules, False), ("Ops", c.ops, True)):
        if not rows:
            continue
        console.print()
        table = Table(title=f"{title} by change ({min(top, len(rows))} of {len(rows)})", title_justify="left",
                      show_edge=False)
        cols = (["op", "module"] if with_module else ["module"]) + ["base", "cur", "delta", "delta %", "status"]
        for col in cols:
            table.add_column(col, justify="left" if col in ("op", "module", "status") else "right",
                             overflow="ellipsis", no_wrap=True)
        for r in rows[:top]:
            names = [plain(r.name or "-"), plain(r.module or "-")] if with_module else [plain(r.name)]
            cells = names + [plain(cell) for cell in _row_cells(r, unit)]
            table.add_row(*cells, style="red" if r.flagged else "")
        console.print(table)
    console.print()
    console.print(plain(f"note: {c.note}", style="bright_black"))
    for w in c.warnings:
        console.print(plain(f"warning: {w}", style="yellow"))


@renders("tpudiag.compare", "md")
def render_compare_markdown(comparison, top: int = 15) -> str:
    """A `Comparison` as Markdown: the verdict, both sides, the headline, the first `top` modules and ops."""
    c = comparison
    h, unit = c.headline, c.unit
    verdict = VERDICT[h.verdict]
    fb = c.fallback
    if fb:  # a refused time verdict: the work verdict decides
        verdict = f"{VERDICT[fb.verdict]}, by executed work (time verdict refused)"
    out = [f"## tpudiag compare: {'**' + verdict + '**' if c.regression else verdict}", "",
           f"**Base:** {code(_side(c.base))}  ", f"**Cur:** {code(_side(c.cur))}", "",
           f"Metric {code(c.metric)}, max regression {c.max_regression_pct:g}%"
           + (" (**forced** across: " + _esc("; ".join(c.differences)) + ")" if c.forced else ""), "",
           "| | base | cur | delta | delta % | spread |", "|---|---:|---:|---:|---:|---:|",
           f"| {_basis(h)} | {_fmt(h.base, unit)} | {_fmt(h.cur, unit)} | "
           f"{_signed(h.delta, unit)} | {_pct(h.delta_pct)} | {_fmt(h.spread, unit)} |"]
    if fb:
        out.append(f"| {_basis(fb)} | {_fmt(fb.base, 's')} | {_fmt(fb.cur, 's')} | {_signed(fb.delta, 's')} | "
                   f"{_pct(fb.delta_pct)} | {_fmt(fb.spread, 's')} |")
    for r in c.figures or ():
        label, funit = FIGURES.get(r.name, (r.name, "count"))
        out.append(f"| {_esc(label)} | {_fmt(r.base, funit)} | {_fmt(r.cur, funit)} | {_signed(r.delta, funit)} | "
                   f"{_pct(r.delta_pct)} | {'flagged' if r.flagged else '-'} |")
    if c.run_failed:
        out += ["", f"**Failed run:** {_esc(c.run_failed)}: the gate fails whatever the figures say."]
    if h.verdict == "refused":
        out += ["", f"**Time verdict refused:** {_esc(h.refused)}"
                + ("" if fb else " No executed-work figures on both sides to decide instead.")]
    if c.calibration:
        out += ["", _esc(_calibration_text(c.calibration))]
    if c.metric_reason and c.metric_reason != "asked for":
        out += ["", f"Why this metric: {_esc(c.metric_reason)}"]
    for title, rows, with_module in (("Modules", c.modules, False), ("Ops", c.ops, True)):
        if not rows:
            continue
        out += ["", f"### {title} by change ({min(top, len(rows))} of {len(rows)})", "",
                ("| op | module " if with_module else "| module ") + "| base | cur | delta | delta % | status |",
                ("|---|---" if with_module else "|---") + "|---:|---:|---:|---:|---|"]
        for r in rows[:top]:
            names = f"{code(r.name)} | {_esc(r.module or '-')}" if with_module else code(r.name)
            out.append(f"| {names} | " + " | ".join(_esc(cell) for cell in _row_cells(r, unit)) + " |")
        if len(rows) > top:
            out += ["", f"{len(rows) - top} more in the JSON document (`--json`)."]
    out += ["", f"_{_esc(c.note)}_"]
    for w in c.warnings:
        out += ["", f"> **Warning:** {_esc(w)}"]
    return printable("\n".join(out) + "\n", newlines=True)
