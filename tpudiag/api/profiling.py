"""`tpudiag profile` and the profile half of `tpudiag report`: run a script under the profiler
(optionally compiling its own computations for a TPU beside it), analyze a profile run directory or
a bare trace, write its reports. Which report a path gets is `load.load_report`'s decision.

Reads a run directory's manifest, trace, HLO dump and monitoring log; returns `ProfileReport`s. It
does not render (that is `report/`) or decide exit codes (that is `cli.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpudiag.capture import rundir
from tpudiag.capture.runner import CaptureResult, run_program
from tpudiag.errors import TpudiagError
from tpudiag.outputs import check_output_file, check_run_dir
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file

if TYPE_CHECKING:
    from tpudiag.results.profile import ProfileReport

# The analysis stack (pandas, the xplane reader) is imported inside the functions that need it:
# `profile` starts the program first and imports it while the program runs.


@dataclass(frozen=True)
class ProfileResult:
    capture: CaptureResult
    report: object  # results.profile.ProfileReport


def hlo_modules(dump_dir: Path, program_ids: set[int] | None = None) -> dict:
    """{program_id: HloModule} of the after-optimizations HLO in a dump directory."""
    return {pid: read_hlo_file(path) for pid, path in find_optimized_modules(dump_dir).items()
            if program_ids is None or pid in program_ids}


def allocated_bytes(dump_dir: Path, program_ids: set[int], warnings: list[str]) -> dict[int, int]:
    """{program_id: bytes XLA's buffer assignment allocates} from the dump's memory reports; one that
    cannot be read is a warning (the work's peak allocation then leaves it out), not a failed report."""
    from tpudiag.parse.hlo import find_memory_reports, read_allocated_bytes

    out = {}
    for pid, path in find_memory_reports(dump_dir).items():
        if pid in program_ids:
            try:
                out[pid] = read_allocated_bytes(path)
            except TpudiagError as e:
                warnings.append(f"memory report unreadable, left out of the peak allocation: {e}")
    return out


def setup_programs(dump_dir: Path, program_ids: set[int]) -> set[int]:
    """The program ids among `program_ids` whose module is setup (`parse.setup_modules`), read from
    XLA's before-optimizations dump: the module as jax handed it over, before XLA's CPU rewrites."""
    from tpudiag.parse.hlo import find_unoptimized_modules
    from tpudiag.parse.setup_modules import is_setup_module

    return {pid for pid, path in find_unoptimized_modules(dump_dir).items()
            if pid in program_ids and is_setup_module(path)}


def hlo_index(dump_dir: Path, program_ids: set[int] | None = None) -> dict:
    """{program_id: {op name: OpInfo}} from the after-optimizations HLO in a dump directory."""
    from tpudiag.analyze.hlo.categories import index_module

    return {pid: index_module(m) for pid, m in hlo_modules(dump_dir, program_ids).items()}


def empty_trace():
    """A trace with no events: what a report of a run that traced nothing is built on."""
    from tpudiag.parse import frames
    from tpudiag.parse.xplane import Trace
    from tpudiag.results.profile import NO_BACKEND

    return Trace(path="", hostname="", backend=NO_BACKEND, start_time_ns=0, window_ns=0,
                 ops=frames.empty_frame(frames.OPS), steps=frames.empty_frame(frames.STEPS),
                 host=frames.empty_frame(frames.HOST), compile=frames.empty_frame(frames.HOST), devices=(),
                 jax_version=None)


def _xprof_stats(trace, warnings: list[str]):
    """XProf's hlo_stats for device-plane traces; CPU traces get none (XProf's tables are empty for them)."""
    from tpudiag.parse import xprof_tools

    if trace.backend not in ("tpu", "gpu"):
        return None
    ids = {p.fingerprint: p.module_id for p in trace.device.programs} if trace.device is not None else None
    try:
        return xprof_tools.hlo_stats(Path(trace.path), ids)
    except Exception as e:  # XProf's C++ converter on an unfamiliar trace must not end the report
        warnings.append(f"XProf's per-op statistics are missing: {type(e).__name__}: {e}")
        return None


def _missing_trace(run: Path, manifest) -> str | None:
    """What of the run's trace is gone, in one line: xplane files its manifest lists, or RUN/trace
    itself although the trace started (a run copied without it, a clean-up that deleted it)."""
    trace_dir = run / rundir.TRACE_DIR
    gone = [run / p for p in (manifest.xplanes or ()) if not (run / p).is_file()]
    if not trace_dir.is_dir() and (gone or manifest.trace_started):
        listed = f"manifest.json lists {len(gone)} trace file(s) in it" if gone else "the program's trace started"
        return f"the trace is missing: {trace_dir} is gone; {listed}"
    if gone:
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        return f"the trace is missing: {gone[0]}{more} (listed in manifest.json) is gone"
    return None


def analyze_run(run: Path, xplane: Path | None = None, manifest=None, compiled=None) -> "ProfileReport":
    """Analyze a run directory from its artifacts (never re-runs the program).

    `xplane`: which of the run's traces to report (default: the last one). `compiled`: the
    `CompileReport` of its `profile --target` compile run, where the caller has built it already
    (default: built here from RUN/tpu/, when the run has one).
    """
    from tpudiag.analyze.hlo.categories import index_module
    from tpudiag.analyze.profile.report import build_profile_report
    from tpudiag.parse.monitoring import read_monitoring
    from tpudiag.parse.xplane import read_xplane

    run = Path(run)
    manifest = manifest or rundir.read_manifest(run)  # read once: a caller that has it passes it
    warnings = []
    xplanes = rundir.find_xplanes(run / rundir.TRACE_DIR)
    if xplane is not None:
        xplanes = [p for p in xplanes if p.resolve() != Path(xplane).resolve()] + [Path(xplane)]
    missing = _missing_trace(run, manifest)
    if missing:
        warnings.append(missing)
    if xplanes:
        trace = read_xplane(xplanes[-1])
        if len(xplanes) > 1:
            warnings.append(f"{len(xplanes)} traces in this run; reporting {xplanes[-1].name}")
        entered, asked, skip = manifest.steps_entered, manifest.steps, manifest.skip or 0
        if asked is not None and entered is not None and entered < skip + asked:
            warnings.append(f"--steps {asked} --skip {skip} asked for more steps than the "
                            f"program ran ({entered}): traced until it ended")
    elif missing:
        trace = empty_trace()  # the warning says why; the run's own steps and reason no longer explain it
    else:
        if manifest.reason:
            why = manifest.reason
        elif manifest.steps is not None:
            why = (f"the program entered {manifest.steps_entered or 0} StepTraceAnnotation steps; "
                   f"--skip {manifest.skip or 0} --steps {manifest.steps} selects none of them")
        else:
            why = "the program never initialized a jax backend, so there was nothing to trace"
        warnings.append(f"no trace was written ({why})")
        trace = empty_trace()
    xprof_stats = _xprof_stats(trace, warnings)
    pids = set(trace.ops["program_id"].unique().tolist())
    modules = hlo_modules(run / rundir.HLO_DIR, pids)
    index = {pid: index_module(m) for pid, m in modules.items()}
    compiles, hits = read_monitoring(run / rundir.MONITORING)
    artifacts = {
        "run_dir": str(run),
        "manifest": rundir.MANIFEST,
        "report": rundir.REPORT,
        "program_log": rundir.PROGRAM_LOG,
        "trace_logdir": rundir.TRACE_DIR,
        # resolved first: the run and its trace may be named one relative, one absolute (the trace
        # path a report prints, given back as `report RUN/trace/...`)
        "xplane": str(xplanes[-1].resolve().relative_to(run.resolve())) if xplanes else None,
        "hlo_dump": rundir.HLO_DIR,
        "ir_dump": rundir.IR_DIR,
    }
    report = build_profile_report(trace, index, compiles, hits, manifest, artifacts, warnings, xprof_stats,
                                  modules=modules, allocated=allocated_bytes(run / rundir.HLO_DIR, pids, warnings),
                                  setup=setup_programs(run / rundir.HLO_DIR, pids))
    if missing and not xplanes and report.reason is None:
        # The header shows the reason beside the status; the status stays the manifest's.
        report = replace(report, reason=missing)
    return with_tpu_section(report, run, compiled)


def with_tpu_section(report, run: Path, compiled=None) -> "ProfileReport":
    """`report` (the run's, analysed) with its `profile --target` section, the TPU estimate beside the
    CPU timeline: from `compiled`, else from RUN/tpu/ where the run has one; else `report` itself."""
    run = Path(run)
    if compiled is None and rundir.is_run_dir(run / rundir.TPU_DIR):
        from tpudiag.api.pipeline import analyze_compile_run

        compiled = analyze_compile_run(run / rundir.TPU_DIR)
    if compiled is None:
        return report
    from tpudiag.analyze.profile.tpu_estimate import build_tpu_estimate

    dev = report.device
    median = dev.in_steps.median.busy_s if dev is not None and dev.in_steps is not None else None
    section = build_tpu_estimate(report.timeline, report.steps.count, compiled, measured_step_s=median,
                                 on_tpu=report.backend == "tpu")
    return report.with_tpu_estimate(section, rundir.TPU_DIR)


def analyze_xplane(path: Path) -> "ProfileReport":
    """Analyze a bare `.xplane.pb` captured elsewhere, without HLO or compile data (one inside a
    tpudiag run is that run's: `load.load_report` gives it `analyze_run(run, xplane)`)."""
    from tpudiag.analyze.profile.report import build_profile_report
    from tpudiag.parse import frames
    from tpudiag.parse.xplane import read_xplane

    path = Path(path)
    trace = read_xplane(path)
    if not len(trace.ops):
        warnings = []
    elif trace.device is not None:  # a TPU trace records each op's category and source line itself
        warnings = ["no HLO dump beside this trace: categories and source lines are the trace's own; "
                    "no fusion analysis, no executed work"]
    else:
        warnings = ["no HLO dump beside this trace: op categories and source lines are unknown"]
    xprof_stats = _xprof_stats(trace, warnings)
    return build_profile_report(trace, {}, frames.empty_frame(frames.COMPILES), 0, None,
                                {"xplane": str(path)}, warnings, xprof_stats)


def write_report(report, run: Path) -> Path:
    """report.json and report.md into the run directory (each written whole, or not at all), as the
    renderer registry renders them."""
    from tpudiag.report.registry import render

    for name, fmt in ((rundir.REPORT, "json"), (rundir.REPORT_MD, "md")):
        rundir.write_text_atomic(Path(run) / name, render(report, fmt))
    return Path(run) / rundir.REPORT


def html_report(report) -> str:
    """The self-contained HTML page (docs/html-report.md) of a profile or compile report; a profile
    page gets one step's timeline (the median step). For `--html FILE` and the CI bundle."""
    from tpudiag.results.profile import ProfileReport
    from tpudiag.analyze.profile.timeline import step_op_rows
    from tpudiag.report.registry import render

    if isinstance(report, ProfileReport):
        return render(report, "html", timeline_rows=step_op_rows(report.timeline,
                                                                 [r.to_dict() for r in report.steps.rows]))
    return render(report, "html")


def write_html(report, path: Path) -> Path:
    """`html_report(report)` written to `path` (whole, or not at all)."""
    check_output_file(path)
    rundir.write_text_atomic(Path(path), html_report(report))
    return Path(path)


def profile(script, args=(), out=None, *, steps=None, skip=0, python_trace=False, target=None,
            static_profile=True, jobs=2, limits=None, progress=None, program_stdout=None, program_stderr=None,
            selection=None,
            while_waiting=None) -> ProfileResult:
    """Run `script` under the profiler, analyze it and write `report.json` into the run directory.

    With `target` (a TPU name such as "v5e"), the run's own jitted computations are then compiled
    for that TPU into RUN/tpu/ and the report gains its `tpu_estimate` section (`profile --target`);
    not when the program failed; a program that a signal stopped and that still exited 0 raises that
    stop instead. `progress` is called with None when that compile starts, then with each compiled
    module. `while_waiting` runs in a thread while the program runs.
    """
    script = Path(script)
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(script))  # before the program runs
    cap = run_program(script, list(args), run, steps=steps, skip=skip, python_trace=python_trace,
                      program_stdout=program_stdout, program_stderr=program_stderr, while_waiting=while_waiting)
    result = finish_capture(cap)
    if target and cap.stop_signal is not None and cap.exit_code == 0:  # it caught the user's stop: no compile
        from tpudiag.capture.workers import stop_exception

        raise stop_exception(cap.stop_signal)
    if target and cap.exit_code == 0:
        from tpudiag.api.compile import shadow_compile_run

        if progress:
            progress(None)
        shadow_compile_run(cap.run_dir, target, static_profile=static_profile, jobs=jobs, limits=limits,
                           progress=progress, selection=selection)
        # The run is analysed once (`finish_capture`, whose report.json stays if the compile fails or
        # is stopped); the TPU section is added from RUN/tpu/ as `tpudiag report RUN` reads it, not from
        # the compile's own report: that one keeps the note of a target typed as one chip, which
        # RUN/tpu/'s manifest does not, and both commands must print the same report.
        report = with_tpu_section(result.report, cap.run_dir)
        write_report(report, cap.run_dir)
        result = ProfileResult(capture=cap, report=report)
    return result


def finish_capture(cap: CaptureResult) -> ProfileResult:
    """Analyze a capture that just ended and write its reports (even when the program failed)."""
    from tpudiag.analyze.profile.report import build_profile_report
    from tpudiag.parse import frames

    try:
        report = analyze_run(cap.run_dir)
    except TpudiagError as e:
        # Analysis of a failed program's partial artifacts must not hide the program's failure.
        if cap.exit_code == 0:
            raise
        report = build_profile_report(empty_trace(), {}, frames.empty_frame(frames.COMPILES), 0,
                                      rundir.read_manifest(cap.run_dir), {"run_dir": str(cap.run_dir)},
                                      [f"analysis failed: {e}"])
    write_report(report, cap.run_dir)
    return ProfileResult(capture=cap, report=report)
