"""Renders a `CompileReport` (tpudiag.compile/1) as GitHub-flavoured Markdown; names go through
`markdown._esc` / `markdown.code`, so none can inject Markdown or HTML."""

from __future__ import annotations

from tpudiag.report.markdown import _esc, code, code_block
from tpudiag.report.registry import renders
from tpudiag.report.units import (fmt_bytes, fmt_int, fmt_runs, fmt_s, fusion_summary_lines, printable, setup_lines,
                                  short_source)


@renders("tpudiag.compile", "md")
def render_compile_markdown(report, top: int = 10) -> str:
    """A `CompileReport` (tpudiag.compile/1) as Markdown."""
    t = report.target
    out = [f"## tpudiag compile: {code(report.source.get('input', '?'))} for {_esc(t.chip)} ({_esc(t.topology)})",
           ""]
    if report.shadow_exit_code:  # a script that failed: what it ran before that was compiled
        reason = (report.source.get("shadow_run") or {}).get("reason") or f"exit {report.shadow_exit_code}"
        out += [f"> **The program failed** ({_esc(reason)}); the computations it ran before that were compiled.", ""]
    out += ["| module | status | estimated TPU time | XLA optimal | peak HBM | static profile |",
            "|---|---|---:|---:|---:|---|"]
    for m in report.modules:
        tot = m.totals
        optimal = getattr(tot, "xla_optimal_s", None)
        peak = f"{fmt_bytes(m.memory.get('peak_hbm_bytes'))}" + ("" if m.fits else " **(does not fit)**")
        status = _esc(m.status) if m.ok else f"failed: {_esc(m.error)}"
        out.append(f"| {code(m.name)} | {status} | {fmt_s(m.estimated_s)} | "
                   f"{fmt_s(optimal)} | {peak if tot else '-'} | {_esc(m.static_profile)} |")
    lines = setup_lines(report)
    if lines:
        out += ["", *(f"- {_esc(line)}" for line in lines)]
    for m in report.modules:
        if not m.ops:
            continue
        out += ["", f"### {code(m.name)}: top ops by estimated time", "",
                "| op | opcode | est. time | bound by | cycles | FLOPs | bytes | source | what limits it |",
                "|---|---|---:|---|---:|---:|---:|---|---|"]
        for o in m.ops[:top]:
            out.append(f"| {code(o.name)} | {_esc(o.opcode)} | {fmt_runs(o.estimated_s, o.runs)} | {_esc(o.bound_by)} | "
                       f"{fmt_int(o.estimated_cycles)} | {fmt_int(o.flops)} | {fmt_bytes(o.bytes_accessed)} | "
                       f"{_esc(short_source(o.source))} | {_esc(o.limit)} |")
        if m.collectives:
            out += ["", f"#### {code(m.name)}: collectives on the slice (ICI model)", "",
                    "| op | kind | size | group | mesh axes | ICI hops | est. time | exposed | schedule |",
                    "|---|---|---:|---:|---|---:|---:|---:|---|"]
            for c in m.collectives[:top]:
                sched = f"async, {fmt_s(c.scheduled_between_s)} of compute between" if c.is_async else "sync"
                out.append(f"| {code(c.name)} | {_esc(c.kind)} | {fmt_bytes(c.message_bytes)} | {c.group_size} x{c.groups} | "
                           f"{_esc(', '.join(c.mesh_axes) if c.mesh_axes else '-')} | "
                           f"{'-' if c.ici_hops is None else c.ici_hops} | {fmt_runs(c.estimated_s, c.runs)} | "
                           f"{fmt_s(c.exposed_s)} | {sched} |")
        lines = fusion_summary_lines(m.fusions) if m.fusions else []
        if lines:
            out += ["", *code_block(lines)]
        for f in m.findings:
            out += ["", f"> {_esc(f)}"]
    if report.suggestions is not None:
        from tpudiag.report.suggest_render import summary_lines

        out += ["", "### Suggestions", ""]
        out += [f"- {_esc(line)}" for line in summary_lines(report.suggestions, (report.artifacts or {}).get("run_dir"))]
    return printable("\n".join(out) + "\n", newlines=True)
