"""`tpudiag export RUN --perfetto FILE`: a profile run's op timeline as a Chrome JSON trace.

Reads the run (its report and trace); writes the file atomically. Rendering is `report/perfetto.py`.
"""

from __future__ import annotations

from pathlib import Path

from tpudiag.api import runs
from tpudiag.api.load import load_report
from tpudiag.capture import rundir
from tpudiag.errors import InputError
from tpudiag.outputs import check_output_file
from tpudiag.parse.xplane import locate_xplane, read_xplane
from tpudiag.results.profile import ProfileReport


def perfetto_export(run: Path, out: Path) -> dict:
    """`tpudiag export RUN --perfetto FILE`: the run's op timeline as a Chrome JSON trace for Perfetto.
    Returns {"path", "events", "bytes"}."""
    from tpudiag.report.perfetto import dump_perfetto, render_perfetto

    check_output_file(out)  # before the run is read and analyzed
    handle = runs.open_run(run)
    runs.refuse_job(handle, "export")
    report = load_report(handle)
    if not isinstance(report, ProfileReport):
        raise InputError(f"{run}: a compile run has no timeline to export (export a profile run)")
    tl = report.timeline
    ops = [{"device": r.device, "line": r.line, "op": r.op, "module": r.module, "program_id": int(r.program_id),
            "category": r.category, "bound": r.bound, "source": r.source if isinstance(r.source, str) else None,
            "step": int(r.step), "start_ns": int(r.start_ns), "duration_ns": int(r.duration_ns),
            "self_ns": int(r.self_ns)} for r in tl.itertuples()]
    steps = [{"name": s.name, "step_num": int(s.step_num), "start_ns": int(s.start_ns),
              "duration_ns": int(s.duration_ns)} for s in read_xplane(locate_xplane(Path(run))).steps.itertuples()]
    meta = report.to_dict()
    doc = render_perfetto(ops, steps, {"program": meta.get("program"), "backend": meta["backend"]})
    data = dump_perfetto(doc, str(out))
    rundir.write_bytes_atomic(Path(out), data)
    return {"path": str(out), "events": len(ops) + len(steps), "bytes": len(data)}
