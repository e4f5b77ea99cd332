"""What `tpudiag estimate`'s passes over the step share: the pass itself, the step's report with its
ops replaced, and an op re-timed by the compiler's cycles.

A pass takes the compile report and the step's parsed HLO and returns (the report, its finding or
None); `run_passes` runs an ordered list of them. The list is `api/estimate.py`'s (`step_passes`):
the pure passes are here in `analyze/compile/` (`estimate_passes`, `kernel_passes`, `calibrated`),
the probes that compile a module are `api/estimate_probes.py`'s. The step is the report's first
module.

Pure: takes and returns models; no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

# (report, hlo) -> (report, finding or None)
Pass = Callable[[Any, Any], tuple[Any, Any]]


def run_passes(report, hlo, passes: list[Pass]) -> tuple[Any, list]:
    """(the report after each pass in order, each pass's finding in the same order)."""
    findings = []
    for step_pass in passes:
        report, finding = step_pass(report, hlo)
        findings.append(finding)
    return report, findings


def with_step(report, m):
    """`report` with its first module (the step) replaced by `m`, ops ranked by time x runs."""
    m = replace(m, ops=tuple(sorted(m.ops, key=lambda o: (-o.total_s, o.name))))
    return replace(report, modules=(m, *report.modules[1:]))


def noted(report, ops, note):
    """(the report with its step's ops replaced and `note` added to its findings, the note), or
    (the report as it was, None) where there is no note."""
    if not note:
        return report, None
    m = report.modules[0]
    return with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note


def at_cycles(op, cycles: int, clock: float, source: str, limit: str):
    """`op` timed by the compiler's `cycles` where they are longer than its time; else `op` itself."""
    if cycles / clock <= op.estimated_s:
        return op
    return replace(op, estimated_s=round(cycles / clock, 12), estimated_cycles=cycles, bound_by="static_cycles",
                   cycles_source=source, limit=limit)
