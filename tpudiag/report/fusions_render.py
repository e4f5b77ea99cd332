"""Renders a `FusionReport` (tpudiag.fusions/1, results/fusions.py): the fusions of one module with what
they hold, move and cost, then the fusion breaks, largest tensor first, each with its reason and
the evidence for it. Terminal (rich) and Markdown; both show the first `top` rows of each table
(the JSON has all). Used alone by `tpudiag fusions` and as a section of the profile and compile
reports (`title=False` / `level=3`). It reads the model's attributes; nothing is computed here.
HLO names, shapes, reasons and evidence reach rich as `plain` text and Markdown as escaped text or
code spans (`markdown.code`), never as markup."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from tpudiag.report.fit import Col, say, table
from tpudiag.report.markdown import _esc, code
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import fmt_bytes, fmt_s, printable, short_source

_OPS_SHOWN = 5  # opcodes listed per fusion; the JSON has the full count
_MEMORY_NOTE = ("S(n): the tensor was assigned to memory space n instead of default memory (HBM on TPU): "
                "S(1) is on-chip VMEM, S(5) pinned host memory (slower than HBM); others are "
                "compiler-internal")


def _ops(fusion) -> str:
    items = fusion.ranked_ops
    text = ", ".join(op if n == 1 else f"{op}×{n}" for op, n in items[:_OPS_SHOWN])
    return text + (", …" if len(items) > _OPS_SHOWN else "")


def _intensity(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _edge(b) -> str:
    index = "" if b.output_index is None else f"#{b.output_index}"
    return f"{b.producer}{index} → {b.consumer}"


def _memory(b) -> str:
    return "" if not b.memory_space else f"S({b.memory_space})"


def _time_header(report) -> str:
    return f"time ({report.time_source})" if report.time_source else "time"


@renders("tpudiag.fusions", "terminal")
def render_fusions_terminal(report, console: Console, top: int = 15, title: bool = True) -> None:
    """A `FusionReport`: the first `top` fusions and breaks; `title=False` leaves out the module line."""
    m, tot = report.module, report.totals
    if title:
        say(console, Text.assemble(plain(f"tpudiag fusions: {m.name}", style="bold"),
                                   plain(f"  {m.path}", style="bright_black")))
    say(console, f"{tot.fusions} fusions moving {fmt_bytes(tot.fusion_bytes)}; {tot.breaks} fusion breaks "
                 f"round-trip {fmt_bytes(tot.break_bytes)} ({fmt_bytes(tot.break_bytes_default_memory)} in "
                 f"default memory), {tot.breaks_not_inferable} with no inferable reason")

    # A fusion's name is cut with an ellipsis past 32 characters (the JSON has it whole); the op
    # list wraps, and is left out first where the table does not fit.
    cols = [Col("fusion", "name", "left", most=32), Col("kind", "name", "left"), Col(_time_header(report)),
            Col("in"), Col("out"), Col("FLOP/B", drop=1), Col("ops", "text", "left", drop=3),
            Col("source", justify="left", drop=2)]
    rows = [[f.name, f.kind or "-", fmt_s(f.time_s), fmt_bytes(f.bytes_in), fmt_bytes(f.bytes_out),
             _intensity(f.arithmetic_intensity), _ops(f), short_source(f.sources[0] if f.sources else None, keep=1)]
            for f in report.fusions[:top]]
    table(console, cols, rows, title="Fusions")
    if len(report.fusions) > top:
        say(console, f"{len(report.fusions) - top} more fusions in the JSON", style="bright_black")

    console.print()
    cols = [Col("bytes"), Col("producer → consumer", "text", "left"), Col("tensor", "name", "left", most=32),
            Col("mem", "name", "left", drop=2), Col("reason", "text", "left"), Col("evidence", "text", "left", drop=1)]
    shown = report.breaks[:top]
    rows = [[fmt_bytes(b.bytes), _edge(b), b.shape, _memory(b),
             plain(b.reason, style="bright_black" if b.reason == "reason not inferable" else ""), b.evidence]
            for b in shown]
    table(console, cols, rows, title="Fusion breaks: tensors that go to memory between kernels, largest first")
    if len(report.breaks) > top:
        say(console, f"{len(report.breaks) - top} more breaks in the JSON", style="bright_black")
    if any(b.memory_space for b in shown):
        say(console, _MEMORY_NOTE, style="bright_black")


@renders("tpudiag.fusions", "md")
def render_fusions_markdown(report, top: int = 15, level: int = 2) -> str:
    """A `FusionReport` as Markdown under a heading of `level`: the first `top` fusions and breaks."""
    m, tot = report.module, report.totals
    h = "#" * level
    out = [f"{h} Fusions: {code(m.name)}", "",
           f"{tot.fusions} fusions moving {fmt_bytes(tot.fusion_bytes)}; {tot.breaks} fusion breaks "
           f"round-trip {fmt_bytes(tot.break_bytes)} ({fmt_bytes(tot.break_bytes_default_memory)} in default "
           f"memory), {tot.breaks_not_inferable} with no inferable reason.", "",
           f"| fusion | kind | {_esc(_time_header(report))} | bytes in | bytes out | FLOP/B | ops | sources |",
           "|---|---|---:|---:|---:|---:|---|---|"]
    for f in report.fusions[:top]:
        sources = ", ".join(_esc(short_source(s)) for s in f.sources[:3])
        out.append(f"| {code(f.name)} | {_esc(f.kind or '-')} | {fmt_s(f.time_s)} | {fmt_bytes(f.bytes_in)} | "
                   f"{fmt_bytes(f.bytes_out)} | {_intensity(f.arithmetic_intensity)} | {_esc(_ops(f))} | "
                   f"{sources} |")
    if len(report.fusions) > top:
        out += ["", f"{len(report.fusions) - top} more fusions in the JSON."]
    out += ["", f"{h}# Fusion breaks, largest first", "",
            "| bytes | producer → consumer | tensor | memory | reason | evidence |", "|---:|---|---|---|---|---|"]
    shown = report.breaks[:top]
    for b in shown:
        out.append(f"| {fmt_bytes(b.bytes)} | {code(_edge(b))} | {code(b.shape)} | {_esc(_memory(b) or '-')} | "
                   f"{_esc(b.reason)} | {_esc(b.evidence)} |")
    if len(report.breaks) > top:
        out += ["", f"{len(report.breaks) - top} more breaks in the JSON."]
    if any(b.memory_space for b in shown):
        out += ["", f"> {_esc(_MEMORY_NOTE)}"]
    return printable("\n".join(out) + "\n", newlines=True)


@renders("tpudiag.fusions_list", "terminal")
def render_fusion_list_terminal(fusion_list, console: Console, top: int = 15) -> None:
    """A `FusionList` (tpudiag.fusions_list/1): each module's `FusionReport` in turn."""
    for report in fusion_list.modules:
        render_fusions_terminal(report, console, top)


@renders("tpudiag.fusions_list", "md")
def render_fusion_list_markdown(fusion_list, top: int = 15) -> str:
    """A `FusionList` as Markdown: each module's section, one after the other."""
    return "\n".join(render_fusions_markdown(report, top) for report in fusion_list.modules)
