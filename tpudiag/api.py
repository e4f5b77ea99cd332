"""The Python entry points a notebook or a CI script calls: profile a script, analyze or load a run.

    import tpudiag.api as td
    result = td.profile("train.py", ["--steps", "5"])      # runs it, writes the run directory
    report = td.load_report("tpudiag-runs/2026...-train")   # re-analyzes a run (or a bare .xplane.pb)
    report.to_dict()["breakdown"]

This module wires capture -> parse -> analyze and does the file I/O that `analyze/` must not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpudiag.analyze.categorize import index_module
from tpudiag.analyze.profile_report import ProfileReport, build_profile_report
from tpudiag.capture import rundir
from tpudiag.capture.runner import CaptureResult, run_program
from tpudiag.errors import InputError, TpudiagError
from tpudiag.parse import frames, xprof_tools
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file
from tpudiag.parse.monitoring import read_monitoring
from tpudiag.parse.xplane import Trace, locate_xplane, read_xplane


@dataclass(frozen=True)
class ProfileResult:
    capture: CaptureResult
    report: ProfileReport


def hlo_index(dump_dir: Path, program_ids: set[int] | None = None) -> dict:
    """{program_id: {op name: OpInfo}} from the after-optimizations HLO in a dump directory."""
    out = {}
    for pid, path in find_optimized_modules(dump_dir).items():
        if program_ids is None or pid in program_ids:
            out[pid] = index_module(read_hlo_file(path))
    return out


def _empty_trace() -> Trace:
    return Trace(path="", hostname="", backend="unknown", start_time_ns=0, window_ns=0,
                 ops=frames.empty_frame(frames.OPS), steps=frames.empty_frame(frames.STEPS),
                 host=frames.empty_frame(frames.HOST), compile=frames.empty_frame(frames.HOST), devices=(),
                 jax_version=None)


def _xprof_stats(trace: Trace, warnings: list[str]):
    """XProf's hlo_stats for device-plane traces; CPU traces get none (XProf's tables are empty for them)."""
    if trace.backend not in ("tpu", "gpu"):
        return None
    try:
        return xprof_tools.hlo_stats(Path(trace.path))
    except Exception as e:  # XProf's C++ converter on an unfamiliar trace must not end the report
        warnings.append(f"XProf's per-op statistics are missing: {type(e).__name__}: {e}")
        return None


def _run_root_of(xplane: Path) -> Path | None:
    """RUN for RUN/trace/plugins/profile/<session>/<host>.xplane.pb, if RUN is a tpudiag run."""
    parents = xplane.resolve().parents
    if len(parents) > 4 and rundir.is_run_dir(parents[4]):
        return parents[4]
    return None


def analyze_run(run: Path, xplane: Path | None = None) -> ProfileReport:
    """Analyze a run directory from its artifacts (never re-runs the program).

    `xplane`: which of the run's traces to report (default: the last one).
    """
    run = Path(run)
    manifest = rundir.read_manifest(run)
    warnings = []
    xplanes = rundir.find_xplanes(run / rundir.TRACE_DIR)
    if xplane is not None:
        xplanes = [p for p in xplanes if p.resolve() != Path(xplane).resolve()] + [Path(xplane)]
    if xplanes:
        trace = read_xplane(xplanes[-1])
        if len(xplanes) > 1:
            warnings.append(f"{len(xplanes)} traces in this run; reporting {xplanes[-1].name}")
        entered, asked = manifest.get("steps_entered"), manifest.get("steps")
        if asked is not None and entered is not None and entered < manifest.get("skip", 0) + asked:
            warnings.append(f"--steps {asked} --skip {manifest.get('skip', 0)} asked for more steps than the "
                            f"program ran ({entered}): traced until it ended")
    else:
        if manifest.get("reason"):
            why = manifest["reason"]
        elif manifest.get("steps") is not None:
            why = (f"the program entered {manifest.get('steps_entered') or 0} StepTraceAnnotation steps; "
                   f"--skip {manifest.get('skip', 0)} --steps {manifest['steps']} selects none of them")
        else:
            why = "the program never initialized a jax backend, so there was nothing to trace"
        warnings.append(f"no trace was written ({why})")
        trace = _empty_trace()
    xprof_stats = _xprof_stats(trace, warnings)
    pids = set(trace.ops["program_id"].unique().tolist())
    index = hlo_index(run / rundir.HLO_DIR, pids)
    compiles, hits = read_monitoring(run / rundir.MONITORING)
    artifacts = {
        "run_dir": str(run),
        "manifest": rundir.MANIFEST,
        "report": rundir.REPORT,
        "program_log": rundir.PROGRAM_LOG,
        "trace_logdir": rundir.TRACE_DIR,
        "xplane": str(xplanes[-1].relative_to(run)) if xplanes else None,
        "hlo_dump": rundir.HLO_DIR,
        "ir_dump": rundir.IR_DIR,
    }
    return build_profile_report(trace, index, compiles, hits, manifest, artifacts, warnings, xprof_stats)


def analyze_xplane(path: Path) -> ProfileReport:
    """Analyze a bare `.xplane.pb` captured elsewhere; HLO and compile data are used if it sits in a run."""
    path = Path(path)
    root = _run_root_of(path)
    if root is not None:
        return analyze_run(root, path)
    trace = read_xplane(path)
    warnings = ["no HLO dump beside this trace: op categories and source lines are unknown"] if len(trace.ops) else []
    xprof_stats = _xprof_stats(trace, warnings)
    return build_profile_report(trace, {}, frames.empty_frame(frames.COMPILES), 0, None,
                                {"xplane": str(path)}, warnings, xprof_stats)


def load_report(target: Path) -> ProfileReport:
    """A run directory, an xprof log directory, or a `.xplane.pb` file."""
    target = Path(target)
    if rundir.is_run_dir(target):
        return analyze_run(target)
    if target.is_dir() and not any(target.iterdir()):
        raise InputError(f"{target}: empty directory (expected a tpudiag run directory or an .xplane.pb)")
    return analyze_xplane(locate_xplane(target))


def write_report(report: ProfileReport, run: Path) -> Path:
    """report.json and report.md into the run directory (each written whole, or not at all)."""
    from tpudiag.report.markdown import render_markdown

    path = Path(run) / rundir.REPORT
    rundir.write_json_atomic(path, report.to_dict())
    rundir.write_text_atomic(Path(run) / rundir.REPORT_MD, render_markdown(report.to_dict()))
    return path


def profile(script, args=(), out=None, *, steps=None, skip=0, python_trace=False,
            program_stdout=None, program_stderr=None) -> ProfileResult:
    """Run `script` under the profiler, analyze it and write `report.json` into the run directory."""
    script = Path(script)
    run = Path(out) if out else rundir.default_run_dir(script)
    cap = run_program(script, list(args), run, steps=steps, skip=skip, python_trace=python_trace,
                      program_stdout=program_stdout, program_stderr=program_stderr)
    return finish_capture(cap)


def finish_capture(cap: CaptureResult) -> ProfileResult:
    """Analyze a capture that just ended and write its reports (even when the program failed)."""
    try:
        report = analyze_run(cap.run_dir)
    except TpudiagError as e:
        # Analysis of a failed program's partial artifacts must not hide the program's failure.
        if cap.exit_code == 0:
            raise
        report = build_profile_report(_empty_trace(), {}, frames.empty_frame(frames.COMPILES), 0,
                                      rundir.read_manifest(cap.run_dir), {"run_dir": str(cap.run_dir)},
                                      [f"analysis failed: {e}"])
    write_report(report, cap.run_dir)
    return ProfileResult(capture=cap, report=report)
