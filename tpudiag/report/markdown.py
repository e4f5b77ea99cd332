"""Renders a `tpudiag.report/1` document as GitHub-flavoured Markdown (for `$GITHUB_STEP_SUMMARY`)."""

from __future__ import annotations

from tpudiag.report.units import BREAKDOWN_PARTS, fmt_pct, fmt_s, fusion_summary_lines, short_source


def _esc(text) -> str:
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def render_markdown(doc: dict, top: int = 15, top_compiles: int = 10) -> str:
    bd, share = doc["breakdown"], doc["breakdown_share"]
    out = [f"## tpudiag profile: `{_esc(doc.get('program') or doc['artifacts'].get('xplane', '?'))}`", ""]
    status = doc["status"] + (f" ({_esc(doc['reason'])})" if doc.get("reason") else "")
    out += [f"**Status:** {status} · **Backend:** {doc['backend']} · **Traced wall:** {fmt_s(doc['wall_s'])}"
            + (f" · **Steps:** {doc['steps']['count']} (median {fmt_s(doc['steps']['median_s'])})"
               if doc["steps"]["count"] else ""), ""]
    out += ["| part | time | share |", "|---|---:|---:|"]
    for key, label in BREAKDOWN_PARTS:
        out.append(f"| {label} | {fmt_s(bd[key])} | {fmt_pct(share[label])} |")
    out += ["", f"### Top ops by self time ({min(top, len(doc['ops']))} of {len(doc['ops'])})", ""]
    if doc["ops"]:
        out += ["| op | module | category | count | self | share | source |", "|---|---|---|---:|---:|---:|---|"]
        for o in doc["ops"][:top]:
            out.append(f"| `{_esc(o['name'])}` | {_esc(o['module'])} | {o['category']} | {o['occurrences']} | "
                       f"{fmt_s(o['self_s'])} | {fmt_pct(o['share'])} | {_esc(short_source(o['source']))} |")
    else:
        out.append("_No op executed in the traced window._")
    if doc["compile"]:
        hits = doc["totals"].get("compile_cache_hits", 0)
        out += ["", f"### Compilation: {fmt_s(doc['totals'].get('compile_s'))}"
                + (f" ({hits} persistent-cache hits)" if hits else ""), "", "| function | compiles | tracing | lowering | backend |",
                "|---|---:|---:|---:|---:|"]
        for c in doc["compile"][:top_compiles]:
            out.append(f"| `{_esc(c['function'])}` | {c['compiles']} | {fmt_s(c['tracing_s'])} | "
                       f"{fmt_s(c['lowering_s'])} | {fmt_s(c['backend_compile_s'])} |")
    if doc.get("fusions"):
        out += ["", "### Fusion breaks", "", "```"]
        for summary in doc["fusions"]:
            out += fusion_summary_lines(summary)
        out += ["```"]
    if "tpu_estimate" in doc:
        est, backend = doc["tpu_estimate"], doc["backend"]
        t = est["target"]
        out += ["", f"### Estimated on TPU {t['chip']} ({t['topology']})", ""]
        if est["step"]["tpu_estimated_s"] is not None:
            out += [f"Step: measured {fmt_s(doc['steps']['median_s'])} on {backend}, estimated "
                    f"{fmt_s(est['step']['tpu_estimated_s'])} on {t['chip']}.", ""]
        out += [f"| module | runs | {backend} op time | TPU est. / run | TPU est. total | status |",
                "|---|---:|---:|---:|---:|---|"]
        for m in est["modules"][:top]:
            out.append(f"| `{_esc(m['name'])}` | {m['executions']} | {fmt_s(m['cpu_self_s'])} | "
                       f"{fmt_s(m['tpu_estimated_s'])} | {fmt_s(m['tpu_estimated_total_s'])} | {_esc(m['status'])} |")
        out += ["", f"_{_esc(est['note'])}_"]
    for w in doc.get("warnings", []):
        out += ["", f"> **Warning:** {_esc(w)}"]
    return "\n".join(out) + "\n"
