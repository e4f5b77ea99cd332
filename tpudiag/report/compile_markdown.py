"""Renders a `tpudiag.compile/1` document as GitHub-flavoured Markdown."""

from __future__ import annotations

from tpudiag.report.markdown import _esc
from tpudiag.report.units import fmt_bytes, fmt_int, fmt_s, fusion_summary_lines, short_source


def render_compile_markdown(doc: dict, top: int = 10) -> str:
    t = doc["target"]
    out = [f"## tpudiag compile: `{_esc(doc['source'].get('input', '?'))}` for {t['chip']} ({t['topology']})", ""]
    out += ["| module | status | estimated TPU time | XLA optimal | peak HBM | static profile |",
            "|---|---|---:|---:|---:|---|"]
    for m in doc["modules"]:
        tot = m["totals"] or {}
        mem = tot.get("memory") or {}
        peak = f"{fmt_bytes(mem.get('peak_hbm_bytes'))}" + ("" if mem.get("fits", True) else " **(does not fit)**")
        status = m["status"] if m["status"] == "ok" else f"failed: {_esc(m['error'])}"
        out.append(f"| `{_esc(m['name'])}` | {status} | {fmt_s(tot.get('estimated_s'))} | "
                   f"{fmt_s(tot.get('xla_optimal_s'))} | {peak if tot else '-'} | {_esc(m['static_profile'])} |")
    for m in doc["modules"]:
        if not m["ops"]:
            continue
        out += ["", f"### `{_esc(m['name'])}`: top ops by estimated time", "",
                "| op | opcode | est. time | bound by | cycles | FLOPs | bytes | source | what limits it |",
                "|---|---|---:|---|---:|---:|---:|---|---|"]
        for o in m["ops"][:top]:
            out.append(f"| `{_esc(o['name'])}` | {o['opcode']} | {fmt_s(o['estimated_s'])} | {o['bound_by']} | "
                       f"{fmt_int(o['estimated_cycles'])} | {fmt_int(o['flops'])} | {fmt_bytes(o['bytes_accessed'])} | "
                       f"{_esc(short_source(o['source']))} | {_esc(o['limit'])} |")
        if m.get("fusions"):
            out += ["", "```", *fusion_summary_lines(m["fusions"]), "```"]
        for f in m.get("findings", []):
            out += ["", f"> {_esc(f)}"]
    return "\n".join(out) + "\n"
