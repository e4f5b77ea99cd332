"""Renders the `tpudiag kernels` results: the kernel list and one kernel's card (documents), a
`VerifyResult` (tpudiag.kernels-verify/1) and a `KernelBench` (tpudiag.kernels-bench/1), for the
terminal (rich), as GitHub Markdown, and a verify result as JUnit XML. They format what the models
hold; the figures (worst ratios, failure counts) are the models' own.
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


def render_verify(result, console: Console) -> None:
    """A `VerifyResult` (tpudiag.kernels-verify/1)."""
    table = Table(show_edge=False)
    for col in ("kernel", "case", "dtype", "result", "worst err/tol", "s"):
        table.add_column(col, overflow="fold", justify="right" if col in ("worst err/tol", "s") else "left")
    for c in result.cases:
        worst = c.worst_ratio
        table.add_row(Text(c.kernel), Text(c.label), c.dtype,
                      Text("ok", style="green") if c.ok else Text("FAIL", style="bold red"),
                      "-" if worst is None else f"{worst:.3g}", f"{round(c.seconds, 3):.1f}")
    console.print(table)
    for c in result.failures:
        console.print(Text(f"FAIL {c.kernel} [{c.label}] ({c.shapes}): {c.why}", style="red"))
    failed = len(result.failures)
    verdict = "all passed" if result.ok else f"{failed} failed"
    console.print(Text(f"{result.passed}/{result.passed + failed} cases, {verdict} "
                       f"(seed {result.seed}; rerun with --seed {result.seed})",
                       style="green" if result.ok else "bold red"))


def render_junit(result) -> str:
    """A `VerifyResult` as JUnit XML: one testsuite per kernel, one testcase per case."""
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuites name="tpudiag kernels verify" tests="{len(result.cases)}" failures="{len(result.failures)}">']
    for name, cases in result.by_kernel().items():
        fails = sum(not c.ok for c in cases)
        out.append(f'  <testsuite name={quoteattr(name)} tests="{len(cases)}" failures="{fails}" '
                   f'time="{sum(round(c.seconds, 3) for c in cases):.3f}">')
        for c in cases:
            out.append(f'    <testcase classname={quoteattr("tpudiag.kernels." + name)} '
                       f'name={quoteattr(c.label + " " + c.dtype)} time="{round(c.seconds, 3):.3f}">')
            if not c.ok:
                out.append(f'      <failure message={quoteattr(c.why[:300])}>{escape(c.why)} '
                           f'(shapes {escape(c.shapes)}, seed {result.seed})</failure>')
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def _bench_rows(bench):
    for r in bench.kernels:
        v = r.variants
        floors = ", ".join(f"{name} {f.ops_floor_only}/{f.ops} ops at floor"
                           for name, f in v.items() if f.status == "ok" and f.ops_floor_only)
        errors = "; ".join(f"{name}: {f.error}" for name, f in v.items() if f.status != "ok")
        yield r, floors, errors


def render_bench(bench, console: Console) -> None:
    """A `KernelBench` (tpudiag.kernels-bench/1)."""
    t = bench.target
    console.print(Text(f"kernels bench on {t['chip']} ({t['topology']}): corrected estimated cycles per call "
                       f"(largest of static estimate, HBM floor, compute floor; clock {fmt_ghz(t['clock_hz'])})"))
    table = Table(show_edge=False)
    for col in ("kernel", "shape", "ours", "XLA", "vs XLA", "JAX kernel", "vs JAX"):
        table.add_column(col, overflow="fold", justify="left" if col in ("kernel", "shape") else "right")
    for r, _, _ in _bench_rows(bench):
        table.add_row(Text(r.name), Text(r.shape), fmt_cycles(r.kernel_cycles), fmt_cycles(r.xla_cycles),
                      _ratio(r.ratio_vs_xla, r.goal_vs_xla), fmt_cycles(r.jax_cycles),
                      _ratio(r.ratio_vs_jax, r.goal_vs_jax))
    console.print(table)
    for r, floors, errors in _bench_rows(bench):
        if floors:
            console.print(Text(f"{r.name}: {floors} (no static estimate: counted at the roofline floor)",
                               style="yellow"))
        if errors:
            console.print(Text(f"{r.name}: {errors}", style="red"))
    goals = f"goals: <= {bench.kernels[0].goal_vs_xla:.2f}x XLA, <= 1.00x JAX's kernel" if bench.kernels else ""
    missed = f"; missed by {', '.join(bench.goals_missed)}" if bench.goals_missed else ""
    console.print(Text(goals + missed))
    console.print(Text(f"run directory: {(bench.artifacts or {}).get('run_dir', '')}"))


def render_bench_markdown(bench) -> str:
    """A `KernelBench` (tpudiag.kernels-bench/1) as Markdown."""
    t = bench.target
    lines = [f"### tpudiag kernels bench: {t['chip']} ({t['topology']})", "",
             "Corrected estimated cycles per call: per op, the largest of the TPU compiler's static estimate, "
             "the HBM floor and the compute floor, summed. Estimates, not TPU measurements.", "",
             "| kernel | shape | blocks | ours | XLA | vs XLA | JAX kernel | vs JAX |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r, _, _ in _bench_rows(bench):
        lines.append(f"| {_esc(r.name)} | {_esc(r.shape)} | {_esc(r.blocks or '-')} | "
                     f"{fmt_cycles(r.kernel_cycles)} | {fmt_cycles(r.xla_cycles)} | "
                     f"{_ratio(r.ratio_vs_xla, r.goal_vs_xla)} | {fmt_cycles(r.jax_cycles)} | "
                     f"{_ratio(r.ratio_vs_jax, r.goal_vs_jax)} |")
    notes = [(r.name, floors, errors) for r, floors, errors in _bench_rows(bench) if floors or errors]
    if notes:
        lines.append("")
        lines += [f"- {_esc(n)}: {_esc('; '.join(x for x in (f, e) if x))}" for n, f, e in notes]
        lines.append("")
        lines.append("An op at floor had no static estimate (the profile aborted, timed out or gave 0) and counts "
                     "at the larger of its HBM and compute floors.")
    return "\n".join(lines) + "\n"
