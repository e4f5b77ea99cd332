"""`tpudiag profile --processes N` and `tpudiag report` of several hosts' traces: run a
multi-process job, or read a pod's `plugins/profile/<session>/<host>.xplane.pb` files, and build
the cross-process report (`tpudiag.distributed/1`).

Reads manifests, traces and HLO dumps; returns `DistributedReport`s. It does not render.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tpudiag.capture import rundir
from tpudiag.capture.runner import CaptureResult
from tpudiag.errors import InputError, TpudiagError
from tpudiag.outputs import check_run_dir


def _read(xplane: Path, dump: Path | None, warnings: list[str], what: str):
    from tpudiag.api.profiling import hlo_modules
    from tpudiag.parse.xplane import read_xplane

    trace = read_xplane(xplane)
    modules = {}
    if dump is not None and dump.is_dir():
        pids = set(trace.ops["program_id"].unique().tolist())
        try:
            modules = hlo_modules(dump, pids)
        except TpudiagError as e:
            warnings.append(f"{what}: HLO dump unreadable, collectives named from their op names only: {e}")
    return trace, modules


def analyze_job(run: Path, manifest=None, align: str = "auto"):
    """The cross-process report of a `profile --processes N` run directory."""
    from tpudiag.analyze.distributed.collectives import ProcessTrace, build_distributed_report

    run = Path(run)
    manifest = manifest or rundir.read_manifest(run)
    warnings, procs = [], []
    for entry in manifest.processes or ():
        what = f"process {entry.process_id}"
        if entry.xplane is None or not (run / entry.xplane).is_file():
            why = entry.reason or ("its trace is missing" if entry.xplane else "it wrote no trace")
            warnings.append(f"{what}: no trace ({why}); left out")
            continue
        if entry.joined_cluster is False:
            warnings.append(f"{what} never called jax.distributed.initialize(): it ran alone, not as part of the job")
        trace, modules = _read(run / entry.xplane, run / entry.run_dir / rundir.HLO_DIR, warnings, what)
        procs.append(ProcessTrace(entry.process_id, trace, modules, entry.xplane, entry.run_dir, entry.exit_code,
                                  entry.status, entry.reason))
    report = build_distributed_report(procs, program=manifest.program, status=manifest.status,
                                      reason=manifest.reason, align=align, warnings=warnings,
                                      artifacts={"run_dir": str(run), "manifest": rundir.MANIFEST,
                                                 "report": rundir.REPORT, "trace_logdir": rundir.TRACE_DIR})
    return report


def analyze_pod(path: Path, xplanes: list[Path] | None = None, align: str = "auto"):
    """The cross-process report of several hosts' traces (XProf's layout of a pod's profile). An
    HLO dump is used where one sits beside a trace (`<host>.hlo/` or the session's `hlo/`)."""
    from tpudiag.analyze.distributed.collectives import ProcessTrace, build_distributed_report
    from tpudiag.api.runs import session_xplanes

    path = Path(path)
    xplanes = xplanes or session_xplanes(path)
    if not xplanes:
        raise InputError(f"{path}: not several hosts' traces (expected plugins/profile/<session>/<host>.xplane.pb)")
    warnings, procs = [], []
    for i, x in enumerate(xplanes):
        host = x.name.removesuffix(".xplane.pb")
        dump = next((d for d in (x.parent / f"{host}.hlo", x.parent / "hlo") if d.is_dir()), None)
        trace, modules = _read(x, dump, warnings, host)
        procs.append(ProcessTrace(i, trace, modules, str(x)))
    if not any(p.modules for p in procs):
        warnings.append("no HLO dump beside these traces: collectives are named from their op names; message "
                        "sizes, replica groups and source lines are unknown")
    return build_distributed_report(procs, align=align, warnings=warnings, artifacts={"trace_logdir": str(path)})


def profile_processes(script, args=(), out=None, *, processes: int, devices_per_process=None, job_wall_s=None,
                      steps=None, skip=0, python_trace=False, coordinator_port=None, program_stdout=None,
                      program_stderr=None, while_waiting=None):
    """Run `processes` copies of `script` as one JAX job under the profiler, analyze them together
    and write `report.json` / `report.md` into the run directory. Returns (CaptureResult, report)."""
    from tpudiag.capture.multiprocess import run_processes

    script = Path(script)
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(script))
    cap: CaptureResult = run_processes(script, list(args), run, processes=processes,
                                       devices_per_process=devices_per_process, job_wall_s=job_wall_s, steps=steps,
                                       skip=skip, python_trace=python_trace, coordinator_port=coordinator_port,
                                       program_stdout=program_stdout, program_stderr=program_stderr,
                                       while_waiting=while_waiting)
    try:
        report = analyze_job(cap.run_dir)
    except TpudiagError as e:
        if cap.exit_code == 0:
            raise
        from tpudiag.analyze.distributed.collectives import build_distributed_report

        report = replace(build_distributed_report([], status="failed", reason=cap.reason),
                         warnings=(f"analysis failed: {e}",))
    write_distributed_report(report, cap.run_dir)
    return cap, report


def write_distributed_report(report, run: Path) -> Path:
    """report.json and report.md of a `DistributedReport`, as the renderer registry renders them."""
    from tpudiag.report.registry import render

    for name, fmt in ((rundir.REPORT, "json"), (rundir.REPORT_MD, "md")):
        rundir.write_text_atomic(Path(run) / name, render(report, fmt))
    return Path(run) / rundir.REPORT
