"""Renders an `EstimateReport` (tpudiag.estimate/1) for the terminal and as GitHub Markdown.
Formats what the model holds; names reach rich as `plain` text (tables and lines fitted to the width
by `fit`) and Markdown through `_esc`."""

from __future__ import annotations

from rich.console import Console

from tpudiag.report.fit import Col, say, table
from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders
from tpudiag.report.units import fmt_bytes, fmt_count, fmt_pct, fmt_runs, fmt_s, short_source


_BUFFERS = 6


def _head(e) -> list[str]:
    t = e.target
    mesh = ",".join(f"{a}={n}" for a, n in e.mesh.items()) or "-"
    lines = [f"tpudiag estimate: {e.program} on {t['chip']} {t['topology']} ({t['devices']} devices, mesh {mesh})"]
    if e.status != "ok":
        return lines + [f"FAILED: {e.reason}"]
    b = e.breakdown
    lines += [f"step time {fmt_s(e.step_s)} (estimated): compute {fmt_s(b.compute_s)}, HBM {fmt_s(b.hbm_s)}, "
              f"exposed collectives {fmt_s(b.collective_s)} (hidden behind compute {fmt_s(b.hidden_collective_s)})"
              + (f", host transfers {fmt_s(b.host_s)} (hidden {fmt_s(b.hidden_host_s)})"
                 if b.host_s or b.hidden_host_s else ""),
              f"MFU {fmt_pct(e.mfu)}   tokens/s/device {e.tokens_per_s_per_device:,.0f}   "
              f"model FLOPs/step {fmt_count(e.model_flops, 'FLOP')}   tokens/step {e.tokens:,}"
              if e.tokens_per_s_per_device is not None else "tokens/s/device -",
              f"HBM per device {fmt_bytes(e.peak_hbm_bytes)} of {fmt_bytes(e.hbm_capacity_bytes)}"
              + ("" if e.fits in (True, None) else "  DOES NOT FIT")]
    if e.libtpu_init_args:
        lines.append(f"LIBTPU_INIT_ARGS: {e.libtpu_init_args}")
    return lines


@renders("tpudiag.estimate", "terminal")
def render_estimate_terminal(e, console: Console, **_) -> None:
    for i, line in enumerate(_head(e)):
        say(console, line, style="bold" if i == 0 else "")
    if e.top_ops:
        cols = [Col("op", "name", "left", most=48), Col("time"), Col("share"), Col("bound by", "name", "left"),
                Col("limit", "text", "left"), Col("source", justify="left", drop=1)]
        table(console, cols, [[o.name, fmt_runs(o.total_s / o.runs, o.runs), fmt_pct(o.share), o.bound_by, o.limit,
                               short_source(o.source, 1)] for o in e.top_ops], title="Top ops (time x runs)")
    if e.peak_buffers:
        cols = [Col("live at the HBM peak", "name", "left", most=72), Col("bytes"), Col("buffers"), Col("kind", "name", "left")]
        table(console, cols, [[b.where, fmt_bytes(b.bytes), str(b.count), b.kind] for b in e.peak_buffers[:_BUFFERS]],
              title="Largest buffers at the HBM peak (by source line)")
    for f in e.findings:
        say(console, f"note: {f}", style="yellow")
    for x in e.leaves_out:
        say(console, f"leaves out: {x}", style="bright_black")


@renders("tpudiag.estimate", "md")
def render_estimate_markdown(e, **_) -> str:
    head = _head(e)
    out = [f"## {_esc(head[0])}", "", *[f"- {_esc(x)}" for x in head[1:]], ""]
    if e.top_ops:
        out += ["| op | time | share | bound by | limit | source |", "|---|---:|---:|---|---|---|"]
        out += [f"| {_esc(o.name)} | {fmt_runs(o.total_s / o.runs, o.runs)} | {fmt_pct(o.share)} | {_esc(o.bound_by)} | "
                f"{_esc(o.limit)} | {_esc(short_source(o.source, 1))} |" for o in e.top_ops]
        out.append("")
    if e.peak_buffers:
        out += ["| live at the HBM peak | bytes | buffers | kind |", "|---|---:|---:|---|"]
        out += [f"| {_esc(b.where)} | {fmt_bytes(b.bytes)} | {b.count} | {b.kind} |" for b in e.peak_buffers[:_BUFFERS]]
        out.append("")
    out += [f"> {_esc(f)}" for f in e.findings]
    out += ["", *[f"- leaves out: {_esc(x)}" for x in e.leaves_out], ""]
    return "\n".join(out)
