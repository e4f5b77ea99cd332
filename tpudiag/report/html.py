"""Renders a `ProfileReport` (tpudiag.report/1) or a `CompileReport` (tpudiag.compile/1) as one
self-contained HTML page.

Reads the model's attributes, and for a profile optionally the op instances of one step
(`timeline_rows`, below), which the report does not carry. Returns the page as a string: inline
CSS and inline SVG only, no script, no font, image or link to fetch, so it opens offline and from
a CI artifact.

Sections: header (program, status, backend or target, warnings), where the time went (stacked bar),
top ops (table with bars), one step's timeline (profile), a roofline scatter of the ops against the
chip's ceilings (compile), fusion breaks, suggestions. Every string that came from the program, the
compiler or the file system is escaped with `html.escape`, so an op named `<script>` stays text,
after `printable` has written its control characters as escapes (`\\x1b`), so none is on the page.

It computes no figure: times, shares, totals and rankings are the models'. Pixel geometry (bar
lengths, axis positions, the roofline's log coordinates) is layout, derived here from the models' fields.
"""

from __future__ import annotations

import html
import math

from tpudiag.report.html_style import CSS
from tpudiag.report.registry import renders
from tpudiag.report.units import (BREAKDOWN_PARTS, clip, device_lines, fmt_bytes, fmt_count, fmt_ghz, fmt_pct,
                                  fmt_runs, fmt_s, printable, short_source)

# One colour per breakdown part; the same hues as the terminal report.
_PART_COLORS = {"compute": "#2e9e4f", "memory": "#e0a106", "communication": "#b0449a", "host": "#1f9bb5",
                "compile": "#3b6fd6", "idle": "#b9b9b9"}
# One colour per op category (docs/categories.md); a category not listed is drawn grey.
_CATEGORY_COLORS = {"matmul": "#2e7d32", "convolution": "#66bb6a", "fusion:loop": "#f2a900",
                    "fusion:input": "#ef6c00", "fusion:output": "#8e44ad", "fusion:custom": "#795548",
                    "collective": "#c2185b", "host_transfer": "#00838f", "custom_call": "#5d4037",
                    "control_flow": "#90a4ae", "reduction": "#1565c0", "data_movement": "#ffd54f",
                    "elementwise": "#26a69a", "unknown": "#bdbdbd",
                    # the cross-process timeline: a collective's waiting for the last device, other ops
                    "waiting": "#f8bbd0", "compute": "#2e9e4f"}
_OTHER_COLOR = "#9e9e9e"
# What bounds a compile-run op (`bound_by`), for the roofline's points.
_BOUND_COLORS = {"compute": "#2e7d32", "hbm": "#e0a106", "static_cycles": "#3b6fd6", "ici": "#c2185b"}
_MODULE_COLORS = ("#3b6fd6", "#2e9e4f", "#e0a106", "#b0449a", "#1f9bb5", "#ef6c00", "#795548", "#26a69a",
                  "#c2185b", "#8e44ad")

_PAGE_W = 1100          # px: the SVG pictures' width; the page is readable in a 1280-px window
_TIMELINE_LANES = 12    # lanes (trace lines) drawn; a CPU step has 2-4, a TPU step a few streams
_ROOFLINE_LABELS = 5    # points named on the roofline: the ops with the most estimated time
_TOP_MODULES = 3        # compile runs: modules with an op table and a fusion table (as in the terminal)
_COMPILE_TOP_OPS = 10   # ops per module table of a compile run: `tpudiag compile --top`'s default


def _h(x) -> str:
    return html.escape(printable(x), quote=True)


def _text_w(text: str, size: float = 12) -> float:
    """Rough rendered width of `text` in px (no font metrics offline; 0.6 em per character)."""
    return 0.6 * size * len(text)


def _cat_color(category: str | None) -> str:
    return _CATEGORY_COLORS.get(category or "", _OTHER_COLOR)


def _svg(width: float, height: float, label: str, body: list[str]) -> str:
    return (f'<svg width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
            f'aria-label="{_h(label)}">' + "".join(body) + "</svg>")


def _legend(items: list[tuple[str, str]]) -> str:
    """HTML legend: (colour, already-escaped label) pairs."""
    return ('<div class="legend">' + " ".join(f'<span class="item"><span class="sw" style="background:{c}"></span>'
                                              f"{label}</span>" for c, label in items) + "</div>")


def _table(head: list[tuple[str, bool]], rows: list[list[str]]) -> str:
    """`head`: (title, numeric) columns; `rows`: cells already escaped."""
    out = ["<table><thead><tr>"]
    out += [f'<th class="num">{_h(t)}</th>' if num else f"<th>{_h(t)}</th>" for t, num in head]
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append("<tr>" + "".join(f'<td class="num">{c}</td>' if num else
                                    (f'<td class="name">{c}</td>' if i == 0 else f"<td>{c}</td>")
                                    for i, ((_, num), c) in enumerate(zip(head, r))) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _stacked_bar(parts: list[tuple[str, float, str, str]], label: str) -> str:
    """One horizontal bar of `(name, fraction 0..1, colour, tooltip)` segments, with their names
    written inside the segments wide enough to hold them."""
    w, h = _PAGE_W, 40
    body, x = [], 0.0
    for name, frac, color, tip in parts:
        seg = max(0.0, frac) * w
        if seg <= 0:
            continue
        body.append(f'<rect x="{x:.1f}" y="0" width="{seg:.1f}" height="{h}" fill="{color}">'
                    f"<title>{_h(tip)}</title></rect>")
        if seg > _text_w(name) + 10:
            body.append(f'<text x="{x + 6:.1f}" y="{h / 2 + 4:.0f}" style="fill:#fff;font-weight:600">'
                        f"{_h(name)}</text>")
        x += seg
    return _svg(w, h, label, body)


def _hbar(frac: float, color: str, tip: str, width: int = 220) -> str:
    """A small bar for a table cell, `frac` (0..1) of `width` long."""
    seg = max(1.0, min(1.0, frac) * width) if frac > 0 else 0.0
    return (f'<svg width="{width}" height="14" viewBox="0 0 {width} 14" role="img" aria-label="{_h(tip)}" '
            f'style="margin:0"><rect x="0" y="1" width="{width}" height="12" fill="#f1f1f1"/>'
            f'<rect x="0" y="1" width="{seg:.1f}" height="12" fill="{color}"><title>{_h(tip)}</title></rect></svg>')


# ---------------------------------------------------------------------------------------------- header


def _profile_title(report) -> str:
    return report.program or report.artifacts.get("xplane") or "?"


def _profile_header(report) -> list[str]:
    status, steps = report.status, report.steps
    out = [f"<h1>tpudiag profile: <code>{_h(_profile_title(report))}</code></h1>",
           f'<p class="meta">status <span class="{"ok" if status == "ok" else "bad"}">{_h(status)}</span>'
           + (f" ({_h(report.reason)})" if report.reason else "")
           + (f" &middot; exit code {_h(report.exit_code)}" if report.exit_code not in (None, 0) else "") + "</p>",
           f'<p class="meta">backend <b>{_h(report.backend)}</b> &middot; devices {len(report.devices)}'
           + (f" on host <code>{_h(report.host)}</code>" if report.host else "")
           + f" &middot; traced {_h(fmt_s(report.wall_s))}"
           + (f" of {_h(fmt_s(report.process_wall_s))} process wall" if report.process_wall_s is not None else "")
           + (f" &middot; steps {steps.count} (median {_h(fmt_s(steps.median_s))})" if steps.count else "")
           + "</p>"]
    est = report.tpu_estimate
    if est is not None:
        t = est.target
        out.append(f'<p class="meta">TPU target <b>{_h(t.chip)}</b> ({_h(t.topology)}): estimated '
                   f'{_h(fmt_s(est.step.tpu_estimated_s))} per step, status {_h(est.status)} '
                   f'<span class="muted">({_h(est.note)})</span></p>')
    if report.command:
        out.append(f'<p class="meta muted">command <code>{_h(report.command)}</code></p>')
    run_dir = report.artifacts.get("run_dir")
    if run_dir:
        out.append(f'<p class="meta muted">run directory <code>{_h(run_dir)}</code></p>')
    if report.warnings:
        out.append('<ul class="warn">' + "".join(f"<li>{_h(w)}</li>" for w in report.warnings) + "</ul>")
    return out


def _compile_header(report) -> list[str]:
    t, src, totals = report.target, report.source, report.totals
    status = report.status
    per = "chip" if t.devices_per_chip == 1 else f"device (1/{t.devices_per_chip} chip)"
    out = [f"<h1>tpudiag compile: <code>{_h(src.get('input', '?'))}</code></h1>",
           f'<p class="meta">status <span class="{"ok" if status == "ok" else "bad"}">{_h(status)}</span>'
           f' &middot; input kind {_h(src.get("kind", "?"))} &middot; {totals.modules} modules'
           f' ({totals.failed} failed) &middot; estimated TPU time {_h(fmt_s(totals.estimated_s))}'
           " (sum of the modules, one execution each)</p>",
           f'<p class="meta">target <b>{_h(t.chip)}</b> ({_h(t.topology)}, {_h(t.chips)} chips): '
           f'{_h(fmt_count(t.peak_bf16_flops_per_s, "FLOP/s"))} bf16, '
           f'{_h(fmt_bytes(t.hbm_bytes))} HBM per {_h(per)} at {_h(fmt_count(t.hbm_bytes_per_s, "B/s"))}, '
           f'clock {fmt_ghz(t.clock_hz)}</p>']
    if t.note:
        out.append(f'<p class="meta">{_h(t.note)}</p>')
    shadow = src.get("shadow_run")
    if shadow and shadow.get("status") != "ok":
        out.append(f'<p class="meta bad">the script run that collected the computations: {_h(shadow.get("status"))}'
                   f' ({_h(shadow.get("reason"))})</p>')
    run_dir = (report.artifacts or {}).get("run_dir")
    if run_dir:
        out.append(f'<p class="meta muted">run directory <code>{_h(run_dir)}</code></p>')
    notes = [f"{m.name}: failed: {m.error}" for m in report.failed_modules]
    notes += [f"{m.name}: {f}" for m in report.modules for f in m.findings]
    if notes:
        out.append('<ul class="warn">' + "".join(f"<li>{_h(n)}</li>" for n in notes) + "</ul>")
    return out


# ------------------------------------------------------------------------------------------- breakdown


def _profile_breakdown(report, top_compiles: int) -> list[str]:
    bd, share = report.breakdown, report.breakdown_share
    out = ['<section id="breakdown"><h2>Where the time went</h2>']
    if report.device is not None:  # a TPU: its own time first, per step (docs/tpu.md)
        out.append("<h3>The device</h3>" + "".join(f"<p>{_h(line)}</p>" for line in device_lines(report.device))
                   + "<h3>The whole trace window (host and device)</h3>")
    if share.get("idle") is None:
        return out + ['<p class="muted">The trace window is empty: nothing to break down.</p></section>']
    parts = [(label, share[label], _PART_COLORS[label], f"{label} {fmt_s(getattr(bd, key))} ({fmt_pct(share[label])})")
             for key, label in BREAKDOWN_PARTS]
    out.append(_stacked_bar(parts, f"breakdown of the {fmt_s(bd.total_s)} trace window"))
    out.append(_legend([(_PART_COLORS[label],
                         f"{_h(label)} <b>{_h(fmt_s(getattr(bd, key)))}</b> ({_h(fmt_pct(share[label]))})")
                        for key, label in BREAKDOWN_PARTS]))
    out.append(f'<p class="muted">of the {_h(fmt_s(bd.total_s))} trace window; definitions in docs/breakdown.md</p>')
    if report.compile:
        rows = [[f"<code>{_h(c.function)}</code>", _h(c.compiles), _h(fmt_s(c.tracing_s)),
                 _h(fmt_s(c.lowering_s)), _h(fmt_s(c.backend_compile_s)), _h(fmt_s(c.total_s))]
                for c in report.compile[:top_compiles]]
        out.append(f"<h3>Compilation: {_h(fmt_s(report.totals.compile_s))} in the whole run</h3>")
        out.append(_table([("function", False), ("compiles", True), ("tracing", True), ("lowering", True),
                           ("backend", True), ("total", True)], rows))
    est = report.tpu_estimate
    if est is not None and est.modules:
        rows = [[f"<code>{_h(m.name)}</code>", _h(m.status), _h(m.executions), _h(fmt_s(m.cpu_self_s)),
                 _h(fmt_s(m.tpu_estimated_s)), _h(fmt_s(m.tpu_estimated_total_s))] for m in est.modules]
        out.append(f"<h3>Measured here vs estimated on {_h(est.target.topology)}</h3>")
        out.append(_table([("module", False), ("compile", False), ("runs", True), ("measured self", True),
                           ("TPU est. per run", True), ("TPU est. total", True)], rows))
    return out + ["</section>"]


def _compile_breakdown(report) -> list[str]:
    out = ['<section id="breakdown"><h2>Where the estimated TPU time goes</h2>']
    total = report.totals.estimated_s
    shares = report.module_shares
    colors = {m.name: _MODULE_COLORS[i % len(_MODULE_COLORS)] for i, (m, _) in enumerate(shares)}
    if shares:
        parts = [(clip(m.name, 24), share, colors[m.name], f"{m.name} {fmt_s(m.estimated_s)}") for m, share in shares]
        out.append(_stacked_bar(parts, f"estimated TPU time by module, {fmt_s(total)} in all"))
        out.append(_legend([(colors[m.name], f"<code>{_h(m.name)}</code> {_h(fmt_s(m.estimated_s))}")
                            for m, _ in shares]))
        out.append('<p class="muted">one execution of each module; static estimates and roofline floors, '
                   "not measurements</p>")
    rows = []
    for m in report.modules:
        tot = m.totals
        hbm = _h(fmt_bytes(m.memory.get("peak_hbm_bytes"))) if m.memory else "-"
        status = _h("ok") if m.ok else f'<span class="bad">{_h("failed: " + str(m.error))}</span>'
        rows.append([f"<code>{_h(m.name)}</code>", status,
                     _h(fmt_s(m.estimated_s)), _h(fmt_s(getattr(tot, "xla_optimal_s", None))),
                     hbm if m.fits else f'<span class="bad">{hbm}</span>', _h(getattr(tot, "ops", "-")),
                     _h(m.static_profile)])
    out.append("<h3>Modules</h3>")
    out.append(_table([("module", False), ("status", False), ("est. TPU time", True), ("XLA optimal", True),
                       ("peak HBM", True), ("ops", True), ("static profile", False)], rows))
    return out + ["</section>"]


# --------------------------------------------------------------------------------------------- top ops


def _profile_top_ops(report, top: int) -> list[str]:
    ops = report.ops[:top]
    out = [f'<section id="top-ops"><h2>Top ops by self time ({len(ops)} of {len(report.ops)})</h2>']
    if not ops:
        return out + ['<p class="muted">No op executed in the traced window.</p></section>']
    top = ops[0].self_s or 0
    rows = []
    for o in ops:
        tip = f"{o.name}: {fmt_s(o.self_s)} self, {fmt_pct(o.share)} of op time"
        rows.append([f"<code>{_h(o.name)}</code>", _h(o.module), _h(o.category), _h(o.occurrences),
                     _h(fmt_s(o.self_s)), _h(fmt_pct(o.share)),
                     _hbar(o.self_s / top if top else 0, _cat_color(o.category), tip),
                     f'<span class="mono" title="{_h(o.source)}">{_h(short_source(o.source))}</span>'])
    out.append(_table([("op", False), ("module", False), ("category", False), ("count", True), ("self", True),
                       ("share", True), ("self time", False), ("source", False)], rows))
    cats = list(dict.fromkeys(o.category for o in ops))
    out.append(_legend([(_cat_color(c), _h(c)) for c in cats]))
    return out + ["</section>"]


def _compile_top_ops(report) -> list[str]:
    out = ['<section id="top-ops"><h2>Top ops by estimated TPU time</h2>']
    ranked = report.ranked_modules
    if not ranked:
        return out + ['<p class="muted">No module compiled.</p></section>']
    for m in ranked[:_TOP_MODULES]:
        ops = m.ops[:_COMPILE_TOP_OPS]
        top = ops[0].estimated_s or 0
        out.append(f"<h3><code>{_h(m.name)}</code>: {len(ops)} of {len(m.ops)} ops, "
                   f"{_h(fmt_s(m.estimated_s))} estimated</h3>")
        rows = []
        for o in ops:
            tip = f"{o.name}: {fmt_s(o.estimated_s)} estimated ({o.limit})"
            rows.append([f"<code>{_h(o.name)}</code>", _h(o.category), _h(fmt_runs(o.estimated_s, o.runs)),
                         _h(o.limit), _h(fmt_count(o.flops, "FLOP")), _h(fmt_bytes(o.bytes_accessed)),
                         _hbar(o.estimated_s / top if top else 0, _BOUND_COLORS.get(o.bound_by, _OTHER_COLOR), tip),
                         f'<span class="mono" title="{_h(o.source)}">{_h(short_source(o.source))}</span>'])
        out.append(_table([("op", False), ("category", False), ("est.", True), ("limit", False), ("FLOPs", True),
                           ("bytes", True), ("estimated time", False), ("source", False)], rows))
    bounds = list(dict.fromkeys(o.bound_by for m in ranked[:_TOP_MODULES] for o in m.ops[:_COMPILE_TOP_OPS]))
    out.append(_legend([(_BOUND_COLORS.get(b, _OTHER_COLOR), f"bound by {_h(b)}") for b in bounds]))
    if len(ranked) > _TOP_MODULES:
        out.append(f'<p class="muted">{len(ranked) - _TOP_MODULES} more module(s) with ops: report.json has '
                   "every op.</p>")
    return out + ["</section>"]


# -------------------------------------------------------------------------------------------- timeline


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _compile_timeline() -> list[str]:
    return ['<section id="timeline"><h2>One step\'s timeline</h2>',
            '<p class="muted">A compile run has no measured timeline: profile the program '
            "(<code>tpudiag profile</code>) to see one.</p></section>"]


def _timeline(report, rows: list[dict] | None) -> list[str]:
    """One step of a `ProfileReport`: `rows` are its op instances (`render_html`'s `timeline_rows`)."""
    out = ['<section id="timeline"><h2>One step\'s timeline</h2>']
    if not rows:
        why = ("the program marks no steps (<code>jax.profiler.StepTraceAnnotation</code>)" if not report.steps.count
               else "no op instances of a step were given to the renderer")
        return out + [f'<p class="muted">No timeline: {why}.</p></section>']
    return out + _timeline_svg(rows) + ["</section>"]


def _timeline_svg(rows: list[dict]) -> list[str]:
    """The lanes of `rows` (`render_html`'s `timeline_rows`), a caption and a legend."""
    out = []
    steps = {r.get("step") for r in rows}
    t0 = min(r["start_s"] for r in rows)
    t1 = max(r["start_s"] + r["duration_s"] for r in rows)
    span = (t1 - t0) or 1e-9
    lanes = list(dict.fromkeys(r["line"] for r in sorted(rows, key=lambda r: r["start_s"])))
    shown = lanes[:_TIMELINE_LANES]
    label_w, lane_h, pad, axis_h = 250, 30, 4, 28
    plot_w = _PAGE_W - label_w - 10
    height = axis_h + lane_h * len(shown) + 6
    body = []
    step = _nice_step(span)
    k = 0
    while k * step <= span * 1.0000001:
        x = label_w + k * step / span * plot_w
        body.append(f'<line x1="{x:.1f}" y1="{axis_h - 6}" x2="{x:.1f}" y2="{height}" stroke="#e3e3e3"/>'
                    f'<text x="{x:.1f}" y="{axis_h - 10}" text-anchor="middle" style="fill:#6b6b6b">'
                    f"+{_h(fmt_s(k * step))}</text>")
        k += 1
    for i, lane in enumerate(shown):
        y = axis_h + i * lane_h
        body.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{lane_h - 2}" fill="#fafafa"/>'
                    f'<text x="{label_w - 8}" y="{y + lane_h / 2 + 4:.0f}" text-anchor="end">{_h(clip(lane, 30))}'
                    f"<title>{_h(lane)}</title></text>")
    # Parents before the ops nested in them (a while before its body), so the inner ops are drawn on top.
    for r in sorted(rows, key=lambda r: (r["start_s"], -r["duration_s"])):
        if r["line"] not in shown:
            continue
        y = axis_h + shown.index(r["line"]) * lane_h + pad
        x = label_w + (r["start_s"] - t0) / span * plot_w
        w = max(1.0, r["duration_s"] / span * plot_w)
        tip = f"{r['op']} ({r['module']}, {r['category']}): {fmt_s(r['duration_s'])} at +{fmt_s(r['start_s'] - t0)}"
        body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h - 2 - 2 * pad}" '
                    f'fill="{_cat_color(r["category"])}" stroke="#fff" stroke-width="0.5">'
                    f"<title>{_h(tip)}</title></rect>")
        name = clip(r["op"], 30)
        if w > _text_w(name, 11) + 6:
            body.append(f'<text x="{x + 3:.1f}" y="{y + lane_h / 2}" style="font-size:11px">{_h(name)}</text>')
    which = f"step {next(iter(steps))}" if len(steps) == 1 and None not in steps else "the given op instances"
    out.append(f'<p class="muted">{_h(which)}: {len(rows)} op instances over {_h(fmt_s(t1 - t0))}, '
               "from its first op's start; hover an op for its name and time</p>")
    out.append(_svg(_PAGE_W, height, f"timeline of {which}", body))
    cats = list(dict.fromkeys(r["category"] for r in rows))
    out.append(_legend([(_cat_color(c), _h(c)) for c in cats]))
    if len(lanes) > len(shown):
        out.append(f'<p class="muted">{len(lanes) - len(shown)} more trace line(s) not drawn.</p>')
    return out


# -------------------------------------------------------------------------------------------- roofline


def _decades(lo: float, hi: float) -> tuple[int, int]:
    return math.floor(math.log10(lo)), math.ceil(math.log10(hi))


def _profile_roofline(report) -> list[str]:
    """A profile has no per-op FLOPs and bytes: the section says where a roofline is to be had."""
    if report.tpu_estimate is not None:
        where = report.artifacts.get("tpu_compile", "tpu")
        msg = (f"The roofline needs each op's FLOPs, bytes and estimated time, which are in the compile run of "
               f"this profile: <code>tpudiag report --html FILE RUN/{_h(where)}</code>.")
    else:
        msg = ("The roofline needs a TPU target: rerun with <code>tpudiag profile --target v5e</code> and open "
               "its compile run, or <code>tpudiag compile --target v5e</code> the program.")
    return ['<section id="roofline"><h2>Roofline</h2>', f'<p class="note">{msg}</p></section>']


def _compile_roofline(report) -> list[str]:
    """The ops of a `CompileReport` against its target's ceilings (intensities and rates are the model's)."""
    out = ['<section id="roofline"><h2>Roofline</h2>']
    t = report.target
    peak, bw = t.peak_bf16_flops_per_s, t.hbm_bytes_per_s
    ridge = t.ridge_flops_per_byte
    pts, left_out = [], 0
    for m in report.modules:
        for o in m.ops:
            ai, rate = o.arithmetic_intensity, o.achieved_flops_per_s
            if ai is not None and rate is not None:
                pts.append((ai, rate, m.name, o))
            else:
                left_out += 1
    if not pts:
        return out + ['<p class="muted">No op with both FLOPs and bytes to place.</p></section>']
    x_lo, x_hi = _decades(min(min(p[0] for p in pts), ridge / 10), max(max(p[0] for p in pts), ridge * 10))
    y_lo, y_hi = _decades(min(p[1] for p in pts), peak * 2)
    ml, mr, mt, mb = 80, 30, 20, 50
    pw, ph = _PAGE_W - ml - mr, 480

    def px(v):
        return ml + (math.log10(v) - x_lo) / (x_hi - x_lo) * pw

    def py(v):
        return mt + ph - (math.log10(v) - y_lo) / (y_hi - y_lo) * ph

    body = [f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fcfcfc" stroke="#ccc"/>']
    for e in range(x_lo, x_hi + 1):
        x = px(10.0 ** e)
        body.append(f'<line x1="{x:.1f}" y1="{mt}" x2="{x:.1f}" y2="{mt + ph}" stroke="#e8e8e8"/>'
                    f'<text x="{x:.1f}" y="{mt + ph + 18}" text-anchor="middle">{_h(fmt_count(10.0 ** e, ""))}</text>')
    for e in range(y_lo, y_hi + 1):
        y = py(10.0 ** e)
        body.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{ml + pw}" y2="{y:.1f}" stroke="#e8e8e8"/>'
                    f'<text x="{ml - 8}" y="{y + 4:.1f}" text-anchor="end">{_h(fmt_count(10.0 ** e, ""))}</text>')
    body.append(f'<text x="{ml + pw / 2}" y="{mt + ph + 40}" text-anchor="middle">arithmetic intensity '
                "(FLOP per byte of HBM traffic, log)</text>"
                f'<text transform="translate(18 {mt + ph / 2}) rotate(-90)" text-anchor="middle">'
                "FLOP/s at the estimated time (log)</text>")
    # The ceilings: HBM slope bw*x up to the ridge, then the flat bf16 peak.
    x_start = max(10.0 ** x_lo, 10.0 ** y_lo / bw)
    body.append(f'<polyline points="{px(x_start):.1f},{py(bw * x_start):.1f} {px(ridge):.1f},{py(peak):.1f} '
                f'{px(10.0 ** x_hi):.1f},{py(peak):.1f}" fill="none" stroke="#b3261e" stroke-width="2.5"/>')
    body.append(f'<text x="{px(10.0 ** x_hi) - 6:.1f}" y="{py(peak) - 8:.1f}" text-anchor="end" style="fill:#b3261e">'
                f'peak {_h(fmt_count(peak, "FLOP/s"))} bf16</text>')
    slope_x = 10 ** ((math.log10(x_start) + math.log10(ridge)) / 2)
    body.append(f'<text x="{px(slope_x) + 8:.1f}" y="{py(bw * slope_x) - 8:.1f}" style="fill:#b3261e" '
                f'text-anchor="end">HBM {_h(fmt_count(bw, "B/s"))}</text>')
    body.append(f'<line x1="{px(ridge):.1f}" y1="{py(peak):.1f}" x2="{px(ridge):.1f}" y2="{mt + ph}" stroke="#b3261e" '
                f'stroke-dasharray="4 4"/><text x="{px(ridge) + 4:.1f}" y="{mt + ph - 6}" style="fill:#b3261e">'
                f"ridge {ridge:.0f} FLOP/B</text>")
    for ai, rate, mod, o in pts:
        tip = (f"{o.name} ({mod}, {o.category}): {fmt_s(o.estimated_s)} estimated, {o.limit}; "
               f"{fmt_count(o.flops, 'FLOP')}, {fmt_bytes(o.bytes_accessed)}, {ai:.3g} FLOP/B, "
               f"{fmt_count(rate, 'FLOP/s')}")
        color = _BOUND_COLORS.get(o.bound_by, _OTHER_COLOR)
        body.append(f'<circle cx="{px(ai):.1f}" cy="{py(rate):.1f}" r="5" fill="{color}" fill-opacity="0.75" '
                    f'stroke="#333" stroke-width="0.6"><title>{_h(tip)}</title></circle>')
    for ai, rate, mod, o in sorted(pts, key=lambda p: -p[3].estimated_s)[:_ROOFLINE_LABELS]:
        name = clip(f"{o.name} ({mod})", 40)  # one name can recur in several modules
        x = px(ai) + 8
        anchor = "start" if x + _text_w(name, 11) < ml + pw else "end"
        body.append(f'<text x="{x if anchor == "start" else px(ai) - 8:.1f}" y="{py(rate) - 6:.1f}" '
                    f'text-anchor="{anchor}" style="font-size:11px">{_h(name)}</text>')
    out.append(f'<p class="muted">{len(pts)} ops of {len(report.modules)} modules on {_h(t.chip)}; each point is '
               "one op at its estimated time (FLOPs &divide; estimated seconds), so no op sits above the ceilings. "
               f"The {_ROOFLINE_LABELS} ops with the most estimated time are named; hover a point for its figures.</p>")
    out.append(_svg(_PAGE_W, mt + ph + mb + 10, f"roofline of {len(pts)} ops against {t.chip}", body))
    bounds = list(dict.fromkeys(p[3].bound_by for p in pts))
    out.append(_legend([(_BOUND_COLORS.get(b, _OTHER_COLOR), f"bound by {_h(b)}") for b in bounds]
                       + [("#b3261e", f"{_h(t.chip)} ceilings")]))
    if left_out:
        out.append(f'<p class="muted">{left_out} op(s) with no FLOPs or no bytes (pure data movement, '
                   "control) are not on a log-log plot.</p>")
    return out + ["</section>"]


# -------------------------------------------------------------------------------------- fusion breaks


def _fusions(summaries) -> list[str]:
    """The fusion summaries (`analyze.hlo.fusions.fusion_summary` documents) a report embeds."""
    out = ['<section id="fusions"><h2>Fusion breaks</h2>',
           '<p class="muted">A fusion break is a tensor one kernel writes to memory and another reads back '
           "(<code>tpudiag fusions RUN</code> lists them all).</p>"]
    if not summaries:
        return out + ['<p class="muted">No fusion summary: the run has no HLO dump of its modules.</p></section>']
    for s in summaries:
        out.append(f"<h3><code>{_h(s['module'])}</code>: {s['breaks']} breaks round-trip "
                   f"{_h(fmt_bytes(s['break_bytes']))}</h3>")
        out.append(f'<p class="meta">{s["fusions"]} fusions moving {_h(fmt_bytes(s["fusion_bytes"]))}; '
                   f'{_h(fmt_bytes(s["break_bytes_default_memory"]))} of the breaks in default memory (HBM on a TPU); '
                   f'{s["breaks_not_inferable"]} breaks with no reason the graph shows</p>')
        if not s["top_breaks"]:
            continue
        top = s["top_breaks"][0]["bytes"] or 0
        rows = [[f"<code>{_h(b['producer'])}</code> &rarr; <code>{_h(b['consumer'])}</code>", _h(fmt_bytes(b["bytes"])),
                 _hbar(b["bytes"] / top if top else 0, "#e0a106", f"{b['producer']} -> {b['consumer']}: "
                       f"{fmt_bytes(b['bytes'])}", width=160),
                 f"<code>{_h(b['shape'])}</code>", _h(f"S({b['memory_space']})"), _h(b["reason"])]
                for b in s["top_breaks"]]
        out.append(_table([("producer \u2192 consumer", False), ("bytes", True), ("", False), ("shape", False),
                           ("memory", False), ("reason", False)], rows))
    return out + ["</section>"]


def _suggestions(result) -> list[str]:
    """The compile report's unpriced suggestions; a profile run points at `tpudiag suggest`."""
    from tpudiag.report.suggest_render import summary_lines

    rep = getattr(result, "suggestions", None)
    run_dir = (result.artifacts or {}).get("run_dir")
    if rep is None:
        return ['<section id="suggestions"><h2>Suggestions</h2>',
                f'<p class="muted"><code>tpudiag suggest {_h(run_dir or "RUN")}</code> (after <code>profile '
                "--target</code>) names the ops that deserve a custom kernel, with the gain.</p></section>"]
    items = "".join(f"<li>{_h(line)}</li>" for line in summary_lines(rep, run_dir))
    return ['<section id="suggestions"><h2>Suggestions</h2>', f"<ul>{items}</ul></section>"]


def _distributed_sections(r) -> list[str]:
    """A `DistributedReport`: processes, collectives, skew and stragglers, one step with a lane per
    process and device."""
    out = ['<section id="processes"><h2>Processes</h2>']
    out.append(_table([("process", False), ("host", False), ("exit", True), ("step time", True), ("compute", True),
                       ("communication", True), ("exposed", True), ("waiting", True), ("overlap", True)],
                      [[_h(f"p{p.process_id}"), _h(p.host), _h("-" if p.exit_code is None else p.exit_code),
                        _h(fmt_s(p.step_time_s)), _h(fmt_s(p.compute_s)), _h(fmt_s(p.communication_s)),
                        _h(fmt_s(p.exposed_communication_s)), _h(fmt_s(p.wait_s)), _h(fmt_pct(p.overlap_ratio))]
                       for p in r.processes]))
    out.append('</section><section id="collectives"><h2>Collectives</h2>')
    out.append(_table([("op", False), ("kind", False), ("source", False), ("size", True), ("group", True),
                       ("runs", True), ("fastest", True), ("busbw", True), ("waiting", True), ("spread", True)],
                      [[_h(f"{c.module}/{c.op}"), _h(c.kind), _h(short_source(c.source)), _h(fmt_bytes(c.message_bytes)),
                        _h(c.group_size), _h(c.instances), _h(fmt_s(c.fastest_s)),
                        _h(fmt_count(c.busbw_bytes_per_s, "B/s")), _h(fmt_s(c.wait_s)), _h(fmt_s(c.arrival_spread_s))]
                       for c in r.collectives[:15]]))
    found = [f"p{w.waiter} waited {fmt_s(w.wait_s)} for p{w.waited_for} ({w.instances} collective runs)"
             for w in r.waiting[:5]]
    found += [f"straggler: p{s.process_id}, last in {s.steps_last} of {s.steps} steps, {fmt_s(s.mean_lag_s)} late "
              f"on average" for s in r.stragglers]
    if found:
        out.append("<ul>" + "".join(f"<li>{_h(x)}</li>" for x in found) + "</ul>")
    out.append('</section><section id="timeline"><h2>One step\'s timeline, a lane per process and device</h2>')
    rows = [{"op": g.op, "module": g.module, "category": g.category, "line": g.lane, "start_s": g.start_s,
             "duration_s": g.duration_s, "step": r.timeline_step} for g in r.timeline]
    if rows:
        out += _timeline_svg(rows)
    else:
        out.append('<p class="muted">No timeline: the traces mark no steps '
                   "(<code>jax.profiler.StepTraceAnnotation</code>).</p>")
    return out + ["</section>"]


@renders(("tpudiag.report", "tpudiag.compile", "tpudiag.distributed"), "html")
def render_html(result, timeline_rows: list[dict] | None = None, top_ops: int = 15, top_compiles: int = 10) -> str:
    """One self-contained HTML page for a `ProfileReport` or a `CompileReport` (their rankings,
    shares and roofline figures are the models' own).

    `timeline_rows` (profiles only): the op instances of one step, each a dict
    `{"op", "module", "category", "line", "start_s", "duration_s"}` and optionally `"step"` (the
    step number, shown in the caption). `start_s` is from any common origin (the trace window's
    start, as in the timeline frame); the picture starts at the earliest row. `line` is the trace
    line (thread or stream), one lane each. Without them the timeline section says why it is empty.
    `top_ops`, `top_compiles`: rows of the profile's op and compilation tables (`tpudiag.config`'s).
    """
    if result.schema.startswith("tpudiag.distributed/"):
        title = f"tpudiag distributed: {result.program or 'traces'}"
        head = [f"<h1>{_h(title)}</h1>",
                f'<p class="meta">{_h(result.num_processes)} processes, {_h(result.devices)} devices, '
                f'{_h(result.backend)}; status <span class="{"ok" if result.status == "ok" else "bad"}">'
                f"{_h(result.status)}</span>{_h(' (' + result.reason + ')' if result.reason else '')}</p>",
                f'<p class="meta">timelines: {_h(result.alignment)}: {_h(result.alignment_note)}</p>']
        if result.warnings:
            head.append('<ul class="warn">' + "".join(f"<li>{_h(w)}</li>" for w in result.warnings) + "</ul>")
        sections = _distributed_sections(result)
    elif result.schema.startswith("tpudiag.compile/"):
        title = f"tpudiag compile: {result.source.get('input', '?')}"
        head = _compile_header(result)
        sections = (_compile_breakdown(result) + _compile_top_ops(result) + _compile_timeline()
                    + _compile_roofline(result)
                    + _fusions([m.fusions for m in result.ranked_modules[:_TOP_MODULES] if m.fusions]))
    else:
        title = f"tpudiag profile: {_profile_title(result)}"
        head = _profile_header(result)
        sections = (_profile_breakdown(result, top_compiles) + _profile_top_ops(result, top_ops)
                    + _timeline(result, timeline_rows) + _profile_roofline(result) + _fusions(result.fusions))
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{_h(title)}</title>", f"<style>{CSS}</style></head><body>", '<header id="header">']
    out += head + ["</header>"]
    out += sections + ([] if result.schema.startswith("tpudiag.distributed/") else _suggestions(result))
    out.append(f'<footer><p class="muted">{_h(result.schema)} &middot; rendered by tpudiag; the page has no script '
               "and fetches nothing.</p></footer>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
