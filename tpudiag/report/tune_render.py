"""Renders a `KernelTune` (tpudiag.kernels-tune/1) for the terminal (rich) and as GitHub Markdown:
the points fastest first (each choice, its corrected cycles and how far behind the best it is),
then the ones that did not compile with why, the winner and where the run is. Choices and error
texts reach rich as `plain` text and Markdown through `markdown._esc`. It computes nothing: ranks
and the winner are the model's."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders
from tpudiag.report.rich_text import plain
from tpudiag.report.units import fmt_cycles, fmt_ghz, printable

_STATUS = {"ok": "ok", "error": "refused", "out_of_vmem": "out of VMEM", "failed": "failed",
           "mismatch": "does not match the reference"}


def _behind(p, best) -> str:
    if p.corrected_cycles is None or not best:
        return "-"
    return f"{p.corrected_cycles / best:.2f}x"


def _note(p) -> str:
    if p.status != "ok":
        return f"{_STATUS[p.status]}: {p.error or ''}"
    notes = []
    if p.ops_floor_only:
        notes.append(f"{p.ops_floor_only}/{p.ops} ops at floor")
    if p.cached:
        notes.append("cached")
    if p.verified == "pass":
        notes.append("matches the reference")
    return ", ".join(notes)


def _best_cycles(tune) -> int | None:
    return next((p.corrected_cycles for p in tune.ranked if p.rank == 1), None)


def _winner(tune) -> str:
    if tune.best is None:
        return "no point compiled and matched the reference" if tune.reference else "no point compiled"
    return "best: " + " ".join(f"{k}={v}" for k, v in tune.best.items())


def _own(tune) -> str | None:
    """Where a bundled kernel's own blocks rank (None for FILE.py:FUNC)."""
    if tune.default is None:
        return None
    text = " ".join(f"{k}={v}" for k, v in tune.default.items())
    p = next((p for p in tune.points if p.choice == tune.default), None)
    if p is None:
        return f"the kernel's own blocks ({text}) are not a point of this space"
    if p.rank is None:
        return f"the kernel's own blocks ({text}): {_STATUS[p.status]}"
    best = _best_cycles(tune)
    if p.rank > 1 and p.corrected_cycles == best:
        return f"the kernel's own blocks ({text}): tie the best at {fmt_cycles(best)} (rank {p.rank} by the space's order)"
    return f"the kernel's own blocks ({text}): rank {p.rank}, {_behind(p, best)} the best"


def _chip_cols(tune) -> tuple[str, ...]:
    return ("chip rank", "chip µs min / median") if tune.timing == "chip" else ()


def _chip_cells(tune, p) -> list[str]:
    if tune.timing != "chip":
        return []
    if p.chip_min_us is None:
        return ["-", "failed" if p.chip_error else "-"]
    return [str(p.chip_rank), f"{p.chip_min_us:,.1f} / {p.chip_median_us:,.1f}"]


def _chip_verdict(tune) -> str | None:
    """On the chip: its winner, and whether the static winner is the same point."""
    if tune.timing != "chip":
        return None
    if tune.chip_best is None:
        return f"on the chip ({tune.device}): no point ran"
    won = ", ".join(f"{k}={v}" for k, v in tune.chip_best.items())
    agree = ("the static winner is the chip's winner" if tune.static_best_is_chip_best
             else "the static winner is not the chip's winner" if tune.static_best_is_chip_best is False else "")
    return f"on the chip ({tune.device}, device time per call): best {won}" + (f"; {agree}" if agree else "")


@renders("tpudiag.kernels-tune", "terminal")
def render_tune(tune, console: Console) -> None:
    t = tune.target
    n_ok = sum(p.rank is not None for p in tune.points)
    console.print(plain(f"kernels tune {tune.program} on {t['chip']} ({t['topology']}): {len(tune.points)} points, "
                        f"{n_ok} ranked, on {tune.runner}; corrected estimated cycles per call (largest of static "
                        f"estimate, HBM floor, compute floor; clock {fmt_ghz(t['clock_hz'])})"))
    console.print(plain(f"inputs: {tune.inputs}"))
    if tune.reference:
        console.print(plain(f"each compiled point checked against {tune.reference} (validate's rule, this CPU)"))
    best = _best_cycles(tune)
    table = Table(show_edge=False)
    names = list(tune.space)
    for col in ("rank", *names, "cycles", "vs best", *_chip_cols(tune), "note"):
        table.add_column(col, overflow="fold", justify="left" if col == "note" else "right")
    for p in tune.ranked:
        table.add_row(str(p.rank) if p.rank else "-", *(plain(str(p.choice.get(n))) for n in names),
                      fmt_cycles(p.corrected_cycles), _behind(p, best), *_chip_cells(tune, p), plain(_note(p)))
    console.print(table)
    console.print(plain(_winner(tune)))
    if verdict := _chip_verdict(tune):
        console.print(plain(verdict))
    if _own(tune):
        console.print(plain(_own(tune)))
    console.print(plain(f"run directory: {(tune.artifacts or {}).get('run_dir', '')}"))


@renders("tpudiag.kernels-tune", "md")
def render_tune_markdown(tune) -> str:
    t = tune.target
    names = list(tune.space)
    best = _best_cycles(tune)
    lines = [f"### tpudiag kernels tune: {_esc(tune.program)} on {_esc(t['chip'])} ({_esc(t['topology'])})", "",
             f"Inputs `{_esc(tune.inputs)}`; {len(tune.points)} points on {_esc(tune.runner)}"
             + (f", each checked against `{_esc(tune.reference)}`" if tune.reference else "") + ". Corrected estimated "
             "cycles per call: per op, the largest of the TPU compiler's static estimate, the HBM floor and the "
             "compute floor, summed. Estimates, not TPU measurements.", "",
             "| rank | " + " | ".join(_esc(n) for n in (*names, "cycles", "vs best", *_chip_cols(tune), "note")) + " |",
             "|---:|" + "---:|" * (len(names) + 2 + len(_chip_cols(tune))) + "---|"]
    for p in tune.ranked:
        lines.append(f"| {p.rank or '-'} | " + " | ".join(_esc(str(p.choice.get(n))) for n in names)
                     + f" | {fmt_cycles(p.corrected_cycles)} | {_behind(p, best)} | "
                     + "".join(f"{c} | " for c in _chip_cells(tune, p)) + f"{_esc(_note(p))} |")
    lines += ["", f"**{_esc(_winner(tune))}**"]
    if verdict := _chip_verdict(tune):
        lines += ["", f"**{_esc(verdict)}**"]
    if _own(tune):
        lines += ["", _esc(_own(tune))]
    return printable("\n".join(lines) + "\n", newlines=True)
