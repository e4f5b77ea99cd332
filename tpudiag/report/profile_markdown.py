"""Renders a `ProfileReport` (tpudiag.report/1) as GitHub-flavoured Markdown (for
`$GITHUB_STEP_SUMMARY` and a run directory's report.md). It reads the model's attributes and
computes nothing; every string from the program goes through `markdown._esc` / `markdown.code`."""

from __future__ import annotations

from tpudiag.report.markdown import _esc, code, code_block
from tpudiag.report.registry import renders
from tpudiag.report.units import (BREAKDOWN_PARTS, device_lines, fmt_pct, fmt_s, fusion_summary_lines, printable,
                                  setup_line, short_source)


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


@renders("tpudiag.report", "md")
def render_profile_markdown(report, top: int = 15, top_compiles: int = 10) -> str:
    """A `ProfileReport` as Markdown: the first `top` ops and `top_compiles` compiles."""
    bd, share, steps = report.breakdown, report.breakdown_share, report.steps
    out = [f"## tpudiag profile: {code(report.program or report.artifacts.get('xplane', '?'))}", ""]
    status = _esc(report.status) + (f" ({_esc(report.reason)})" if report.reason else "")
    out += [f"**Status:** {status} · **Backend:** {_esc(report.backend)} · **Traced wall:** {fmt_s(report.wall_s)}"
            + (f" · **Steps:** {steps.count} (median {fmt_s(steps.median_s)})" if steps.count else ""), ""]
    if report.device is not None:
        out += ["### The device", ""] + [_esc(line) + "  " for line in device_lines(report.device)]
        out += ["", "### The whole trace window", ""]
    out += ["| part | time | share |", "|---|---:|---:|"]
    for key, label in BREAKDOWN_PARTS:
        out.append(f"| {label} | {fmt_s(getattr(bd, key))} | {fmt_pct(share[label])} |")
    out += ["", f"### Top ops by self time ({min(top, len(report.ops))} of {len(report.ops)})", ""]
    if report.ops:
        out += ["| op | module | category | count | self | share | source |", "|---|---|---|---:|---:|---:|---|"]
        for o in report.ops[:top]:
            out.append(f"| {code(o.name)} | {_esc(o.module)} | {_esc(o.category)} | {o.occurrences} | "
                       f"{fmt_s(o.self_s)} | {fmt_pct(o.share)} | {_esc(short_source(o.source))} |")
    else:
        out.append("_No op executed in the traced window._")
    if report.compile:
        hits = report.totals.compile_cache_hits
        out += ["", f"### Compilation: {fmt_s(report.totals.compile_s)}"
                + (f" ({hits} persistent-cache hits)" if hits else ""), "", "| function | compiles | tracing | lowering | backend |",
                "|---|---:|---:|---:|---:|"]
        for c in report.compile[:top_compiles]:
            out.append(f"| {code(c.function)} | {c.compiles} | {fmt_s(c.tracing_s)} | "
                       f"{fmt_s(c.lowering_s)} | {fmt_s(c.backend_compile_s)} |")
    lines = [line for summary in report.fusions for line in fusion_summary_lines(summary)]
    if lines or report.fusions_setup:
        out += ["", "### Fusion breaks", ""]
        out += code_block(lines + ([setup_line(report.fusions_setup)] if report.fusions_setup else []))
    if report.tpu_estimate is not None:
        est, backend = report.tpu_estimate, report.backend
        t = est.target
        chip, backend = _esc(t.chip), _esc(backend)
        out += ["", f"### Estimated on TPU {chip} ({_esc(t.topology)})", ""]
        if est.step.tpu_estimated_s is not None and est.step.measured_s is not None:
            out += [f"Step: device op time {fmt_s(est.step.measured_s)} measured (median step), "
                    f"{fmt_s(est.step.tpu_estimated_s)} estimated on {chip}.", ""]
        elif est.step.tpu_estimated_s is not None:
            out += [f"Step: measured {fmt_s(steps.median_s)} on {backend}, estimated "
                    f"{fmt_s(est.step.tpu_estimated_s)} on {chip}.", ""]
        if est.ops is not None:  # measured on a TPU: each module and op beside its estimate
            out += ["| module | runs | measured / run | estimated / run | est. / meas. | status |",
                    "|---|---:|---:|---:|---:|---|"]
            for m in est.modules[:top]:
                out.append(f"| {code(m.name)} | {m.executions} | {fmt_s(m.measured_per_run_s)} | "
                           f"{fmt_s(m.tpu_estimated_s)} | {_ratio(m.estimate_ratio)} | {_esc(m.status)} |")
            out += ["", "| op | module | measured | estimated | est. / meas. | estimate from |",
                    "|---|---|---:|---:|---:|---|"]
            for o in est.ops[:top]:
                out.append(f"| {code(o.name)} | {_esc(o.module)} | {fmt_s(o.measured_s)} | {fmt_s(o.estimated_s)} | "
                           f"{_ratio(o.ratio)} | {_esc(o.cycles_source)} |")
        else:
            out += [f"| module | runs | {backend} op time | TPU est. / run | TPU est. total | status |",
                    "|---|---:|---:|---:|---:|---|"]
            for m in est.modules[:top]:
                out.append(f"| {code(m.name)} | {m.executions} | {fmt_s(m.cpu_self_s)} | "
                           f"{fmt_s(m.tpu_estimated_s)} | {fmt_s(m.tpu_estimated_total_s)} | {_esc(m.status)} |")
        out += ["", f"_{_esc(est.note)}_"]
        if est.suggestions is not None:
            from tpudiag.report.suggest_render import summary_lines

            out += ["", "### Suggestions", ""]
            out += [f"- {_esc(line)}" for line in summary_lines(est.suggestions, report.artifacts.get("run_dir"))]
    for w in report.warnings:
        out += ["", f"> **Warning:** {_esc(w)}"]
    return printable("\n".join(out) + "\n", newlines=True)
