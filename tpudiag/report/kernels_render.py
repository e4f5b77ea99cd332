"""Renders the `tpudiag kernels` results: the kernel list and one kernel's card (documents), a
`VerifyResult` (tpudiag.kernels-verify/1) and a `KernelBench` (tpudiag.kernels-bench/1), for the
terminal (rich), as GitHub Markdown, and a verify result as JUnit XML. They format what the models
hold; the figures (worst ratios, failure counts) are the models' own. Names, shapes and error texts
reach rich as `plain` text, Markdown through `markdown._esc`, JUnit XML `printable` and escaped.
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape, quoteattr

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import fmt_cycles, fmt_ghz, printable
from tpudiag.results.kernels import uncounted_variants

LIST_SCHEMA = "tpudiag.kernels/1"


def _ratio(r, goal=None) -> str:
    if r is None:
        return "-"
    mark = "" if goal is None else (" ok" if r <= goal else " MISS")
    return f"{r:.2f}x{mark}"


def _vs_xla(r) -> str:
    """The kernel against XLA, marked by the row's own verdict: "ok (floor)" where the ratio misses
    the goal but the kernel sits within goal_vs_floor of the floor."""
    if r.ratio_vs_xla is None:
        return "-"
    if r.meets_xla_goal and r.ratio_vs_xla > r.goal_vs_xla:
        return f"{r.ratio_vs_xla:.2f}x ok (floor)"
    return _ratio(r.ratio_vs_xla, r.goal_vs_xla)


def _floor(r) -> str:
    if r.floor_cycles is None:
        return "-"
    parts = [f"{who} {x:.2f}x" for who, x in (("ours", r.kernel_vs_floor), ("XLA", r.xla_vs_floor)) if x is not None]
    return fmt_cycles(r.floor_cycles) + (f" ({', '.join(parts)})" if parts else "")


def render_list(doc: dict, console: Console) -> None:
    table = Table(title="bundled Pallas TPU kernels", title_justify="left", show_edge=False)
    for col in ("name", "what", "backward", "tuned for"):
        table.add_column(col, overflow="fold")
    for k in doc["kernels"]:
        table.add_row(plain(k["name"]), plain(k["title"]), "yes" if k["differentiable"] else "no", plain(k["tuned_for"]))
    console.print(table)
    console.print(Text("tpudiag kernels show NAME | verify [NAME] | bench [NAME] --target v5e"))


def render_show(k: dict, console: Console) -> None:
    console.print(plain(f"{k['name']}: {k['title']}", style="bold"))
    for label, key in (("replaces", "replaces"), ("signature", "signature"), ("tuned for", "tuned_for")):
        console.print(Text(f"{label}: ", style="bold") + plain(k[key]))
    console.print(Text("backward: ", style="bold") + Text("custom_vjp with Pallas kernels" if k["differentiable"]
                                                          else "forward only"))
    if chip := k.get("on_chip"):
        m, ours = chip["measured"], chip["kernel"]
        peers = ", ".join(f"{who} {chip[v]['min_us']:,.1f}" for v, who in (("xla", "XLA"), ("jax", "JAX's kernel"))
                          if v in chip)
        floor = (f", {share_of_floor(100 * chip['floor_us'] / ours['min_us'])} of its {chip['floor_us']:,.1f} µs roofline floor"
                 if chip.get("floor_us") else "")
        console.print(Text("on the chip: ", style="bold") + plain(
            f"{ours['min_us']:,.1f} µs a call at the bench shape{floor} (device time, fastest of {ours['calls']}; "
            f"{peers}) on a {m['device']}, jax {m['jax']}, {m['date']}: `{m['command']}`"))
    console.print(Text("tolerances:", style="bold"))
    for dtype, t in k["tolerances"].items():
        console.print(plain(f"  {dtype}: atol {t['atol']:g}, rtol {t['rtol']:g} ({t['reason']})"))
    console.print(Text("usage:", style="bold"))
    console.print(plain(k["usage"].rstrip(), newlines=True))


@renders("tpudiag.kernels", "terminal")
def render_kernels(doc: dict, console: Console) -> None:
    """A tpudiag.kernels/1 document: the kernel list, or one kernel's card."""
    (render_list if "kernels" in doc else render_show)(doc, console)


@renders("tpudiag.kernels-verify", "terminal")
def render_verify(result, console: Console) -> None:
    """A `VerifyResult` (tpudiag.kernels-verify/1)."""
    table = Table(show_edge=False)
    for col in ("kernel", "case", "dtype", "result", "worst err/tol", "s"):
        table.add_column(col, overflow="fold", justify="right" if col in ("worst err/tol", "s") else "left")
    for c in result.cases:
        worst = c.worst_ratio
        table.add_row(plain(c.kernel), plain(c.label), plain(c.dtype),
                      Text("ok", style="green") if c.ok else Text("FAIL", style="bold red"),
                      "-" if worst is None else f"{worst:.3g}", f"{round(c.seconds, 3):.1f}")
    console.print(table)
    for c in result.failures:
        console.print(plain(f"FAIL {c.kernel} [{c.label}] ({c.shapes}): {c.why}", style="red", newlines=True))
    failed = len(result.failures)
    verdict = "all passed" if result.ok else f"{failed} failed"
    where = (f"compiled for and run on {result.device}" if result.mode == "chip"
             else "Pallas interpret mode on the CPU")
    console.print(Text(f"{result.passed}/{result.passed + failed} cases, {verdict} "
                       f"(seed {result.seed}; rerun with --seed {result.seed}; {where})",
                       style="green" if result.ok else "bold red"))


@renders("tpudiag.kernels-verify", "junit")
def render_junit(result) -> str:
    """A `VerifyResult` as JUnit XML: one testsuite per kernel, one testcase per case."""
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuites name="tpudiag kernels verify" tests="{len(result.cases)}" failures="{len(result.failures)}">']
    for name, cases in result.by_kernel().items():
        # XML 1.0 cannot hold most control characters, even escaped: they are written as `\x..` text.
        name = printable(name)
        fails = sum(not c.ok for c in cases)
        out.append(f'  <testsuite name={quoteattr(name)} tests="{len(cases)}" failures="{fails}" '
                   f'time="{sum(round(c.seconds, 3) for c in cases):.3f}">')
        for c in cases:
            out.append(f'    <testcase classname={quoteattr("tpudiag.kernels." + name)} '
                       f'name={quoteattr(printable(c.label + " " + c.dtype))} time="{round(c.seconds, 3):.3f}">')
            if not c.ok:
                out.append(f'      <failure message={quoteattr(printable(c.why[:300]))}>'
                           f'{escape(printable(c.why, newlines=True))} '
                           f'(shapes {escape(printable(c.shapes))}, seed {result.seed})</failure>')
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def _bench_rows(bench):
    for r in bench.kernels:
        v = r.variants
        floors = ", ".join(f"{name} {f.ops_floor_only}/{f.ops} ops at floor"
                           for name, f in v.items() if f.status == "ok" and f.ops_floor_only)
        uncounted = uncounted_variants(v)
        bytes_only = "" if not uncounted else (
            f"{', '.join(uncounted)} counts no FLOPs (a Pallas call without a cost estimate): its figure has no "
            "compute floor, and it is left out of the row's floor")
        errors = "; ".join(f"{name}: {f.error}" for name, f in v.items() if f.status != "ok")
        yield r, floors, bytes_only, errors


def _us(t) -> str:
    return "-" if t is None or t.min_us is None else f"{t.min_us:,.1f}"


def share_of_floor(pct: float) -> str:
    """A percentage of the roofline floor, cut, never rounded up: 79.9% reads 79%, not the 80% goal."""
    return f"{math.floor(pct)}%"


def _chip_cells(r) -> list[str]:
    """ours (min / median), XLA, JAX's, vs XLA, vs JAX's, floor, % of floor, static / chip."""
    c = r.chip or {}
    ours = c.get("kernel")
    mine = "-" if ours is None or ours.min_us is None else f"{ours.min_us:,.1f} / {ours.median_us:,.1f}"
    pct = "-" if r.pct_of_floor is None else f"{share_of_floor(r.pct_of_floor)}{'' if r.meets_floor_goal else ' MISS'}"
    vs_jax = "-" if r.chip_ratio_vs_jax is None else (
        f"{r.chip_ratio_vs_jax:.2f}x{' ok' if r.meets_jax_goal_on_chip else ' MISS'}")
    return [mine, _us(c.get("xla")), _us(c.get("jax")), _ratio(r.chip_ratio_vs_xla), vs_jax, "-" if r.floor_us is None else f"{r.floor_us:,.1f}", pct,
            "-" if r.static_over_chip is None else f"{r.static_over_chip:.2f}"]


_CHIP_COLS = ("kernel", "ours µs min / median", "XLA µs", "JAX's µs", "vs XLA", "vs JAX's", "floor µs", "% of floor",
              "static ÷ chip")


def _chip_errors(r) -> str:
    return "; ".join(f"{v}: {t.error}" for v, t in (r.chip or {}).items() if t.status != "ok")


def _chip_intro(bench) -> str:
    calls = next((t.calls for r in bench.kernels for t in (r.chip or {}).values()), 0)
    return (f"on the chip ({bench.device}): device time per call from the trace, {calls} calls per variant with "
            "argument buffers rotated beyond VMEM; the floor is the least roofline time (HBM bytes at HBM bandwidth "
            "or FLOPs at the bf16 peak); % of floor = floor / our fastest call")


def render_chip(bench, console: Console) -> None:
    console.print(plain(_chip_intro(bench)))
    table = Table(show_edge=False)
    for col in _CHIP_COLS:
        table.add_column(col, overflow="fold", justify="left" if col == "kernel" else "right")
    for r in bench.kernels:
        table.add_row(plain(r.name), *_chip_cells(r))
    console.print(table)
    for r in bench.kernels:
        if errors := _chip_errors(r):
            console.print(plain(f"{r.name} on the chip: {errors}", style="red", newlines=True))


def _goal_floor(bench) -> str:
    g = next((r.goal_vs_floor for r in bench.kernels if r.goal_vs_floor), None)
    return "-" if g is None else f"{g:.2f}x"


@renders("tpudiag.kernels-bench", "terminal")
def render_bench(bench, console: Console) -> None:
    """A `KernelBench` (tpudiag.kernels-bench/1)."""
    t = bench.target
    if bench.timing == "chip":
        render_chip(bench, console)
    console.print(plain(f"kernels bench on {t['chip']} ({t['topology']}): corrected estimated cycles per call "
                       f"(largest of static estimate, HBM floor, compute floor; clock {fmt_ghz(t['clock_hz'])})"))
    table = Table(show_edge=False)
    for col in ("kernel", "shape", "ours", "XLA", "vs XLA", "JAX kernel", "vs JAX", "floor"):
        table.add_column(col, overflow="fold", justify="left" if col in ("kernel", "shape") else "right")
    for r, *_ in _bench_rows(bench):
        table.add_row(plain(r.name), plain(r.shape), fmt_cycles(r.kernel_cycles), fmt_cycles(r.xla_cycles),
                      _vs_xla(r), fmt_cycles(r.jax_cycles), _ratio(r.ratio_vs_jax, r.goal_vs_jax), _floor(r))
    console.print(table)
    for r, floors, bytes_only, errors in _bench_rows(bench):
        if floors:
            console.print(plain(f"{r.name}: {floors} (no static estimate: counted at the roofline floor)",
                                style="yellow"))
        if bytes_only:
            console.print(plain(f"{r.name}: {bytes_only}", style="yellow"))
        if errors:
            console.print(plain(f"{r.name}: {errors}", style="red", newlines=True))
    goals = (f"goals: <= {bench.kernels[0].goal_vs_xla:.2f}x XLA (or within {_goal_floor(bench)} of the floor), "
             "<= 1.00x JAX's kernel") if bench.kernels else ""
    if bench.timing == "chip":
        goals = "goals on the chip: at least 80% of the floor, no slower than JAX's kernel"
    missed = f"; missed by {', '.join(bench.goals_missed)}" if bench.goals_missed else ""
    console.print(plain(goals + missed))
    console.print(plain(f"run directory: {(bench.artifacts or {}).get('run_dir', '')}"))


@renders("tpudiag.kernels-bench", "md")
def render_bench_markdown(bench) -> str:
    """A `KernelBench` (tpudiag.kernels-bench/1) as Markdown."""
    t = bench.target
    lines = [f"### tpudiag kernels bench: {_esc(t['chip'])} ({_esc(t['topology'])})", "",
             "Corrected estimated cycles per call: per op, the largest of the TPU compiler's static estimate, "
             "the HBM floor and the compute floor, summed. Estimates, not TPU measurements. The floor is the "
             "least roofline time of any variant (HBM bytes at HBM bandwidth or FLOPs at the bf16 peak, per op, "
             f"summed); a kernel within {_goal_floor(bench)} of it meets the XLA goal.", "",
             "| kernel | shape | blocks | ours | XLA | vs XLA | JAX kernel | vs JAX | floor |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    if bench.timing == "chip":
        chip = [f"### On the chip: {_esc(bench.device or '')}", "", _esc(_chip_intro(bench)) + ".", "",
                "| " + " | ".join(_CHIP_COLS) + " |", "|---|" + "---:|" * (len(_CHIP_COLS) - 1)]
        chip += [f"| {_esc(r.name)} | " + " | ".join(_chip_cells(r)) + " |" for r in bench.kernels]
        chip += [f"- {_esc(r.name)} on the chip: {_esc(e)}" for r in bench.kernels if (e := _chip_errors(r))]
        lines = chip + [""] + lines
    for r, *_ in _bench_rows(bench):
        lines.append(f"| {_esc(r.name)} | {_esc(r.shape)} | {_esc(r.blocks or '-')} | "
                     f"{fmt_cycles(r.kernel_cycles)} | {fmt_cycles(r.xla_cycles)} | "
                     f"{_vs_xla(r)} | {fmt_cycles(r.jax_cycles)} | "
                     f"{_ratio(r.ratio_vs_jax, r.goal_vs_jax)} | {_floor(r)} |")
    notes = [(r.name, (floors, bytes_only, errors)) for r, floors, bytes_only, errors in _bench_rows(bench)
             if floors or bytes_only or errors]
    if notes:
        lines.append("")
        lines += [f"- {_esc(n)}: {_esc('; '.join(x for x in parts if x))}" for n, parts in notes]
        lines.append("")
        lines.append("An op at floor had no static estimate (the profile aborted, timed out or gave 0) and counts "
                     "at the larger of its HBM and compute floors.")
    return printable("\n".join(lines) + "\n", newlines=True)
