"""Assembles the `tpudiag.report/1` document from parsed pieces: timeline, breakdown, top ops, compiles.

Input: the parsed trace, the HLO op index, the compile frame and the run manifest (or None for a
bare `.xplane.pb`). Output: a `ProfileReport`, a tree of frozen models whose `to_dict()` is the
JSON document (schema in docs/report-schema.md) and whose `timeline` and `op_frame` keep the
per-instance and per-op frames for renderers and exporters (not part of the document).
`ProfileReport.from_dict` reads a `report.json` back, checking every field. No I/O.
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from tpudiag.analyze.profile.breakdown import split_window
from tpudiag.analyze.profile.breakdown import ns_to_s as _s
from tpudiag.analyze.profile.compiles import compile_intervals, compile_table
from tpudiag.analyze.profile.device_time import apply_rates, device_time, op_rates
from tpudiag.analyze.profile.work import executed_work, op_costs
from tpudiag.analyze.hlo.fusions import build_fusion_report, fusion_summary
from tpudiag.analyze.profile.timeline import aggregate_ops, build_timeline, step_table, steps_by_launch
from tpudiag.results.manifest import Manifest
from tpudiag.parse.xplane import Trace
from tpudiag.results.profile import SCHEMA, Traced, Totals, StepRow, Steps, XprofOp, OpRow, CompileRow, ProfileReport


def _intervals(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    s = df["start_ns"].to_numpy(dtype=np.int64)
    return s, s + df["duration_ns"].to_numpy(dtype=np.int64)


def _median(values) -> float | None:
    return float(np.median(values)) if len(values) else None


def _cost_fields(cost) -> dict:
    return {} if cost is None else {"flops": int(cost.flops), "bytes_accessed": int(cost.bytes_accessed)}


def _fusion_summaries(timeline: pd.DataFrame, modules: dict, top: int, setup: set[int]) -> list[dict]:
    """Fusions and fusion breaks of the `top` modules that took the most op time, with measured
    times; setup modules (`setup`: their program ids) are not among them."""
    if timeline.empty or not modules:
        return []
    by_pid = timeline.groupby("program_id")["self_ns"].sum().sort_values(ascending=False)
    out = []
    for pid in [p for p in by_pid.index if int(p) in modules and int(p) not in setup][:top]:
        sel = timeline[timeline["program_id"] == pid]
        times = {op: ns * 1e-9 for op, ns in sel.groupby("op")["self_ns"].sum().items()}
        out.append(fusion_summary(build_fusion_report(modules[int(pid)], times, "measured")))
    return out


def _setup_names(timeline: pd.DataFrame, modules: dict, setup: set[int]) -> tuple[str, ...] | None:
    """The executed setup modules' names, most op time first; None where no module is one, or
    every executed module is (then none is set apart)."""
    if timeline.empty or not setup:
        return None
    by_pid = [int(p) for p in timeline.groupby("program_id")["self_ns"].sum().sort_values(ascending=False).index]
    names = [modules[p].name if p in modules else f"program {p}" for p in by_pid if p in setup]
    return tuple(names) if names and len(names) < len(by_pid) else None


def _with_trace_metadata(timeline: pd.DataFrame, op_meta: pd.DataFrame, hlo_index: dict) -> pd.DataFrame:
    """A TPU trace records each op's XProf category and source line: they stand in for an op the HLO
    dump does not have (no dump beside a bare trace), and for a source line its metadata lacks."""
    if timeline.empty or op_meta.empty:
        return timeline
    meta = {(int(p), o): (c, s) for p, o, c, s in
            zip(op_meta["program_id"], op_meta["op"], op_meta["xprof_category"], op_meta["source"])}
    keys = list(zip(timeline["program_id"].astype(int), timeline["op"]))
    joined = [o in hlo_index.get(p, {}) for p, o in keys]
    category = [c if j or (p, o) not in meta or not meta[(p, o)][0] else meta[(p, o)][0]
                for (p, o), c, j in zip(keys, timeline["category"], joined)]
    source = [s if isinstance(s, str) else (meta.get(k, (None, None))[1]) for k, s in zip(keys, timeline["source"])]
    return timeline.assign(category=pd.Series(category, index=timeline.index, dtype="object"),
                           source=pd.Series(source, index=timeline.index, dtype="object"))


def build_profile_report(trace: Trace, hlo_index: dict, compiles: pd.DataFrame, cache_hits: int,
                         manifest: Manifest | None, artifacts: dict[str, str], warnings: list[str] | None = None,
                         xprof_stats: pd.DataFrame | None = None, modules: dict | None = None,
                         fusion_modules: int = 3, allocated: dict | None = None,
                         setup: set[int] | None = None) -> ProfileReport:
    """`xprof_stats` (XProf's hlo_stats, device planes only) adds XProf's per-op figures to each op row;
    `modules` ({program_id: HloModule}) adds each op's HLO cost, the executed work and the fusion
    summary of the `fusion_modules` modules with the most op time; `allocated` ({program_id: bytes of
    XLA's buffer assignment}) the work's peak allocation; `setup` (program ids of the setup modules,
    `parse.setup_modules`) sets those apart: named on one line, no fusion summary."""
    warnings = list(warnings or [])
    if manifest is not None and manifest.left_running:
        pids = ", ".join(map(str, manifest.left_running))
        warnings.append(f"the program left {len(manifest.left_running)} background process(es) running (pid {pids}); "
                        "tpudiag stopped reading their output when the program ended")
    timeline = build_timeline(trace.ops, trace.steps, hlo_index)
    rates = {}
    if trace.device is not None:  # a TPU: the trace's own costs and source lines, each op's measured bound
        timeline = steps_by_launch(timeline, trace.launches, trace.device.module_runs, trace.steps)
        timeline = _with_trace_metadata(timeline, trace.device.op_meta, hlo_index)
        rates = op_rates(aggregate_ops(timeline), trace.device.op_meta, trace.device.chip)
        timeline = apply_rates(timeline, rates)
        if trace.device.unknown_lines:
            warnings.append("device lines tpudiag does not read (a newer libtpu or XProf?): "
                            + ", ".join(trace.device.unknown_lines))
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
            xprof[(int(r.program_id), r.op)] = XprofOp(
                category=r.xprof_category, bound_by=r.bound_by,
                model_gflops_per_s=None if pd.isna(r.model_gflops_per_s) else float(r.model_gflops_per_s),
                memory_gib_per_s=None if pd.isna(r.memory_gib_per_s) else float(r.memory_gib_per_s),
                flops_per_byte=None if pd.isna(r.flops_per_byte) else float(r.flops_per_byte))
    steps = step_table(timeline, trace.steps)
    costs = op_costs(ops, modules or {})
    ctab = compile_table(compiles)
    m = manifest
    setup_names = _setup_names(timeline, modules or {}, set(setup or ()))
    return ProfileReport(
        schema=SCHEMA,
        status=m.status if m else "ok",
        reason=m.reason if m else None,
        exit_code=m.exit_code if m else None,
        program=m.program if m else None,
        argv=m.argv if m else None,
        command=m.command if m else None,
        backend=trace.backend,
        host=trace.hostname,
        devices=tuple(trace.devices),
        wall_s=_s(trace.window_ns),
        process_wall_s=m.wall_s if m else None,
        traced=Traced(steps=m.steps if m else None, skip=(m.skip or 0) if m else None),
        breakdown=bd,
        breakdown_share=bd.shares(),
        totals=Totals(
            op_instances=int(len(timeline)),
            distinct_ops=int(len(ops)),
            op_self_s=_s(timeline["self_ns"].sum()),
            modules=int(timeline["module"].nunique()),
            compile_s=_s(compiles["duration_ns"].sum()),
            compile_cache_hits=int(cache_hits),
        ),
        steps=Steps(
            count=int(len(steps)),
            median_s=_s(_median(steps["duration_ns"].to_numpy()) or 0) if len(steps) else None,
            rows=tuple(StepRow(step_num=int(r.step_num), duration_s=_s(r.duration_ns), op_s=_s(r.op_ns))
                       for r in steps.itertuples()),
        ),
        ops=tuple(
            OpRow(name=r.op, module=r.module, program_id=int(r.program_id), category=r.category,
                  opcode=r.opcode, bound=r.bound, shape=r.shape,
                  source=r.source if isinstance(r.source, str) else None,
                  occurrences=int(r.occurrences), total_s=_s(r.total_ns), self_s=_s(r.self_ns),
                  avg_s=_s(r.avg_ns), share=float(r.share), xprof=xprof.get((int(r.program_id), r.op)),
                  measured=rates.get((int(r.program_id), r.op)),
                  **_cost_fields(costs.get((int(r.program_id), r.op))))
            for r in ops.itertuples()
        ),
        compile=tuple(
            CompileRow(function=r.fun_name, compiles=int(r.compiles), tracing_s=_s(r.tracing_ns),
                       lowering_s=_s(r.lowering_ns), backend_compile_s=_s(r.backend_compile_ns),
                       total_s=_s(r.total_ns))
            for r in ctab.itertuples()
        ),
        artifacts=dict(artifacts),
        versions=m.versions if m and m.versions is not None else {"jax": trace.jax_version},
        fusions=tuple(_fusion_summaries(timeline, modules or {}, fusion_modules,
                                        set(setup or ()) if setup_names else set())),
        fusions_setup=setup_names,
        warnings=tuple(warnings),
        calibration_s=m.calibration_s if m else None,
        calibration_loop=m.calibration_loop if m else None,
        work=executed_work(timeline, int(len(steps)), costs, allocated or {}),
        device=(device_time(timeline, trace.steps, trace.device, trace.window_ns, rates)
                if trace.device is not None else None),
        timeline=timeline,
        op_frame=ops,
    )
