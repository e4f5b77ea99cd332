"""A TPU profile run as the compile report `suggest` reads: the run's own optimized HLO (the TPU
compiler's, from its dump) with each op's time measured on the chip instead of estimated.

Input: the compile report built from the run's dump (roofline floors, `analyze.compile.report`), the
profile's timeline, and {artifacts key: program_id} for its modules. Output: the same report with
every op's `estimated_s` the op's measured self time per execution of its module (per run inside a
loop body), `cycles_source` "measured", and each module's total the measured time of one execution;
plus each module's executions per traced step. Ops the trace never saw take 0. No I/O.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from tpudiag.results.compile import CompileReport, ModuleTotals

CYCLES_SOURCE = "measured"


def executions(timeline: pd.DataFrame) -> dict[int, int]:
    """{program_id: executions in the trace}: distinct run ids (the most frequent op's count without them)."""
    out = {}
    for pid, g in timeline.groupby("program_id"):
        known = g.loc[g["run_id"] != -1, "run_id"].nunique()
        out[int(pid)] = int(known or g.groupby("op").size().max())
    return out


def measured_report(report: CompileReport, timeline: pd.DataFrame, program_of: dict[str, int]) -> CompileReport:
    runs = executions(timeline)
    self_ns = timeline.groupby(["program_id", "op"])["self_ns"].sum()
    modules = []
    for m in report.modules:
        pid = program_of.get(m.artifacts)
        n = runs.get(pid, 0) if pid is not None else 0
        if not m.ok or not isinstance(m.totals, ModuleTotals) or not n:
            modules.append(m)
            continue
        ops = []
        for o in m.ops:
            per_exec = float(self_ns.get((pid, o.name), 0)) * 1e-9 / n
            ops.append(replace(o, estimated_s=round(per_exec / max(o.runs, 1), 12), cycles_source=CYCLES_SOURCE,
                               bound_by=CYCLES_SOURCE, limit="measured on the chip"))
        total = round(sum(o.total_s for o in ops), 12)
        modules.append(replace(m, ops=tuple(ops), totals=replace(m.totals, estimated_s=total)))
    return replace(report, modules=tuple(modules),
                   totals=replace(report.totals, estimated_s=round(sum(m.estimated_s or 0 for m in modules
                                                                       if m.ok), 12)))


def executions_per_step(timeline: pd.DataFrame, steps: int, module_of: dict[int, str]) -> dict[str, float]:
    """{module name: executions per traced step}; a name two programs share is left out."""
    if not steps:
        return {}
    sel = timeline[timeline["step"] >= 0]
    runs = executions(sel) if len(sel) else {}
    names = list(module_of.values())
    return {module_of[pid]: round(n / steps, 3) for pid, n in runs.items()
            if pid in module_of and names.count(module_of[pid]) == 1}
