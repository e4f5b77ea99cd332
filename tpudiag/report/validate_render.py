"""Renders a `ValidateResult` (tpudiag.validate/1): a table of cases and checks for the terminal,
GitHub Markdown, and JUnit XML (one testcase per case). Formats what the model holds; names and
error texts reach rich as `plain` text, Markdown through `_esc`, XML `printable` and escaped."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from rich.console import Console
from rich.text import Text

from tpudiag.report.fit import Col, say, table
from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import printable


def _ratio(x) -> str:
    return "mismatch" if x is None else f"{x:.3g}"


def _err(stats) -> str:
    return "-" if stats is None else f"{stats.normwise:.2e}"


def _ulp(stats) -> str:
    return "-" if stats is None else f"{stats.ulp_max:.3g} / {stats.ulp_p999:.3g} / {stats.ulp_mean:.2g}"


def _verdict(result) -> str:
    tail = f"seed {result.seed}; rerun with --seed {result.seed}"
    if result.ok:
        return f"{result.passed}/{len(result.cases)} cases passed ({tail})"
    return f"{result.failed} of {len(result.cases)} cases FAILED ({tail})"


@renders("tpudiag.validate", "terminal")
def render_validate_terminal(result, console: Console) -> None:
    say(console, f"tpudiag validate  {result.candidate} ({result.kinds['candidate']})  vs  "
                 f"{result.reference} ({result.kinds['reference']})", style="bold")
    say(console, f"rule: error vs float64 <= {result.rule['k']:g} x the reference's + "
                 f"{result.rule['floor_eps']:g} eps of the output dtype (normwise)"
                 + ("; gradients too" if result.grad else "")
                 + ("; bit-for-bit determinism" if result.determinism else ""))
    cols = [Col("regime", "name", "left"), Col("check", "text", "left"), Col("result", "name", "left"),
            Col("err/allowed"), Col("normwise err", drop=2), Col("ULP max / p99.9 / mean", drop=1), Col("s", drop=3)]
    rows = []
    for case in result.cases:
        if case.error:
            rows.append([case.regime, "(run)", Text("ERROR", style="bold red"), "-", "-", "-", f"{case.seconds:.1f}"])
        for n, c in enumerate(case.checks):
            rows.append([case.regime if n == 0 and not case.error else "", c.what,
                         Text("ok", style="green") if c.ok else Text("FAIL", style="bold red"),
                         _ratio(c.worst_ratio), _err(c.stats), _ulp(c.stats), f"{case.seconds:.1f}" if n == 0 else ""])
    table(console, cols, rows)
    if any(c.measures for c in result.cases) and result.cases:
        refs = [(c.regime, m) for c in result.cases for m in c.measures if m.what.endswith("reference vs float64")]
        worst = max(refs, key=lambda r: r[1].stats.normwise if r[1].stats else 0.0, default=None)
        if worst is not None and worst[1].stats is not None:
            say(console, f"the reference's own error against float64: up to {worst[1].stats.normwise:.2e} "
                         f"({worst[0]})", style="dim")
    for note in dict.fromkeys(m.detail for c in result.cases for m in c.measures if m.detail):
        say(console, plain(f"note: {note}", style="yellow", newlines=True))
    for case in result.cases:  # ties excluded from an exact check that passed: shown, with their count
        for c in case.checks:
            if c.ok and c.detail:
                say(console, plain(f"[{case.regime}] {c.what}: {c.detail}", style="yellow", newlines=True))
    for case in result.failures:
        say(console, plain(f"FAIL [{case.regime}] {case.inputs}: {case.why}", style="red", newlines=True))
        if case.shrunk is not None:
            s = case.shrunk
            say(console, plain(f"  smallest failing case: [{s.regime}] {s.inputs}: {s.check}: {s.detail}",
                               style="red", newlines=True))
    if result.skipped:
        say(console, f"regimes skipped: {', '.join(result.skipped)}", style="dim")
    for note in result.notes:
        say(console, note, style="dim")
    say(console, Text(_verdict(result), style="green" if result.ok else "bold red"))


@renders("tpudiag.validate", "md")
def render_validate_markdown(result) -> str:
    out = [f"## tpudiag validate: `{_esc(result.candidate)}` vs `{_esc(result.reference)}`", "",
           f"{_esc(_verdict(result))}", "",
           "| regime | check | result | err/allowed | normwise err | ULP max / p99.9 / mean |",
           "|---|---|---|---:|---:|---:|"]
    for case in result.cases:
        if case.error:
            out.append(f"| {_esc(case.regime)} | (run) | ERROR: {_esc(case.error)} | - | - | - |")
        for c in case.checks:
            out.append(f"| {_esc(case.regime)} | {_esc(c.what)} | {'ok' if c.ok else '**FAIL**'} | "
                       f"{_ratio(c.worst_ratio)} | {_err(c.stats)} | {_ulp(c.stats)} |")
    for case in result.failures:
        line = f"- **{_esc(case.regime)}** `{_esc(case.inputs)}`: {_esc(case.why)}"
        if case.shrunk is not None:
            line += f" (smallest failing: [{_esc(case.shrunk.regime)}] `{_esc(case.shrunk.inputs)}`)"
        out.append(line)
    return "\n".join(out) + "\n"


@renders("tpudiag.validate", "junit")
def render_junit(result) -> str:
    """One testsuite for the pair, one testcase per case (regime)."""
    suite = printable(f"{result.candidate} vs {result.reference}")
    total = sum(c.seconds for c in result.cases)
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuites name="tpudiag validate" tests="{len(result.cases)}" failures="{result.failed}">',
           f'  <testsuite name={quoteattr(suite)} tests="{len(result.cases)}" failures="{result.failed}" '
           f'time="{total:.3f}">']
    for c in result.cases:
        out.append(f'    <testcase classname={quoteattr("tpudiag.validate")} name={quoteattr(printable(c.regime))} '
                   f'time="{c.seconds:.3f}">')
        if not c.ok:
            out.append(f'      <failure message={quoteattr(printable(c.why[:300]))}>{escape(printable(c.why))} '
                       f'(inputs {escape(printable(c.inputs))}, seed {result.seed})</failure>')
        out.append("    </testcase>")
    out += ["  </testsuite>", "</testsuites>"]
    return "\n".join(out) + "\n"
