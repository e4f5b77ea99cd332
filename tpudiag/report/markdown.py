"""Renders a `ProfileReport` (tpudiag.report/1) as GitHub-flavoured Markdown (for
`$GITHUB_STEP_SUMMARY`). It reads the model's attributes and computes nothing."""

from __future__ import annotations

from tpudiag.report.units import BREAKDOWN_PARTS, fmt_pct, fmt_s, fusion_summary_lines, short_source


def _esc(text) -> str:
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def render_markdown(report, top: int = 15, top_compiles: int = 10) -> str:
    """A `ProfileReport` as Markdown: the first `top` ops and `top_compiles` compiles."""
    bd, share, steps = report.breakdown, report.breakdown_share, report.steps
    out = [f"## tpudiag profile: `{_esc(report.program or report.artifacts.get('xplane', '?'))}`", ""]
    status = report.status + (f" ({_esc(report.reason)})" if report.reason else "")
    out += [f"**Status:** {status} · **Backend:** {report.backend} · **Traced wall:** {fmt_s(report.wall_s)}"
            + (f" · **Steps:** {steps.count} (median {fmt_s(steps.median_s)})" if steps.count else ""), ""]
    out += ["| part | time | share |", "|---|---:|---:|"]
    for key, label in BREAKDOWN_PARTS:
        out.append(f"| {label} | {fmt_s(getattr(bd, key))} | {fmt_pct(share[label])} |")
    out += ["", f"### Top ops by self time ({min(top, len(report.ops))} of {len(report.ops)})", ""]
    if report.ops:
        out += ["| op | module | category | count | self | share | source |", "|---|---|---|---:|---:|---:|---|"]
        for o in report.ops[:top]:
            out.append(f"| `{_esc(o.name)}` | {_esc(o.module)} | {o.category} | {o.occurrences} | "
                       f"{fmt_s(o.self_s)} | {fmt_pct(o.share)} | {_esc(short_source(o.source))} |")
    else:
        out.append("_No op executed in the traced window._")
    if report.compile:
        hits = report.totals.compile_cache_hits
        out += ["", f"### Compilation: {fmt_s(report.totals.compile_s)}"
                + (f" ({hits} persistent-cache hits)" if hits else ""), "", "| function | compiles | tracing | lowering | backend |",
                "|---|---:|---:|---:|---:|"]
        for c in report.compile[:top_compiles]:
            out.append(f"| `{_esc(c.function)}` | {c.compiles} | {fmt_s(c.tracing_s)} | "
                       f"{fmt_s(c.lowering_s)} | {fmt_s(c.backend_compile_s)} |")
    if report.fusions:
        out += ["", "### Fusion breaks", "", "```"]
        for summary in report.fusions:
            out += fusion_summary_lines(summary)
        out += ["```"]
    if report.tpu_estimate is not None:
        est, backend = report.tpu_estimate, report.backend
        t = est.target
        out += ["", f"### Estimated on TPU {t.chip} ({t.topology})", ""]
        if est.step.tpu_estimated_s is not None:
            out += [f"Step: measured {fmt_s(steps.median_s)} on {backend}, estimated "
                    f"{fmt_s(est.step.tpu_estimated_s)} on {t.chip}.", ""]
        out += [f"| module | runs | {backend} op time | TPU est. / run | TPU est. total | status |",
                "|---|---:|---:|---:|---:|---|"]
        for m in est.modules[:top]:
            out.append(f"| `{_esc(m.name)}` | {m.executions} | {fmt_s(m.cpu_self_s)} | "
                       f"{fmt_s(m.tpu_estimated_s)} | {fmt_s(m.tpu_estimated_total_s)} | {_esc(m.status)} |")
        out += ["", f"_{_esc(est.note)}_"]
    for w in report.warnings:
        out += ["", f"> **Warning:** {_esc(w)}"]
    return "\n".join(out) + "\n"
