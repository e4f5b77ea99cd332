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
from tpudiag.errors import InputError, ProgramFailed, TpudiagError
from tpudiag.parse import frames, xprof_tools
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file
from tpudiag.parse.monitoring import read_monitoring
from tpudiag.parse.xplane import Trace, locate_xplane, read_xplane


@dataclass(frozen=True)
class ProfileResult:
    capture: CaptureResult
    report: ProfileReport


def hlo_modules(dump_dir: Path, program_ids: set[int] | None = None) -> dict:
    """{program_id: HloModule} of the after-optimizations HLO in a dump directory."""
    return {pid: read_hlo_file(path) for pid, path in find_optimized_modules(dump_dir).items()
            if program_ids is None or pid in program_ids}


def hlo_index(dump_dir: Path, program_ids: set[int] | None = None) -> dict:
    """{program_id: {op name: OpInfo}} from the after-optimizations HLO in a dump directory."""
    return {pid: index_module(m) for pid, m in hlo_modules(dump_dir, program_ids).items()}


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
    modules = hlo_modules(run / rundir.HLO_DIR, pids)
    index = {pid: index_module(m) for pid, m in modules.items()}
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
    report = build_profile_report(trace, index, compiles, hits, manifest, artifacts, warnings, xprof_stats,
                                  modules=modules)
    if rundir.is_run_dir(run / TPU_DIR):  # `profile --target`: the TPU estimate beside the CPU timeline
        from tpudiag.analyze.tpu_estimate import SECTION, build_tpu_estimate

        compile_doc = analyze_compile_run(run / TPU_DIR).to_dict()
        report.doc[SECTION] = build_tpu_estimate(report.timeline, report.doc["steps"]["count"], compile_doc)
        report.doc["artifacts"]["tpu_compile"] = TPU_DIR
    return report


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


def load_report(target: Path):
    """A run directory (profile or compile), an xprof log directory, or a `.xplane.pb` file."""
    target = Path(target)
    if rundir.is_run_dir(target):
        if rundir.read_manifest(target).get("kind") == "compile":
            return analyze_compile_run(target)
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


def html_report(report) -> str:
    """The self-contained HTML page (docs/html-report.md) of a profile or compile report; a profile
    page gets one step's timeline (the median step). For `--html FILE` and the CI bundle."""
    from tpudiag.analyze.timeline import step_op_rows
    from tpudiag.report.html import render_html

    doc = report.to_dict()
    rows = step_op_rows(report.timeline, doc["steps"]["rows"]) if isinstance(report, ProfileReport) else None
    return render_html(doc, rows)


def write_html(report, path: Path) -> Path:
    """`html_report(report)` written to `path` (whole, or not at all)."""
    rundir.write_text_atomic(Path(path), html_report(report))
    return Path(path)


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


# ---------------------------------------------------------------- compile for a TPU target


@dataclass(frozen=True)
class CompileResult:
    run_dir: Path
    report: object  # analyze.compile_report.CompileReport (imported lazily: pandas)


def _module_artifacts(mc):
    """Parse what one worker left in its module directory."""
    from tpudiag.analyze.compile_report import ModuleArtifacts
    from tpudiag.parse import llo

    hlo = static = lframe = None
    notes = []
    if mc.status == "ok":
        # XLA's own dump keeps each custom call's backend config (a Pallas kernel's CostEstimate
        # lives there); the executable's to_string() drops it. Older runs have only the latter.
        dumped = list(find_optimized_modules(mc.dir / "hlo").values()) if (mc.dir / "hlo").is_dir() else []
        hlo = read_hlo_file(dumped[0] if len(dumped) == 1 else mc.dir / "optimized.hlo.txt")
        # The compiler's side dumps enrich the report; one it wrote in a shape we do not read
        # costs that module its cycles or utilization, not the whole report.
        if (mc.dir / "static_profile").is_dir():
            try:
                static = llo.read_static_profiles(mc.dir / "static_profile")
            except TpudiagError as e:
                notes.append(f"static cycle profile unreadable, op times are roofline floors: {e}")
        if (mc.dir / "llo").is_dir():
            try:
                lframe = llo.read_llo_dump(mc.dir / "llo")
            except TpudiagError as e:
                notes.append(f"LLO bundle dump unreadable, no slot utilization: {e}")
    return ModuleArtifacts(name=mc.name, status=mc.status, error=mc.error, static_profile=mc.static_profile,
                           result=mc.result, hlo=hlo, static=static, llo=lframe, artifacts_dir=str(mc.dir),
                           notes=tuple(notes))


def compile_inputs(inputs, run: Path, target, *, static_profile=True, jobs=2, limits=None, progress=None,
                   source: dict | None = None):
    """Compile `ModuleInput`s for `target` into `run/modules/` and build the compile report."""
    from tpudiag.analyze.compile_report import build_compile_report
    from tpudiag.capture.tpu_compile import Limits, compile_modules

    results = compile_modules(inputs, run / "modules", target.topology, static_profile=static_profile,
                              limits=limits or Limits(), jobs=jobs, progress=progress)
    return build_compile_report(target, [_module_artifacts(r) for r in results], source or {})


def compile_target(target_text: str, input_path, args=(), out=None, *, static_profile=True, jobs=2,
                   limits=None, progress=None, program_stdout=None) -> CompileResult:
    """`tpudiag compile`: a script (run on CPU to collect its computations), a .mlir file or IR dump
    directory, or an HLO text file, compiled for a TPU target on this machine."""
    import os
    import time

    from tpudiag.capture.inputs import file_inputs, ir_dump_modules
    from tpudiag.targets import require_libtpu, resolve_target

    target = resolve_target(target_text)
    require_libtpu()
    input_path = Path(input_path)
    is_script = input_path.suffix == ".py"
    if not is_script:
        inputs = file_inputs(input_path)  # validate before creating anything
    elif not input_path.is_file():
        raise InputError(f"{input_path}: no such file")
    run = Path(out) if out else rundir.default_run_dir(input_path)
    rundir.create_run_dir(run, rundir.COMPILE_SUBDIRS)
    t0 = time.perf_counter()
    manifest = {"schema": rundir.MANIFEST_SCHEMA, "kind": "compile", "status": "running",
                "program": str(input_path), "argv": [str(input_path), *args], "target": target.to_dict(),
                "static_profile": static_profile, "versions": _versions(), "exit_code": None, "reason": None}
    rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
    source = {"input": str(input_path), "kind": "script" if is_script else inputs[0].kind}
    if is_script:
        shadow = run_program(input_path, list(args), run / "shadow", trace=False,
                             env=dict(os.environ, JAX_PLATFORMS="cpu"), program_stdout=program_stdout)
        source["shadow_run"] = {"exit_code": shadow.exit_code, "status": shadow.status, "reason": shadow.reason}
        inputs = ir_dump_modules(run / "shadow" / rundir.IR_DIR)
        if not inputs:
            manifest.update(status="failed", exit_code=shadow.exit_code or 2,
                            reason=shadow.reason or "the program compiled no jax computation")
            rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
            message = f"{input_path}: {manifest['reason']}; nothing to compile (run directory {run})"
            raise ProgramFailed(message, shadow.exit_code) if shadow.exit_code else InputError(message)
    manifest["source"] = source
    rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
    try:
        report = compile_inputs(inputs, run, target, static_profile=static_profile, jobs=jobs, limits=limits,
                                progress=progress, source=source)
        doc = _write_compile_report(report, run)
    except BaseException as e:  # no report: the manifest must not stay "running"
        manifest.update(status="failed", exit_code=getattr(e, "exit_code", 1), reason=f"tpudiag failed: {e}"[:300])
        rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
        raise
    shadow_code = source.get("shadow_run", {}).get("exit_code") or 0
    ok = doc["status"] == "ok" and not shadow_code
    manifest.update(status="ok" if ok else "failed", exit_code=0 if ok else (shadow_code or 1),
                    reason=None if ok else (source["shadow_run"]["reason"] if shadow_code
                                            else f"{doc['totals']['failed']} module(s) failed to compile"),
                    wall_s=round(time.perf_counter() - t0, 6))
    rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
    return CompileResult(run_dir=run, report=report)


def _write_compile_report(report, run: Path) -> dict:
    from tpudiag.report.compile_markdown import render_compile_markdown

    doc = report.to_dict()
    doc["artifacts"] = {"run_dir": str(run), "report": rundir.REPORT, "modules": "modules"}
    rundir.write_json_atomic(run / rundir.REPORT, doc)
    rundir.write_text_atomic(run / rundir.REPORT_MD, render_compile_markdown(doc))
    return doc


def analyze_compile_run(run: Path):
    """Re-build a compile run's report from its module directories (never recompiles)."""
    from tpudiag.analyze.compile_report import build_compile_report
    from tpudiag.capture.tpu_compile import load_module
    from tpudiag.targets import resolve_target

    run = Path(run)
    manifest = rundir.read_manifest(run)
    target = resolve_target(manifest["target"]["topology"])
    mdirs = sorted(p for p in (run / "modules").iterdir() if (p / "module.json").is_file()) \
        if (run / "modules").is_dir() else []
    report = build_compile_report(target, [_module_artifacts(load_module(d)) for d in mdirs],
                                  manifest.get("source", {}))
    report.doc["artifacts"] = {"run_dir": str(run), "report": rundir.REPORT, "modules": "modules"}
    return report


def _versions() -> dict:
    from tpudiag.capture.versions import tool_versions

    return tool_versions()


def compile_function(fn, *args, target: str = "v5e", out=None, static_profile: bool = True, jobs: int = 2,
                     limits=None) -> CompileResult:
    """`tpudiag.compile(fn, *args, target="v5e")`: lower `fn` for TPU here, compile it in a worker.

    `args` are arrays or `jax.ShapeDtypeStruct`s (shapes are all that matter). The run directory
    (default `tpudiag-runs/<timestamp>-<fn name>`) holds the same artifacts as `tpudiag compile`.
    """
    import jax

    from tpudiag.capture.tpu_compile import ModuleInput
    from tpudiag.targets import require_libtpu, resolve_target

    tgt = resolve_target(target)
    require_libtpu()
    name = getattr(fn, "__name__", "fn")
    run = Path(out) if out else rundir.default_run_dir(Path(f"{name}.py"))
    rundir.create_run_dir(run, rundir.COMPILE_SUBDIRS)
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    mlir_path = run / f"{name}.mlir"
    mlir_path.write_text(lowered.as_text(debug_info=True))  # debug_info keeps the source lines
    source = {"input": f"{name} (Python function)", "kind": "function"}
    rundir.write_json_atomic(run / rundir.MANIFEST, {
        "schema": rundir.MANIFEST_SCHEMA, "kind": "compile", "status": "running", "program": name,
        "target": tgt.to_dict(), "source": source, "versions": _versions()})
    report = compile_inputs([ModuleInput(name=f"jit_{name}", path=mlir_path, kind="mlir")], run, tgt,
                            static_profile=static_profile, jobs=jobs, limits=limits, source=source)
    _write_compile_report(report, run)
    manifest = rundir.read_manifest(run)
    manifest.update(status="ok" if report.doc["status"] == "ok" else "failed")
    rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
    return CompileResult(run_dir=run, report=report)


TPU_DIR = "tpu"  # inside a profile run: the shadow compile of its own computations (`profile --target`)


def shadow_compile_run(run: Path, target_text: str, *, static_profile=True, jobs=2, limits=None, progress=None):
    """`profile --target`: compile the run's own jitted computations (its JAX IR dump) for a TPU
    into RUN/tpu/, and add the `tpu_estimate` section to the run's report."""
    from tpudiag.capture.inputs import ir_dump_modules
    from tpudiag.targets import require_libtpu, resolve_target

    run = Path(run)
    target = resolve_target(target_text)
    require_libtpu()
    inputs = ir_dump_modules(run / rundir.IR_DIR)
    if not inputs:
        raise InputError(f"{run}: the program compiled no jax computation; nothing to compile for {target_text}")
    tdir = run / TPU_DIR
    rundir.create_run_dir(tdir, rundir.COMPILE_SUBDIRS)
    source = {"input": str(run / rundir.IR_DIR), "kind": "profile_run"}
    rundir.write_json_atomic(tdir / rundir.MANIFEST, {
        "schema": rundir.MANIFEST_SCHEMA, "kind": "compile", "status": "running", "program": str(run),
        "target": target.to_dict(), "source": source, "static_profile": static_profile, "versions": _versions()})
    report = compile_inputs(inputs, tdir, target, static_profile=static_profile, jobs=jobs, limits=limits,
                            progress=progress, source=source)
    _write_compile_report(report, tdir)
    manifest = rundir.read_manifest(tdir)
    manifest.update(status="ok" if report.doc["status"] == "ok" else "failed")
    rundir.write_json_atomic(tdir / rundir.MANIFEST, manifest)
    return analyze_run(run)


# ---------------------------------------------------------------- HLO: fusions and diffs


@dataclass(frozen=True)
class LoadedModule:
    """An optimized HLO module with the time of each of its instructions, where the run has them."""

    module: object  # parse.hlo.HloModule
    times: dict[str, float] | None  # instruction name -> seconds (measured self time or TPU estimate)
    time_source: str | None  # "measured" | "estimated" | None


def load_hlo_modules(path: Path, module_name: str | None = None) -> list[LoadedModule]:
    """The optimized HLO modules behind PATH: an HLO text file, an XLA dump directory, a profile run
    (with measured op times) or a compile run (with estimated TPU op times). `module_name` keeps the
    modules whose name contains it."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    found: list[LoadedModule] = []
    if path.is_file():
        found = [LoadedModule(read_hlo_file(path), None, None)]
    elif rundir.is_run_dir(path) and rundir.read_manifest(path).get("kind") == "compile":
        doc = analyze_compile_run(path).to_dict()
        for m in doc["modules"]:
            if m["status"] == "ok":
                times = {o["name"]: o["estimated_s"] for o in m["ops"]}
                found.append(LoadedModule(read_hlo_file(Path(m["artifacts"]) / "optimized.hlo.txt"), times,
                                          "estimated"))
    elif rundir.is_run_dir(path):
        report = analyze_run(path)
        tl = report.timeline
        for pid, hpath in sorted(find_optimized_modules(path / rundir.HLO_DIR).items()):
            sel = tl[tl["program_id"] == pid]
            times = {op: ns * 1e-9 for op, ns in sel.groupby("op")["self_ns"].sum().items()} if len(sel) else None
            found.append(LoadedModule(read_hlo_file(hpath), times, "measured" if times else None))
    else:
        mods = find_optimized_modules(path)
        if not mods:
            raise InputError(f"{path}: no optimized HLO here (expected an HLO file, an XLA dump directory, "
                             "or a tpudiag run)")
        found = [LoadedModule(read_hlo_file(p), None, None) for _, p in sorted(mods.items())]
    if module_name:
        keep = [m for m in found if module_name in m.module.name]
        if not keep:
            names = ", ".join(sorted({m.module.name for m in found}))
            raise InputError(f"{path}: no module named like {module_name!r} (modules: {names})")
        found = keep
    if not found:
        raise InputError(f"{path}: no optimized HLO module to read (a compile run whose modules all failed, "
                         "or a run without HLO dumps)")
    return found


def fusion_reports(path: Path, module_name: str | None = None) -> list[dict]:
    """`tpudiag fusions`: one tpudiag.fusions/1 document per module."""
    from tpudiag.analyze.fusions import build_fusion_report

    return [build_fusion_report(m.module, m.times, m.time_source).to_dict()
            for m in load_hlo_modules(path, module_name)]


def hlo_diff(path_a: Path, path_b: Path, module_name: str | None = None) -> dict:
    """`tpudiag hlo-diff A B`: one module from each side, matched structurally."""
    from tpudiag.analyze.hlo_diff import diff_modules

    sides = []
    for path in (path_a, path_b):
        mods = load_hlo_modules(path, module_name)
        if len(mods) > 1:
            names = ", ".join(m.module.name for m in mods)
            raise InputError(f"{path}: {len(mods)} modules; pick one with --module (modules: {names})")
        sides.append(mods[0])
    return diff_modules(sides[0].module, sides[1].module, sides[0].times, sides[1].times)


# ---------------------------------------------------------------- compare two runs


def load_for_compare(path: Path) -> dict:
    """`tpudiag compare`'s input: a run directory (re-analyzed, as `tpudiag report` does; profile or
    compile) or a report JSON file (`tpudiag.report/1` or `tpudiag.compile/1`, read as written)."""
    import json

    from tpudiag.analyze.compare import COMPILE_SCHEMA, PROFILE_SCHEMA
    from tpudiag.errors import ParseError

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir():
        return load_report(path).to_dict()
    try:
        doc = json.loads(path.read_bytes())
    except json.JSONDecodeError as e:
        raise ParseError(path, f"not a JSON report: {e.msg}", line=e.lineno) from None
    except UnicodeDecodeError:
        raise ParseError(path, "not a JSON report: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema not in (PROFILE_SCHEMA, COMPILE_SCHEMA):
        raise InputError(f"{path}: not a tpudiag profile or compile report (schema {schema!r}; expected "
                         f"{PROFILE_SCHEMA} or {COMPILE_SCHEMA})")
    return doc


# ---------------------------------------------------------------- export


def perfetto_export(run: Path, out: Path) -> dict:
    """`tpudiag export RUN --perfetto FILE`: the run's op timeline as a Chrome JSON trace for Perfetto.
    Returns {"path", "events", "bytes"}."""
    from tpudiag.report.perfetto import dump_perfetto, render_perfetto

    report = load_report(run)
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
