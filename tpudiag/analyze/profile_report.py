"""Assembles the `tpudiag.report/1` document from parsed pieces: timeline, breakdown, top ops, compiles.

Input: the parsed trace, the HLO op index, the compile frame and the run manifest (or None for a
bare `.xplane.pb`). Output: a frozen `ProfileReport` whose `to_dict()` is the JSON document
(schema in docs/report-schema.md) and whose `timeline` keeps the per-instance frame for
renderers and exporters. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tpudiag.analyze.breakdown import Breakdown, split_window
from tpudiag.analyze.breakdown import ns_to_s as _s
from tpudiag.analyze.compiles import compile_intervals, compile_table
from tpudiag.analyze.fusions import build_fusion_report, fusion_summary
from tpudiag.analyze.timeline import aggregate_ops, build_timeline, step_table
from tpudiag.parse.xplane import Trace

SCHEMA = "tpudiag.report/1"


@dataclass(frozen=True)
class ProfileReport:
    doc: dict
    timeline: pd.DataFrame = field(repr=False, compare=False)
    ops: pd.DataFrame = field(repr=False, compare=False)

    def to_dict(self) -> dict:
        return self.doc

    @property
    def breakdown(self) -> Breakdown:
        return Breakdown(**self.doc["breakdown"])


def _intervals(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    s = df["start_ns"].to_numpy(dtype=np.int64)
    return s, s + df["duration_ns"].to_numpy(dtype=np.int64)


def _median(values) -> float | None:
    return float(np.median(values)) if len(values) else None


def _fusion_summaries(timeline: pd.DataFrame, modules: dict, top: int) -> list[dict]:
    """Fusions and fusion breaks of the modules that took the most op time, with measured times."""
    if timeline.empty or not modules:
        return []
    by_pid = timeline.groupby("program_id")["self_ns"].sum().sort_values(ascending=False)
    out = []
    for pid in [p for p in by_pid.index if int(p) in modules][:top]:
        sel = timeline[timeline["program_id"] == pid]
        times = {op: ns * 1e-9 for op, ns in sel.groupby("op")["self_ns"].sum().items()}
        out.append(fusion_summary(build_fusion_report(modules[int(pid)], times, "measured")))
    return out


def build_profile_report(trace: Trace, hlo_index: dict, compiles: pd.DataFrame, cache_hits: int,
                         manifest: dict | None, artifacts: dict[str, str], warnings: list[str] | None = None,
                         xprof_stats: pd.DataFrame | None = None, modules: dict | None = None,
                         fusion_modules: int = 3) -> ProfileReport:
    """`xprof_stats` (XProf's hlo_stats, device planes only) adds XProf's per-op figures to each op row;
    `modules` ({program_id: HloModule}) adds the fusion summary of the `fusion_modules` modules with
    the most op time."""
    warnings = list(warnings or [])
    timeline = build_timeline(trace.ops, trace.steps, hlo_index)
    ops = aggregate_ops(timeline)

    classes = {bound: _intervals(sel) for bound, sel in timeline.groupby("bound", sort=False)}
    hs, he = _intervals(trace.host)
    if "host" in classes:
        classes["host"] = (np.concatenate([classes["host"][0], hs]), np.concatenate([classes["host"][1], he]))
    else:
        classes["host"] = (hs, he)
    cs, ce = _intervals(trace.compile)  # compile work seen in the trace itself
    if len(compiles) and trace.start_time_ns:
        ms, me = compile_intervals(compiles, trace.start_time_ns)  # jax.monitoring's stages
        cs, ce = np.concatenate([cs, ms]), np.concatenate([ce, me])
    classes["compile"] = (cs, ce)
    bd = split_window(trace.window_ns, classes)

    missing = sum(1 for p, o in zip(ops["program_id"], ops["op"]) if o not in hlo_index.get(int(p), {}))
    if missing and (hlo_index or manifest is not None):
        warnings.append(f"{missing} of {len(ops)} ops have no matching instruction in the HLO dump "
                        "(their category is guessed from the op name; no source line)")
    xprof = {}
    if xprof_stats is not None and len(xprof_stats):
        for r in xprof_stats.itertuples():
            xprof[(int(r.program_id), r.op)] = {
                "category": r.xprof_category, "bound_by": r.bound_by,
                "model_gflops_per_s": None if pd.isna(r.model_gflops_per_s) else float(r.model_gflops_per_s),
                "memory_gib_per_s": None if pd.isna(r.memory_gib_per_s) else float(r.memory_gib_per_s),
                "flops_per_byte": None if pd.isna(r.flops_per_byte) else float(r.flops_per_byte)}
    steps = step_table(timeline, trace.steps)
    ctab = compile_table(compiles)
    m = manifest or {}
    doc = {
        "schema": SCHEMA,
        "status": m.get("status", "ok"),
        "reason": m.get("reason"),
        "exit_code": m.get("exit_code"),
        "program": m.get("program"),
        "argv": m.get("argv"),
        "command": m.get("command"),
        "backend": trace.backend,
        "host": trace.hostname,
        "devices": list(trace.devices),
        "wall_s": _s(trace.window_ns),
        "process_wall_s": m.get("wall_s"),
        "traced": {"steps": m.get("steps"), "skip": m.get("skip", 0) if m else None},
        "breakdown": bd.to_dict(),
        "breakdown_share": bd.shares(),
        "totals": {
            "op_instances": int(len(timeline)),
            "distinct_ops": int(len(ops)),
            "op_self_s": _s(timeline["self_ns"].sum()),
            "modules": int(timeline["module"].nunique()),
            "compile_s": _s(compiles["duration_ns"].sum()),
            "compile_cache_hits": int(cache_hits),
        },
        "steps": {
            "count": int(len(steps)),
            "median_s": _s(_median(steps["duration_ns"].to_numpy()) or 0) if len(steps) else None,
            "rows": [{"step_num": int(r.step_num), "duration_s": _s(r.duration_ns), "op_s": _s(r.op_ns)}
                     for r in steps.itertuples()],
        },
        "ops": [
            {"name": r.op, "module": r.module, "program_id": int(r.program_id), "category": r.category,
             "opcode": r.opcode, "bound": r.bound, "shape": r.shape,
             "source": r.source if isinstance(r.source, str) else None,
             "occurrences": int(r.occurrences), "total_s": _s(r.total_ns), "self_s": _s(r.self_ns),
             "avg_s": _s(r.avg_ns), "share": float(r.share),
             "xprof": xprof.get((int(r.program_id), r.op))}
            for r in ops.itertuples()
        ],
        "compile": [
            {"function": r.fun_name, "compiles": int(r.compiles), "tracing_s": _s(r.tracing_ns),
             "lowering_s": _s(r.lowering_ns), "backend_compile_s": _s(r.backend_compile_ns),
             "total_s": _s(r.total_ns)}
            for r in ctab.itertuples()
        ],
        "artifacts": artifacts,
        "versions": m.get("versions", {"jax": trace.jax_version}),
        "fusions": _fusion_summaries(timeline, modules or {}, fusion_modules),
        "warnings": warnings,
    }
    return ProfileReport(doc=doc, timeline=timeline, ops=ops)
