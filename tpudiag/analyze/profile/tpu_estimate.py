"""`profile --target`: the measured CPU run next to the TPU compiler's estimate of the same computations.

Input: the profile's op timeline (TIMELINE frame), its steps, and the `CompileReport` of the run's
own jitted computations compiled for a TPU target. Output: the `TpuEstimate` model, the
`tpu_estimate` section of the profile report:

- per module: executions in the trace (distinct run ids), measured CPU op time, the estimated TPU
  time of one execution and of all of them;
- an estimated TPU step time: every module's estimate weighted by how often it ran inside the
  traced steps, divided by the number of steps;
- per source line: CPU op time against estimated TPU time (op names differ between the CPU and
  TPU compiles, the Python line they came from does not).

No I/O. A function compiled several times (e.g. `jit__normal` at three shapes) gives one row per
compile, each paired with its CPU program id by compile order (`_pair_compiles`).
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from tpudiag.analyze.profile.breakdown import ns_to_s
from tpudiag.results.compile import CompileReport, ModuleReport
from tpudiag.results.profile import TpuModuleRow, TpuOpRow, TpuStep, TpuLine, TpuEstimate

SECTION = "tpu_estimate"
NOTE = ("TPU times are the TPU compiler's static estimates and roofline floors, not measurements; "
        "a loop body counts its trip count where the HLO shows it, once where it does not")
MEASURED_NOTE = ("measured: the run's own op time on the TPU, per execution; estimated: the TPU compiler's static "
                 "cycles and roofline floors for the same programs; ratio: estimated / measured")
TOP_OPS = 50  # ops listed beside their estimates, by measured time


def _executions(tl: pd.DataFrame, key: str) -> pd.Series:
    """Per `key` (module or program id): how many times it ran (distinct run ids; where the trace
    has none, the most frequent op's count). Run ids may be negative (int32); -1 means unknown."""
    if tl.empty:
        return pd.Series(dtype="int64")
    known = tl[tl["run_id"] != -1].groupby(key)["run_id"].nunique()
    fallback = tl.groupby([key, "op"]).size().groupby(key).max()
    return known.reindex(fallback.index).fillna(fallback).astype("int64")


def _pair_compiles(report: CompileReport, tl: pd.DataFrame) -> list[tuple[ModuleReport, int | None]]:
    """Each compiled module with the CPU program id it corresponds to.

    Both sides list a function's compiles in compile order (the IR dump numbers them, XLA's
    program ids grow), so the k-th compile of `jit_f` is the k-th `jit_f` program in the trace.
    Where the counts differ the pairing is unknown (None) and the module's runs are split evenly.
    """
    ids = {name: sorted(g.unique().tolist()) for name, g in tl.groupby("module")["program_id"]} if len(tl) else {}
    by_name: dict[str, list[ModuleReport]] = defaultdict(list)
    for m in report.modules:
        by_name[m.name].append(m)
    out = []
    for name, mods in by_name.items():
        pids = ids.get(name, [])
        paired = len(pids) == len(mods)
        out += [(m, pids[k] if paired else None) for k, m in enumerate(mods)]
    return out


def _ratio(est: float | None, measured: float | None) -> float | None:
    return round(est / measured, 4) if est is not None and measured else None


def _measured_ops(tl: pd.DataFrame, pairs, runs_pid) -> tuple[TpuOpRow, ...]:
    """Each estimated op of a paired module beside its measured self time, per execution of the module."""
    self_ns = tl.groupby(["program_id", "op"])["self_ns"].sum()
    rows = []
    for m, pid in pairs:
        n = int(runs_pid.get(pid, 0)) if pid is not None else 0
        if not m.ok or not n:
            continue
        for o in m.ops:
            measured = float(self_ns.get((pid, o.name), 0)) * 1e-9 / n
            if measured <= 0:
                continue
            rows.append(TpuOpRow(module=m.name, name=o.name, measured_s=round(measured, 12),
                                 estimated_s=round(o.total_s, 12), ratio=_ratio(o.total_s, measured),
                                 cycles_source=o.cycles_source))
    rows.sort(key=lambda r: (-r.measured_s, r.module, r.name))
    return tuple(rows[:TOP_OPS])


def build_tpu_estimate(timeline: pd.DataFrame, step_count: int, report: CompileReport,
                       measured_step_s: float | None = None, on_tpu: bool = False) -> TpuEstimate:
    """`on_tpu`: the timeline was measured on a TPU, so each module and op gets its measured time per
    execution beside the estimate; `measured_step_s` is the device's op time in its median step."""
    tl = timeline
    in_steps = tl[tl["step"] >= 0] if len(tl) else tl
    runs_pid, runs_name = _executions(tl, "program_id"), _executions(tl, "module")
    step_pid, step_name = _executions(in_steps, "program_id"), _executions(in_steps, "module")
    cpu_pid = tl.groupby("program_id")["self_ns"].sum() if len(tl) else pd.Series(dtype="int64")
    cpu_name = tl.groupby("module")["self_ns"].sum() if len(tl) else pd.Series(dtype="int64")
    cpu_lines = tl[tl["source"].notna()].groupby(["program_id", "source"])["self_ns"].sum() if len(tl) else None
    pairs = _pair_compiles(report, tl)
    same_name = defaultdict(int)
    for m, _ in pairs:
        same_name[m.name] += 1

    modules, lines, step_tpu_s = [], defaultdict(lambda: [0.0, 0.0]), 0.0
    for m, pid in pairs:
        share = 1 / same_name[m.name]  # unpaired compiles split their function's runs evenly
        runs = int(runs_pid.get(pid, 0)) if pid is not None else runs_name.get(m.name, 0) * share
        in_step = int(step_pid.get(pid, 0)) if pid is not None else step_name.get(m.name, 0) * share
        cpu_ns = cpu_pid.get(pid, 0) if pid is not None else cpu_name.get(m.name, 0) * share
        per = m.estimated_s if m.ok else None
        modules.append(TpuModuleRow(
            name=m.name, program_id=pid, executions=round(runs, 3) if pid is None else runs,
            cpu_self_s=ns_to_s(cpu_ns), tpu_estimated_s=per,
            tpu_estimated_total_s=None if per is None else round(per * runs, 12), status=m.status, error=m.error,
            executions_per_step=round(in_step / step_count, 3) if step_count else None,
            measured_per_run_s=round(cpu_ns * 1e-9 / runs, 12) if on_tpu and runs else None,
            estimate_ratio=_ratio(per, cpu_ns * 1e-9 / runs) if on_tpu and runs else None))
        if per is not None and step_count:
            step_tpu_s += per * in_step / step_count
        if per is None or not runs:
            continue
        for o in m.ops:
            if o.source:
                lines[o.source][1] += o.estimated_s * o.runs * runs
        if pid is not None and cpu_lines is not None:
            for (p, source), ns in cpu_lines.items():
                if p == pid:
                    lines[source][0] += ns * 1e-9
    modules.sort(key=lambda r: (-(r.tpu_estimated_total_s or 0), r.name))
    line_rows = sorted((TpuLine(source=src, cpu_self_s=round(cpu, 9), tpu_estimated_s=round(tpu, 12))
                        for src, (cpu, tpu) in lines.items()), key=lambda r: (-r.tpu_estimated_s, r.source))
    return TpuEstimate(target=report.target, status=report.status, modules=tuple(modules),
                       step=TpuStep(count=step_count, tpu_estimated_s=round(step_tpu_s, 12) if step_count else None,
                                    measured_s=measured_step_s if on_tpu else None),
                       lines=tuple(line_rows), note=MEASURED_NOTE if on_tpu else NOTE, suggestions=report.suggestions,
                       ops=_measured_ops(tl, pairs, runs_pid) if on_tpu else None)
