"""`suggest --measure`: a suggestion report with each measured suggestion's chip times beside its
estimate. Reads the worker's per-call device times (api/suggest_chip.py), already reduced to each
candidate's fastest call; returns a new `SuggestReport` with `measured` set on those rows (the
estimate, the ranking and `shown` unchanged). No I/O: timing on the chip is api/'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpudiag.results.suggest import ChipMeasure, SuggestReport


@dataclass(frozen=True)
class ChipTimes:
    """One candidate's kernel and XLA twin at its matched shapes on the chip: one call of one instance."""

    kernel_us: float | None  # None: the kernel failed (error)
    xla_us: float | None  # the twin; None where it failed
    shape: str  # the shapes as the kernel sees them
    error: str | None = None


def with_chip_times(report: SuggestReport, cands: list, times: dict[int, ChipTimes], device: str,
                    calls: int) -> SuggestReport:
    """`report` with `measured` on each row whose candidate (index into `cands`, build.Candidate) has
    `times`. As the estimate, a time counts every run (loop trip counts) and every instance (layers)
    of the pattern in one execution of its module. XLA's side is the run's own ops as its trace
    measured them where the run is a TPU run (they ran in the program's own fusions), else the twin
    timed here."""
    by_row = {(c.module, c.match.pattern, c.ops): i for i, c in enumerate(cands)}
    rows = []
    for r in report.suggestions:
        i = by_row.get((r.module, r.pattern, r.ops))
        t = times.get(i) if i is not None else None
        if t is None:
            rows.append(r)
            continue
        each = cands[i].runs * cands[i].instances
        kernel_s = None if t.kernel_us is None else round(t.kernel_us * 1e-6 * each, 12)
        twin_s = None if t.xla_us is None else round(t.xla_us * 1e-6 * each, 12)
        xla_s, basis = (r.xla_s, "measured_run") if r.xla_measured else (twin_s, "measured_on_chip")
        both = kernel_s is not None and xla_s is not None
        rows.append(replace(r, measured=ChipMeasure(
            device=device, calls=calls, kernel_basis="measured_on_chip", xla_basis=basis, kernel_s=kernel_s,
            xla_s=xla_s, xla_twin_s=twin_s, speedup=round(xla_s / kernel_s, 3) if both and kernel_s else None,
            saved_s=round(xla_s - kernel_s, 12) if both else None, shape=t.shape, error=t.error)))
    measured = [r for r in rows if r.measured is not None]
    note = (f"measured on the attached {device} (suggest --measure): each kernel and its plain-JAX twin at the "
            f"program's matched shapes, the fastest of {calls} calls by device time, argument sets rotated beyond "
            "VMEM; XLA's side is " + ("the run's own ops as its trace measured them"
                                      if any(r.measured.xla_basis == "measured_run" for r in measured)
                                      else "the twin timed here"))
    return replace(report, suggestions=tuple(rows), notes=report.notes + ((note,) if measured else ()))
