"""Renders the `tpudiag kernels` documents: the kernel list, one kernel's card, a verify result
(tpudiag.kernels-verify/1) and a bench result (tpudiag.kernels-bench/1), for the terminal (rich),
as GitHub Markdown, and a verify result as JUnit XML. They format what the documents hold.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpudiag.report.markdown import _esc
from tpudiag.report.units import fmt_cycles, fmt_ghz

LIST_SCHEMA = "tpudiag.kernels/1"


def _ratio(r, goal=None) -> str:
    if r is None:
        return "-"
    mark = "" if goal is None else (" ok" if r <= goal else " MISS")
    return f"{r:.2f}x{mark}"


def render_list(doc: dict, console: Console) -> None:
    table = Table(title="bundled Pallas TPU kernels", title_justify="left", show_edge=False)
    for col in ("name", "what", "backward", "tuned for"):
        table.add_column(col, overflow="fold")
    for k in doc["kernels"]:
        table.add_row(Text(k["name"]), Text(k["title"]), "yes" if k["differentiable"] else "no", Text(k["tuned_for"]))
    console.print(table)
    console.print("tpudiag kernels show NAME | verify [NAME] | bench [NAME] --target v5e")


def render_show(k: dict, console: Console) -> None:
    console.print(Text(f"{k['name']}: {k['title']}", style="bold"))
    for label, key in (("replaces", "replaces"), ("signature", "signature"), ("tuned for", "tuned_for")):
        console.print(Text(f"{label}: ", style="bold") + Text(k[key]))
    console.print(Text("backward: ", style="bold") + Text("custom_vjp with Pallas kernels" if k["differentiable"]
                                                          else "forward only"))
    console.print(Text("tolerances:", style="bold"))
    for dtype, t in k["tolerances"].items():
        console.print(Text(f"  {dtype}: atol {t['atol']:g}, rtol {t['rtol']:g} ({t['reason']})"))
    console.print(Text("usage:", style="bold"))
    console.print(Text(k["usage"].rstrip()))


def render_verify(doc: dict, console: Console) -> None:
    table = Table(show_edge=False)
    for col in ("kernel", "case", "dtype", "result", "worst err/tol", "s"):
        table.add_column(col, overflow="fold", justify="right" if col in ("worst err/tol", "s") else "left")
    for c in doc["cases"]:
        worst = max((k["worst_ratio"] for k in c["checks"]), default=None)
        table.add_row(Text(c["kernel"]), Text(c["case"]), c["dtype"],
                      Text("ok", style="green") if c["ok"] else Text("FAIL", style="bold red"),
                      "-" if worst is None else f"{worst:.3g}", f"{c['seconds']:.1f}")
    console.print(table)
    for c in doc["cases"]:
        if not c["ok"]:
            why = c["error"] or "; ".join(f"{k['what']}: {k['detail']}" for k in c["checks"] if not k["ok"])
            console.print(Text(f"FAIL {c['kernel']} [{c['case']}] ({c['shapes']}): {why}", style="red"))
    verdict = "all passed" if doc["ok"] else f"{doc['failed']} failed"
    console.print(Text(f"{doc['passed']}/{doc['passed'] + doc['failed']} cases, {verdict} "
                       f"(seed {doc['seed']}; rerun with --seed {doc['seed']})",
                       style="green" if doc["ok"] else "bold red"))


def render_junit(doc: dict) -> str:
    """JUnit XML: one testsuite per kernel, one testcase per case."""
    suites: dict[str, list[dict]] = {}
    for c in doc["cases"]:
        suites.setdefault(c["kernel"], []).append(c)
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuites name="tpudiag kernels verify" tests="{len(doc["cases"])}" failures="{doc["failed"]}">']
    for name, cases in suites.items():
        fails = sum(not c["ok"] for c in cases)
        out.append(f'  <testsuite name={quoteattr(name)} tests="{len(cases)}" failures="{fails}" '
                   f'time="{sum(c["seconds"] for c in cases):.3f}">')
        for c in cases:
            out.append(f'    <testcase classname={quoteattr("tpudiag.kernels." + name)} '
                       f'name={quoteattr(c["case"] + " " + c["dtype"])} time="{c["seconds"]:.3f}">')
            if not c["ok"]:
                why = c["error"] or "; ".join(f"{k['what']}: {k['detail']}" for k in c["checks"] if not k["ok"])
                out.append(f'      <failure message={quoteattr(why[:300])}>{escape(why)} '
                           f'(shapes {escape(c["shapes"])}, seed {doc["seed"]})</failure>')
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def _bench_rows(doc: dict):
    for r in doc["kernels"]:
        v = r["variants"]
        floors = ", ".join(f"{name} {f['ops_floor_only']}/{f['ops']} ops at floor"
                           for name, f in v.items() if f["status"] == "ok" and f["ops_floor_only"])
        errors = "; ".join(f"{name}: {f['error']}" for name, f in v.items() if f["status"] != "ok")
        yield r, floors, errors


def render_bench(doc: dict, console: Console) -> None:
    t = doc["target"]
    console.print(Text(f"kernels bench on {t['chip']} ({t['topology']}): corrected estimated cycles per call "
                       f"(largest of static estimate, HBM floor, compute floor; clock {fmt_ghz(t['clock_hz'])})"))
    table = Table(show_edge=False)
    for col in ("kernel", "shape", "ours", "XLA", "vs XLA", "JAX kernel", "vs JAX"):
        table.add_column(col, overflow="fold", justify="left" if col in ("kernel", "shape") else "right")
    for r, _, _ in _bench_rows(doc):
        table.add_row(Text(r["name"]), Text(r["shape"]), fmt_cycles(r["kernel_cycles"]), fmt_cycles(r["xla_cycles"]),
                      _ratio(r["ratio_vs_xla"], r["goal_vs_xla"]), fmt_cycles(r.get("jax_cycles")),
                      _ratio(r.get("ratio_vs_jax"), r.get("goal_vs_jax")))
    console.print(table)
    for r, floors, errors in _bench_rows(doc):
        if floors:
            console.print(Text(f"{r['name']}: {floors} (no static estimate: counted at the roofline floor)",
                               style="yellow"))
        if errors:
            console.print(Text(f"{r['name']}: {errors}", style="red"))
    goals = f"goals: <= {doc['kernels'][0]['goal_vs_xla']:.2f}x XLA, <= 1.00x JAX's kernel" if doc["kernels"] else ""
    missed = f"; missed by {', '.join(doc['goals_missed'])}" if doc["goals_missed"] else ""
    console.print(Text(goals + missed))
    console.print(Text(f"run directory: {doc['artifacts']['run_dir']}"))


def render_bench_markdown(doc: dict) -> str:
    t = doc["target"]
    lines = [f"### tpudiag kernels bench: {t['chip']} ({t['topology']})", "",
             "Corrected estimated cycles per call: per op, the largest of the TPU compiler's static estimate, "
             "the HBM floor and the compute floor, summed. Estimates, not TPU measurements.", "",
             "| kernel | shape | blocks | ours | XLA | vs XLA | JAX kernel | vs JAX |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r, _, _ in _bench_rows(doc):
        lines.append(f"| {_esc(r['name'])} | {_esc(r['shape'])} | {_esc(r['blocks'] or '-')} | "
                     f"{fmt_cycles(r['kernel_cycles'])} | {fmt_cycles(r['xla_cycles'])} | "
                     f"{_ratio(r['ratio_vs_xla'], r['goal_vs_xla'])} | {fmt_cycles(r.get('jax_cycles'))} | "
                     f"{_ratio(r.get('ratio_vs_jax'), r.get('goal_vs_jax'))} |")
    notes = [(r["name"], floors, errors) for r, floors, errors in _bench_rows(doc) if floors or errors]
    if notes:
        lines.append("")
        lines += [f"- {_esc(n)}: {_esc('; '.join(x for x in (f, e) if x))}" for n, f, e in notes]
        lines.append("")
        lines.append("An op at floor had no static estimate (the profile aborted, timed out or gave 0) and counts "
                     "at the larger of its HBM and compute floors.")
    return "\n".join(lines) + "\n"
