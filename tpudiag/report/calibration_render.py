"""Renders a `Calibration` (tpudiag.calibration/1) for the terminal (rich) and as GitHub Markdown:
each derived figure with its unit, the data sheet's figure and the ratio where there is one, and the
measurement it comes from; then the measurements that failed. It computes nothing: the figures are
the model's (`Calibration.figures`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain


def _value(f) -> str:
    if f.unit in ("B/s",):
        return f"{f.value / 1e9:.4g} GB/s"
    if f.unit in ("FLOP/s", "OP/s"):
        return f"{f.value / 1e12:.4g} T{f.unit}"
    if f.unit == "s":
        return f"{f.value * 1e9:.4g} ns" if f.value < 1e-6 else f"{f.value * 1e6:.4g} us"
    return f"{f.value:.3g} {f.unit}"


def _nominal(f) -> str:
    if f.nominal is None:
        return "-"
    if f.unit == "B/s":
        return f"{f.nominal / 1e9:.4g} GB/s"
    return f"{f.nominal / 1e12:.4g} T{f.unit}"


def _rows(cal):
    from tpudiag.targets import resolve_target

    try:
        chip = resolve_target(cal.chip).chip
    except Exception:  # a chip this tpudiag does not know: no data-sheet column
        chip = None
    for f in cal.figures(chip).values():
        yield (f.name, _value(f), _nominal(f), "-" if f.ratio is None else f"{f.ratio:.2f}", f.source)


def _title(cal) -> str:
    return f"calibration of {cal.chip} ({cal.device}), jax {cal.jax}, {cal.date}: `{cal.command}`"


@renders("tpudiag.calibration", "terminal")
def render_terminal(cal, console: Console, **_) -> None:
    console.print(plain(_title(cal)))
    t = Table(show_edge=False, pad_edge=False)
    for col in ("figure", "measured", "data sheet", "ratio", "from"):
        t.add_column(col, justify="right" if col in ("measured", "data sheet", "ratio") else "left")
    for row in _rows(cal):
        t.add_row(*(plain(c) for c in row))
    console.print(t)
    for m in cal.measurements:
        if m.status != "ok":
            console.print(plain(f"failed: {m.name} ({m.what}): {m.error or 'no reason given'}"))


@renders("tpudiag.calibration", "md")
def render_md(cal, **_) -> str:
    out = [f"**{_esc(_title(cal))}**", "", "| figure | measured | data sheet | ratio | from |", "|---|---:|---:|---:|---|"]
    out += ["| " + " | ".join(_esc(c) for c in row) + " |" for row in _rows(cal)]
    failed = [m for m in cal.measurements if m.status != "ok"]
    if failed:
        out += [""] + [f"- failed: {_esc(m.name)}: {_esc(m.error or 'no reason given')}" for m in failed]
    return "\n".join(out) + "\n"
