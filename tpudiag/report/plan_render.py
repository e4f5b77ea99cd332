"""Renders a `Plan` (tpudiag.plan/1) for the terminal (rich) and as GitHub Markdown: candidates that
fit, most tokens/s per device first (mesh, choice, tokens/s, MFU, step, peak HBM, exposed
collectives, exposed host transfers, the top op), then those that do not fit with the compiler's
figures, then the failed, and the estimate command of the winner. It computes nothing: ranks and the
winner are the model's."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import printable


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"


def _ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.3g} ms"


def _cells(c) -> list[str]:
    mesh = ",".join(f"{a}={n}" for a, n in c.mesh.items())
    choice = " ".join(f"{k}={v}" for k, v in c.choice.items()) or "-"
    if c.status == "ok":
        return [str(c.rank), mesh, choice, f"{c.tokens_per_s_per_device:,.0f}",
                "-" if c.mfu is None else f"{c.mfu:.1%}", f"{c.step_s:.3g} s", _gib(c.peak_hbm_bytes),
                _ms(c.exposed_collective_s), _ms(c.exposed_host_s), c.top_op or "-"]
    what = "does not fit" if c.status == "does_not_fit" else "failed"
    hbm = f"{_gib(c.peak_hbm_bytes)} of {_gib(c.hbm_capacity_bytes)}" if c.status == "does_not_fit" else "-"
    return ["-", mesh, choice, "-", "-", "-", hbm, "-", "-", f"{what}: {c.reason or ''}"]


_COLUMNS = ("rank", "mesh", "choice", "tokens/s/device", "MFU", "step", "peak HBM", "exposed coll.", "exposed host",
            "top op / why")


def _summary(plan) -> str:
    n_fit = sum(c.status == "ok" for c in plan.candidates)
    t = plan.target
    return (f"plan {plan.program} on {t['topology']} ({t['devices']} devices): {len(plan.candidates)} candidates, "
            f"{n_fit} fit; estimated without matmul probes (matmuls at the compiler's cost model), on {plan.runner}")


@renders("tpudiag.plan", "terminal")
def render_plan(plan, console: Console) -> None:
    console.print(plain(_summary(plan)))
    table = Table(show_edge=False)
    for col in _COLUMNS:
        table.add_column(col, overflow="fold", justify="right" if col in ("rank", "tokens/s/device", "MFU") else "left")
    for c in plan.ranked:
        table.add_row(*(plain(x) for x in _cells(c)))
    console.print(table)
    console.print(plain(f"best: {plan.reproduce}" if plan.reproduce else "no candidate fits"))
    if plan.measured_text:
        console.print(plain(plan.measured_text))
    console.print(plain(f"run directory: {(plan.artifacts or {}).get('run_dir', '')}"))


@renders("tpudiag.plan", "md")
def render_plan_markdown(plan) -> str:
    lines = [f"### tpudiag plan: {_esc(plan.program)} on {_esc(plan.target['topology'])}", "", _esc(_summary(plan)), "",
             "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for c in plan.ranked:
        lines.append("| " + " | ".join(_esc(x) for x in _cells(c)) + " |")
    lines += ["", f"Best: `{_esc(plan.reproduce)}`" if plan.reproduce else "No candidate fits."]
    if plan.measured_text:
        lines += ["", _esc(plan.measured_text)]
    return printable("\n".join(lines) + "\n", newlines=True)
