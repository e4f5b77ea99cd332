"""Renders a `SuggestReport` (tpudiag.suggest/1): the terminal report (rich) and GitHub Markdown.

Each shows the ranked suggestions (pattern, kernel, ops, source, share, XLA vs kernel time,
speedup, seconds saved, confidence and its reason, the snippet), then what XLA already replaced
and the static findings. They compute nothing; names from the program reach rich as plain text
and Markdown through `markdown._esc` / `markdown.code`.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tpudiag.report.fit import Col, say, table
from tpudiag.report.markdown import _esc, code
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import fmt_bytes, fmt_s, printable, short_source
from tpudiag.results.suggest import pattern_label


def _speed(r) -> str:
    if r.expected_speedup is None:
        return "-"
    bound = " (bound)" if r.kernel_basis == "roofline_bound" else ""
    return f"{r.expected_speedup:.2f}x{bound}"


def _kernel_word(r) -> str:
    return {"compiled": "kernel", "measured_table": "kernel (chip-measured, scaled)"}.get(r.kernel_basis, "bound")


_XLA_SIDE = {"measured_run": "the run's own ops", "measured_on_chip": "plain-JAX twin"}


def _measured(r) -> str | None:
    """`suggest --measure`'s line: the chip's times beside the estimate, or why a variant has none."""
    m = r.measured
    if m is None:
        return None
    speed = "" if m.speedup is None else f": {m.speedup:.2f}x, saves {fmt_s(m.saved_s)} per run of the module"
    twin = (f" (twin {fmt_s(m.xla_twin_s)})" if m.xla_basis == "measured_run" and m.xla_twin_s is not None else "")
    line = (f"on {m.device} at {m.shape}: XLA {fmt_s(m.xla_s)} ({_XLA_SIDE.get(m.xla_basis, m.xla_basis)}){twin} "
            f"-> kernel {fmt_s(m.kernel_s)}{speed}; fastest of {m.calls} calls by device time")
    return line + (f"; {m.error}" if m.error else "")


def _measured_speed(r) -> str:
    if r.measured is None:
        return "-"
    return "failed" if r.measured.speedup is None else f"{r.measured.speedup:.2f}x"


def _shapes(r) -> str:
    return ", ".join(f"{k}={v}" for k, v in r.shapes.items())


@renders("tpudiag.suggest", "terminal")
def render_suggest_terminal(rep, console: Console, show_all: bool = False) -> None:
    rows = [r for r in rep.suggestions if r.shown or show_all]
    say(console, f"tpudiag suggest  {rep.run_dir}  target {rep.target} ({rep.chip})", style="bold")
    if not rows:
        say(console, "No suggestion." + (f" {rep.hidden} match(es) below the minimums (--all lists them)."
                                         if rep.hidden else ""))
    for n, r in enumerate(rows, 1):
        console.print()
        head = f"{n}. {pattern_label(r.pattern)} in {r.module}"
        head += f" -> {r.kernel}" if r.kernel else " (no bundled kernel fits)"
        say(console, head + ("" if r.shown else "  [below the minimums]"), style="bold")
        t = Table(show_header=False, show_edge=False, box=None, pad_edge=False)
        t.add_column(style="bright_black", no_wrap=True)
        t.add_column(overflow="ellipsis")  # wraps at spaces; a word (an op name) is never split
        t.add_row("source", plain(", ".join(short_source(s) for s in r.source[:3]) or "-"))
        t.add_row("ops", plain(", ".join(r.ops[:8]) + (f" (+{len(r.ops) - 8})" if len(r.ops) > 8 else "")))
        t.add_row("shapes", plain(_shapes(r)))
        share = f"{r.share:.1%} of {r.module}'s {'measured' if r.xla_measured else 'estimated'} time"
        if r.measured_share is not None and not r.xla_measured:
            share += f"; {r.measured_share:.1%} of the measured op time"
        t.add_row("share", plain(share))
        t.add_row("time", plain(f"XLA {fmt_s(r.xla_s)} -> {_kernel_word(r)} "
                                f"{fmt_s(r.kernel_s)}: {_speed(r)}, saves {fmt_s(r.saved_s)} per run of the module"
                                + (f"; {fmt_s(r.saved_per_step_s)} per step ({r.executions_per_step:g} runs per step)"
                                   if r.saved_per_step_s is not None else "")))
        if (chip := _measured(r)) is not None:
            t.add_row("measured", plain(chip))
        t.add_row("confidence", plain(f"{r.confidence}: {r.reason}"))
        for note in r.notes:
            t.add_row("note", plain(note))
        console.print(t)
        for line in (r.snippet or "").splitlines():  # code: never wrapped
            console.print(plain(line, style="cyan"), soft_wrap=True)
    if rep.replaced:
        console.print()
        say(console, "Already replaced by XLA", style="bold")
        for x in rep.replaced:
            say(console, f"  {pattern_label(x.pattern)} in {x.module}: {x.by} "
                         f"({', '.join(short_source(s) for s in x.source[:2]) or 'no source'})")
            for note in x.notes:
                say(console, f"    {note}", style="dim")
    if rep.findings:
        console.print()
        cols = [Col("kind", "name", "left"), Col("module", "name", "left", drop=1, most=32),
                Col("op", "name", "left", most=40), Col("bytes"), Col("at HBM"), Col("what", "text", "left")]
        table(console, cols, [[f.kind, f.module, f.op, fmt_bytes(f.bytes), fmt_s(f.estimated_s), f.detail]
                              for f in rep.findings], title="Findings")
    for note in rep.notes:
        say(console, f"note: {note}", style="bright_black")


@renders("tpudiag.suggest", "md")
def render_suggest_markdown(rep, show_all: bool = False) -> str:
    rows = [r for r in rep.suggestions if r.shown or show_all]
    out = [f"## tpudiag suggest: {len(rows)} suggestion(s) for {_esc(rep.target)}", ""]
    chip = any(r.measured is not None for r in rows)  # suggest --measure: the chip's columns too
    if rows:
        out += ["| # | pattern | kernel | module | source | share | XLA | kernel | speedup | saved | confidence |"
                + (" measured XLA | measured kernel | measured speedup |" if chip else ""),
                "|---:|---|---|---|---|---:|---:|---:|---:|---:|---|" + ("---:|---:|---:|" if chip else "")]
        for n, r in enumerate(rows, 1):
            m = r.measured
            out.append(f"| {n} | {_esc(pattern_label(r.pattern))} | {code(r.kernel or '-')} | "
                       f"{_esc(r.module)} | {code(short_source(r.source[0]) if r.source else '-')} | {r.share:.1%} | "
                       f"{fmt_s(r.xla_s)} | {fmt_s(r.kernel_s)} | {_speed(r)} | {fmt_s(r.saved_s)} | {r.confidence} |"
                       + (f" {fmt_s(m.xla_s if m else None)} | {fmt_s(m.kernel_s if m else None)} | "
                          f"{_measured_speed(r)} |" if chip else ""))
        for n, r in enumerate(rows, 1):
            out += ["", f"**{n}. {_esc(pattern_label(r.pattern))}** ({_esc(_shapes(r))}): {_esc(r.reason)}"]
            if (line := _measured(r)) is not None:
                out += ["", f"Measured {_esc(line)}"]
            if r.snippet:
                out += ["", "```python", r.snippet, "```"]
    else:
        out.append("No suggestion." + (f" {rep.hidden} match(es) below the minimums." if rep.hidden else ""))
    if rep.replaced:
        out += ["", "### Already replaced by XLA", ""]
        out += [f"- {_esc(pattern_label(x.pattern))} in {_esc(x.module)}: {_esc(x.by)}"
                + "".join(f"; {_esc(n)}" for n in x.notes) for x in rep.replaced]
    if rep.findings:
        out += ["", "### Findings", "", "| kind | module | op | bytes | at HBM | what |", "|---|---|---|---:|---:|---|"]
        out += [f"| {f.kind} | {_esc(f.module)} | {code(f.op)} | {fmt_bytes(f.bytes)} | {fmt_s(f.estimated_s)} | "
                f"{_esc(f.detail)} |" for f in rep.findings]
    out += [f"\n_{_esc(n)}_" for n in rep.notes]
    return printable("\n".join(out) + "\n", newlines=True)


def summary_lines(rep, run_dir: str | None = None) -> list[str]:
    """The shown suggestions of a compile report's unpriced section, one line each, and how to price
    them: what the compile and profile --target reports print under "Suggestions"."""
    rows = [r for r in rep.suggestions if r.shown]
    if not rows:
        return ["No op clears the minimums for a custom kernel." + (f" {rep.hidden} match(es) below them "
                                                                     "(tpudiag suggest --all)." if rep.hidden else "")]
    out = []
    for r in rows:
        where = short_source(r.source[0]) if r.source else "?"
        bound = "bound" if r.kernel_basis == "roofline_bound" else "kernel"
        out.append(f"{pattern_label(r.pattern)} in {r.module} at {where}: {r.share:.1%} of the module, "
                   f"XLA {fmt_s(r.xla_s)}, {bound} {fmt_s(r.kernel_s)} ({_speed(r)})")
    out.append(f"tpudiag suggest {run_dir or 'RUN'} compiles the bundled kernels at these shapes for the gain")
    return out
