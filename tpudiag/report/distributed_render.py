"""Renders a `DistributedReport` (tpudiag.distributed/1) for the terminal and as GitHub Markdown:
processes, collectives, per-step skew, who waited for whom, stragglers. Formats what the model
holds; every name reaches rich as `plain` text (through `fit`, which fits the tables to the width
without cutting a figure) and Markdown through `_esc`."""

from __future__ import annotations

from rich.console import Console

from tpudiag.report.fit import Col, say, table
from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders
from tpudiag.report.units import fmt_bytes, fmt_count, fmt_pct, fmt_s, short_source

_TOP = 15


def _header(r) -> list[str]:
    lines = [f"tpudiag distributed report: {r.program or 'traces'}  ({r.num_processes} processes, {r.devices} "
             f"devices, {r.backend})",
             f"status: {r.status}" + (f" ({r.reason})" if r.reason else ""),
             f"timelines: {r.alignment}: {r.alignment_note}",
             f"communication: {fmt_s(r.communication_s)} per device summed over processes; hidden behind compute "
             f"{fmt_s(r.hidden_communication_s)} ({fmt_pct(r.overlap_ratio)}), exposed "
             f"{fmt_s(r.exposed_communication_s)}"]
    return lines


def _process_rows(r) -> tuple[list[str], list[list[str]]]:
    """The offset column only where the timelines were shifted (aligned on a collective)."""
    shifted = any(p.offset_s for p in r.processes)
    cols = ["proc", "host", "devs", "exit", "steps", "step time", "compute", "comm", "exposed", "waiting", "overlap",
            *(["offset"] if shifted else [])]
    rows = [[f"p{p.process_id}", p.host, str(len(p.devices)), "-" if p.exit_code is None else str(p.exit_code),
             str(p.steps), fmt_s(p.step_time_s), fmt_s(p.compute_s), fmt_s(p.communication_s),
             fmt_s(p.exposed_communication_s), fmt_s(p.wait_s), fmt_pct(p.overlap_ratio),
             *([fmt_s(p.offset_s)] if shifted else [])]
            for p in r.processes]
    return cols, rows


def _collective_rows(r, top: int, wide: bool = True) -> tuple[list[str], list[list[str]]]:
    """`wide`: with the median duration and algbw, the op as `module/op` (Markdown); the terminal
    keeps to the figures that decide (fastest, busbw, waiting, spread), the module in a column of
    its own (which the terminal can fold into its legend)."""
    cols = ["kind", *(["op"] if wide else ["module", "op"]), "source", "size", "group", "runs",
            *(["duration"] if wide else []), "fastest", *(["algbw"] if wide else []), "busbw", "waiting", "spread"]
    rows = [[c.kind, *([f"{c.module}/{c.op}"] if wide else [c.module, c.op]), short_source(c.source, 1),
             fmt_bytes(c.message_bytes), str(c.group_size), str(c.instances), *([fmt_s(c.duration_s)] if wide else []),
             fmt_s(c.fastest_s),
             *([fmt_count(c.algbw_bytes_per_s, "B/s")] if wide else []), fmt_count(c.busbw_bytes_per_s, "B/s"),
             fmt_s(c.wait_s), fmt_s(c.arrival_spread_s)]
            for c in r.collectives[:top]]
    return cols, rows


def _step_rows(r, top: int) -> tuple[list[str], list[list[str]]]:
    names = [f"p{p.process_id}" for p in r.processes]
    cols = ["step", "collectives", "communication", "max spread", "last to arrive", "at op",
            *[f"{n} waited" for n in names]]
    rows = [["all" if s.step is None else str(s.step), str(s.collectives), fmt_s(s.communication_s),
             fmt_s(s.max_spread_s), "-" if s.last_process is None else f"p{s.last_process}", s.op or "-",
             *[fmt_s(s.wait_s.get(n, 0.0)) for n in names]]
            for s in r.steps[:top]]
    return cols, rows


def _findings(r) -> list[str]:
    out = [f"p{w.waiter} waited {fmt_s(w.wait_s)} for p{w.waited_for} ({w.instances} collective runs)"
           for w in r.waiting[:5]]
    out += [f"straggler: p{s.process_id} arrived last at the most skewed collective in {s.steps_last} of {s.steps} "
            f"steps, {fmt_s(s.mean_lag_s)} late on average; the others waited {fmt_s(s.caused_wait_s)} for it"
            for s in r.stragglers]
    if r.steps and not r.stragglers and r.num_processes > 1:
        out.append("no straggler: no process arrived last in most steps")
    return out


# The terminal's columns: figures and source lines are never cut; at 100 columns the ones with
# the highest `drop` are left out first (one value in every row: into the legend).
_TERMINAL = {
    "proc": Col("proc", justify="left"), "host": Col("host", "name", "left", drop=6, most=24),
    "devs": Col("devs", drop=5), "steps": Col("steps", drop=4), "exit": Col("exit", drop=3),
    "overlap": Col("overlap", drop=2),
    "kind": Col("kind", "name", "left"), "module": Col("module", "name", "left", drop=5, most=32),
    "op": Col("op", "name", "left", most=32), "source": Col("source", justify="left", drop=3),
    "size": Col("size", drop=2), "group": Col("group", drop=4), "runs": Col("runs", drop=1),
    "step": Col("step", justify="left"), "collectives": Col("collectives", drop=6),
    "communication": Col("communication", drop=5), "last to arrive": Col("last to arrive", justify="left"),
    "at op": Col("at op", "name", "left", drop=4, most=32),
}


def _table(console: Console, title: str, cols: list[str], rows: list[list[str]]) -> None:
    # A process's `waited` column after the first is left out before any other when it must be.
    spec = [_TERMINAL.get(c) or Col(c, drop=1 if c.endswith(" waited") and not c.startswith("p0 ") else 0)
            for c in cols]
    table(console, spec, rows, title=title)


@renders("tpudiag.distributed", "terminal")
def render_distributed_terminal(r, console: Console, top: int = _TOP, **_) -> None:
    for i, line in enumerate(_header(r)):
        say(console, line, style="bold" if i == 0 else "")
    _table(console, "Processes (per device; totals over the traced window)", *_process_rows(r))
    if r.collectives:
        _table(console, "Collectives (busbw: nccl-tests' bus bandwidth of the fastest device, which did not wait)",
               *_collective_rows(r, top, wide=False))
    else:
        say(console, "No collective ran in the traced window.")
    if r.steps:
        _table(console, "Skew per step", *_step_rows(r, top))
    for line in _findings(r):
        say(console, line)
    for w in r.warnings:
        say(console, f"warning: {w}", style="yellow")
    if r.artifacts.get("run_dir"):
        say(console, f"each process's own report: tpudiag report {r.artifacts['run_dir']}/processes/p<I>")


def _md_table(title: str, cols: list[str], rows: list[list[str]]) -> list[str]:
    out = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_esc(x) for x in row) + " |" for row in rows]
    return out + [""]


@renders("tpudiag.distributed", "md")
def render_distributed_markdown(r, top: int = _TOP, **_) -> str:
    head = _header(r)
    lines = [f"## {_esc(head[0])}", "", *[f"- {_esc(x)}" for x in head[1:]], ""]
    lines += _md_table("Processes", *_process_rows(r))
    if r.collectives:
        lines += _md_table("Collectives", *_collective_rows(r, top))
    if r.steps:
        lines += _md_table("Skew per step", *_step_rows(r, top))
    found = _findings(r)
    if found:
        lines += [*[f"- {_esc(x)}" for x in found], ""]
    if r.warnings:
        lines += [*[f"- warning: {_esc(w)}" for w in r.warnings], ""]
    return "\n".join(lines)
