"""Renders an `HloDiff` (tpudiag.hlo_diff/1, results/hlo_diff.py) as text, Markdown or HTML.

Text is unified-diff-like, grouped by computation: `+` added, `-` removed, `~` changed, `>` moved
into, out of or between fusions; ops inside a fusion are indented under it; each change follows on
its own line. Markdown is the summary and the first changes as tables. HTML is one self-contained
file (inline CSS, no script, no external asset) with the two modules side by side; every name
that came from the program or the compiler is escaped, so an op named `<script>` stays text.
In all three, control characters in those names are made `printable` (a raw ESC never reaches the
terminal or the page); Markdown writes them through `markdown._esc` / `markdown.code`.

They read the model's attributes and compute nothing.
"""

from __future__ import annotations

import html

from tpudiag.report.markdown import _esc, code
from tpudiag.report.registry import renders
from tpudiag.report.units import clip, fmt_bytes, fmt_s, printable

MARKS = {"added": "+", "removed": "-", "changed": "~", "moved": ">", "unchanged": " "}
_OPERANDS_CHARS = 100  # an added op's operand list beyond this is cut (a root tuple has hundreds)


def _fmt_flops(n) -> str:
    if n is None:
        return "-"
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}FLOP"
    return f"{int(n)} FLOP"


def _side_rows(diff) -> list[tuple[str, str, str]]:
    a, b = diff.a, diff.b
    rows = [("instructions", str(a.instructions), str(b.instructions)),
            ("fusions", str(a.fusions), str(b.fusions)),
            ("fused instructions", str(a.fused_instructions), str(b.fused_instructions)),
            ("FLOPs", _fmt_flops(a.flops), _fmt_flops(b.flops)),
            ("bytes accessed", fmt_bytes(a.bytes_accessed), fmt_bytes(b.bytes_accessed))]
    if a.time_s is not None or b.time_s is not None:
        rows.append(("time", fmt_s(a.time_s), fmt_s(b.time_s)))
    return rows


def _counts_line(diff) -> str:
    s = diff.summary
    moved = f"{s.moved} moved ({s.moved_into_fusions} into fusions, {s.moved_out_of_fusions} out of fusions)"
    return f"{s.added} added, {s.removed} removed, {s.changed} changed, {moved}, {s.unchanged} unchanged"


def _names(p) -> str:
    a, b = p.a, p.b
    if a is None or b is None:
        return a or b
    return a if a == b else f"{a} -> {b}"


def _figures(p) -> str:
    """`FLOPs 1 G -> 2 G, bytes ..., time ...` for what differs (or what one side has)."""
    out = []
    for label, ka, kb, fmt in (("FLOPs", "flops_a", "flops_b", _fmt_flops),
                               ("bytes", "bytes_accessed_a", "bytes_accessed_b", fmt_bytes),
                               ("time", "time_a_s", "time_b_s", fmt_s)):
        va, vb = getattr(p, ka), getattr(p, kb)
        if not va and not vb and (label != "time" or va is None or vb is None):
            continue  # nothing, or zero on both sides (a matched op's 0 ns time is still shown)
        if p.a is None or p.b is None:
            out.append(f"{label} {fmt(va if vb is None else vb)}")
        elif va is None or vb is None:  # an op inside a fusion has no figures of its own
            out.append(f"{label} {'fused' if va is None else fmt(va)} -> {'fused' if vb is None else fmt(vb)}")
        elif fmt(va) != fmt(vb) or label == "time":  # a matched op's time is worth seeing even when equal
            out.append(f"{label} {fmt(va)} -> {fmt(vb)}")
    return ", ".join(out)


def _group_title(diff, comp: str) -> str:
    """`comp`, or `a -> comp` where B's computation `comp` is A's under another name."""
    for c in diff.computations:
        if c.b == comp and c.a and c.a != comp:
            return f"{c.a} -> {comp}"
    return comp


def render_diff_text(diff, unchanged: bool = False) -> str:
    """An `HloDiff` as text; `unchanged` also lists the ops that did not change, as context lines."""
    a, b = diff.a, diff.b
    out = [f"tpudiag hlo-diff: A {a.module} ({a.path})", f"                  B {b.module} ({b.path})", ""]
    rows = _side_rows(diff)
    width = max(len(r[0]) for r in rows)
    wa = max(len(r[1]) for r in rows + [("", "A", "")])
    wb = max(len(r[2]) for r in rows + [("", "", "B")])
    out.append(f"  {'':<{width}}  {'A':>{wa}}  {'B':>{wb}}")
    out += [f"  {k:<{width}}  {va:>{wa}}  {vb:>{wb}}" for k, va, vb in rows]
    out += ["", _counts_line(diff), "legend: + added, - removed, ~ changed, > moved (fusion membership)"]
    comp = None
    for p in diff.pairs:
        if p.status == "unchanged" and not unchanged:
            continue
        if p.computation != comp:
            comp = p.computation
            out += ["", f"@@ {_group_title(diff, comp)} @@"]
        fused = (p.fusion_b if p.b is not None else p.fusion_a) is not None
        indent = "  " if fused else ""
        mark = MARKS[p.status]
        if p.status in ("added", "removed"):
            side = "b" if p.status == "added" else "a"
            literal = getattr(p, f"literal_{side}")
            if literal is None:
                literal = clip(", ".join(getattr(p, f"operands_{side}") or []), _OPERANDS_CHARS, "...")
            line = f"{indent}{mark} {getattr(p, side)} = {getattr(p, f'shape_{side}')} {p.opcode}({literal})"
        else:
            line = f"{indent}{mark} {_names(p)}  {p.opcode}"
        figures = _figures(p) if p.status != "unchanged" else ""
        out.append(line + (f"  [{figures}]" if figures else ""))
        out += [f"{indent}      {c}" for c in p.changes]
    if not diff.has_changes:
        out += ["", "no change"]
    # Every element is one line, so a newline inside a name is escaped with the rest.
    return "\n".join(printable(line) for line in out) + "\n"


@renders("tpudiag.hlo_diff", "terminal")
def render_diff_terminal(diff, console, unchanged: bool = False) -> None:
    """`render_diff_text` written to the console's file as it is (no wrapping, no markup)."""
    console.file.write(render_diff_text(diff, unchanged=unchanged))
    console.file.flush()


@renders("tpudiag.hlo_diff", "md")
def render_diff_markdown(diff, top: int = 50, **_) -> str:
    """The summary, then the first `top` added/removed/changed/moved instructions in program order."""
    a, b = diff.a, diff.b
    out = [f"## tpudiag hlo-diff: {code(a.module)} -> {code(b.module)}", "",
           f"A: {code(a.path)}  ", f"B: {code(b.path)}", "",
           "| | A | B |", "|---|---:|---:|"]
    out += [f"| {k} | {va} | {vb} |" for k, va, vb in _side_rows(diff)]
    out += ["", f"**{_esc(_counts_line(diff))}**"]
    changes = diff.changed_pairs
    if not changes:
        return printable("\n".join(out + ["", "No change."]) + "\n", newlines=True)
    out += ["", "| | A | B | opcode | computation | fusion (A -> B) | changes |", "|---|---|---|---|---|---|---|"]
    for p in changes[:top]:
        fusion = " -> ".join(_esc(f or "-") for f in (p.fusion_a, p.fusion_b))
        what = "<br>".join(_esc(c) for c in p.changes)
        figures = _figures(p)
        if figures:
            what = (what + "<br>" if what else "") + _esc(figures)
        out.append(f"| {p.status} | {code(p.a) if p.a else '-'} | "
                   f"{code(p.b) if p.b else '-'} | {_esc(p.opcode)} | "
                   f"{code(p.computation)} | {fusion} | {what} |")
    if len(changes) > top:
        out += ["", f"{len(changes) - top} more in the JSON document (`--json`)."]
    return printable("\n".join(out) + "\n", newlines=True)


_CSS = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; }
h1 { font-size: 1.3em; } code, td.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
table { border-collapse: collapse; }
table.summary td, table.summary th { padding: 2px 12px; text-align: right; border-bottom: 1px solid #ddd; }
table.summary td:first-child, table.summary th:first-child { text-align: left; }
table.diff { width: 100%; table-layout: fixed; margin-top: 1em; }
table.diff th, table.diff td { padding: 2px 6px; vertical-align: top; border-bottom: 1px solid #eee;
  overflow-wrap: anywhere; font-size: 12px; }
table.diff th { background: #f4f4f4; position: sticky; top: 0; text-align: left; }
tr.comp td { background: #e8eef7; font-weight: 600; }
tr.added td.b, tr.added td.st { background: #e6ffec; }
tr.removed td.a, tr.removed td.st { background: #ffebe9; }
tr.changed td.st, tr.changed td.ch { background: #fff8c5; }
tr.moved td.st, tr.moved td.ch { background: #ddf4ff; }
td.fused { padding-left: 1.5em; }
#hide:checked ~ table.diff tr.unchanged { display: none; }
.muted { color: #777; }
"""


def _h(x) -> str:
    return html.escape(printable(x), quote=True)


@renders("tpudiag.hlo_diff", "html")
def render_diff_html(diff) -> str:
    """An `HloDiff` as one self-contained HTML page: summary, then every pair side by side
    (unchanged rows hidden by a checkbox, no script)."""
    a, b = diff.a, diff.b
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>tpudiag hlo-diff: {_h(a.module)} vs {_h(b.module)}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>tpudiag hlo-diff: <code>{_h(a.module)}</code> &rarr; <code>{_h(b.module)}</code></h1>",
           f"<p>A: <code>{_h(a.path)}</code><br>B: <code>{_h(b.path)}</code></p>",
           '<table class="summary"><tr><th></th><th>A</th><th>B</th></tr>']
    out += [f"<tr><td>{_h(k)}</td><td>{_h(va)}</td><td>{_h(vb)}</td></tr>" for k, va, vb in _side_rows(diff)]
    out += ["</table>", f"<p><b>{_h(_counts_line(diff))}</b></p>",
            '<input type="checkbox" id="hide" checked> <label for="hide">hide unchanged</label>',
            '<table class="diff"><colgroup><col style="width:16%"><col style="width:15%"><col style="width:9%">'
            '<col style="width:6%"><col style="width:16%"><col style="width:15%"><col style="width:9%">'
            '<col style="width:14%"></colgroup>',
            "<thead><tr><th>A</th><th>shape</th><th>fusion</th><th>status</th><th>B</th><th>shape</th>"
            "<th>fusion</th><th>changes</th></tr></thead><tbody>"]
    comp = None
    for p in diff.pairs:
        if p.computation != comp:
            comp = p.computation
            out.append(f'<tr class="comp"><td colspan="8">{_h(_group_title(diff, comp))}</td></tr>')
        figures = _figures(p) if p.status != "unchanged" else ""
        changes = "<br>".join(_h(c) for c in (*p.changes, *([figures] if figures else [])))
        where = " ".join(x for x in (p.op_name, p.source) if x)
        cells = []
        for side in ("a", "b"):
            name, fusion = getattr(p, side), getattr(p, f"fusion_{side}")
            tip = f' title="{_h(where)}"' if where and name else ""
            fused = " fused" if fusion else ""
            shown = f"{_h(name)} <span class=muted>{_h(p.opcode)}</span>" if name else ""
            cells.append(f'<td class="{side} mono{fused}"{tip}>{shown}</td>'
                         f'<td class="{side} mono">{_h(getattr(p, f"shape_{side}"))}</td>'
                         f'<td class="{side} mono">{_h(fusion)}</td>')
        out.append(f'<tr class="{_h(p.status)}">{cells[0]}'
                   f'<td class="st">{_h(MARKS[p.status])} {_h(p.status)}</td>'
                   f'{cells[1]}<td class="ch">{changes}</td></tr>')
    out += ["</tbody></table>", "</body></html>"]
    return "\n".join(out) + "\n"
