"""`tpudiag compile`, `tpudiag.compile(fn, ...)` and the TPU half of `profile --target`: compile
computations for a TPU target with libtpu's compile-only client on this machine, and build the
compile report from what the workers left.

Reads each module directory a compile worker wrote (optimized HLO, static profile, LLO dump);
returns `CompileResult`s and `CompileReport`s. Each run directory goes through `RunDir`. It does
not render or decide exit codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpudiag.capture import rundir
from tpudiag.capture.rundir import RunDir
from tpudiag.errors import InputError, ProgramFailed, TpudiagError
from tpudiag.outputs import check_run_dir
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file

TPU_DIR = "tpu"  # inside a profile run: the shadow compile of its own computations (`profile --target`)


@dataclass(frozen=True)
class CompileResult:
    run_dir: Path
    report: object  # analyze.compile_report.CompileReport (imported lazily: pandas)


def module_artifacts(mc, with_llo: bool = True):
    """Parse what one compile worker left in its module directory (`ModuleCompile` -> `ModuleArtifacts`).
    `with_llo=False` skips the LLO bundle dump (slot utilization and bundle counts only; no op time
    depends on it), the slowest artifact to read."""
    from tpudiag.analyze.compile.report import ModuleArtifacts
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
        if with_llo and (mc.dir / "llo").is_dir():
            try:
                lframe = llo.read_llo_dump(mc.dir / "llo")
            except TpudiagError as e:
                notes.append(f"LLO bundle dump unreadable, no slot utilization: {e}")
    inputs = sorted(mc.dir.glob("input.*")) if mc.dir.is_dir() else []
    mesh = None
    if inputs and inputs[0].suffix == ".mlir":
        from tpudiag.parse.sdy_mesh import read_mesh

        try:
            mesh = read_mesh(inputs[0].read_text())
        except (OSError, UnicodeDecodeError):  # bytecode, or unreadable: collectives lose their mesh axes
            mesh = None
    return ModuleArtifacts(name=mc.name, status=mc.status, error=mc.error, static_profile=mc.static_profile,
                           result=mc.result, hlo=hlo, static=static, llo=lframe, artifacts_dir=str(mc.dir),
                           notes=tuple(notes), input_file=str(inputs[0]) if inputs else None, mesh=mesh)


def compile_inputs(inputs, run: Path, target, *, static_profile=True, jobs=2, limits=None, progress=None,
                   source: dict | None = None):
    """Compile `ModuleInput`s for `target` into `run/modules/` and build the compile report."""
    from tpudiag.analyze.compile.report import build_compile_report
    from tpudiag.capture.tpu_compile import Limits, compile_modules

    results = compile_modules(inputs, run / "modules", target.topology, static_profile=static_profile,
                              limits=limits or Limits(), jobs=jobs, progress=progress)
    return build_compile_report(target, [module_artifacts(r) for r in results], source or {})


def _write_compile_report(report, rd: RunDir):
    """report.json and report.md of a compile run; returns the report as written (with its artifacts)."""
    from tpudiag.report.compile_markdown import render_compile_markdown

    report = report.with_artifacts({"run_dir": str(rd.path), "report": rundir.REPORT, "modules": "modules"})
    doc = report.to_dict()
    rd.write_json(rundir.REPORT, doc)
    rd.write_text(rundir.REPORT_MD, render_compile_markdown(report))
    return report


def compile_target(target_text: str, input_path, args=(), out=None, *, static_profile=True, jobs=2,
                   limits=None, progress=None, program_stdout=None) -> CompileResult:
    """`tpudiag compile`: a script (run on CPU to collect its computations), a .mlir file or IR dump
    directory, or an HLO text file, compiled for a TPU target on this machine."""
    import os

    from tpudiag.capture.inputs import file_inputs, ir_dump_modules
    from tpudiag.capture.runner import run_program
    from tpudiag.targets import require_libtpu, resolve_target

    target = resolve_target(target_text)
    require_libtpu()
    input_path = Path(input_path)
    is_script = input_path.suffix == ".py"
    if not is_script:
        inputs = file_inputs(input_path)  # validate before creating anything
    elif not input_path.is_file():
        raise InputError(f"{input_path}: no such file")
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(input_path))  # before the script runs
    # The input is in the manifest from its first write, and the shadow run's outcome as soon as it is
    # known: a run that stops later (an unreadable dump, tpudiag killed) still says what it compiled.
    source = {"input": str(input_path), "kind": "script" if is_script else inputs[0].kind}
    with RunDir(run, "compile", rundir.COMPILE_SUBDIRS, program=str(input_path), argv=[str(input_path), *args],
                target=target.to_dict(), static_profile=static_profile, source=source) as rd:
        if is_script:
            from tpudiag.capture.compile_cache import CompileCache

            # As many CPU devices as the slice has, so that the script's own mesh code builds the mesh
            # it would build on the slice (a script that sets its own count keeps it: its flag comes later).
            env = dict(os.environ, JAX_PLATFORMS="cpu")
            env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={target.devices} "
                                + env.get("XLA_FLAGS", "")).strip()
            cache = CompileCache.from_env()
            # The script by its absolute path: the IR records source locations as the script was named,
            # so the same script named from another directory is the same module to the compile cache.
            shadow = run_program(input_path.resolve(), list(args), run / "shadow", trace=False,
                                 env=cache.jax_cpu_env(env) if cache else env, program_stdout=program_stdout,
                                 cluster={"single": True})
            source = {**source, "shadow_run": {"exit_code": shadow.exit_code, "status": shadow.status,
                                               "reason": shadow.reason}}
            rd.update(source=source)
            inputs = ir_dump_modules(run / "shadow" / rundir.IR_DIR)
            if not inputs:
                reason = shadow.reason or "the program compiled no jax computation"
                message = f"{input_path}: {reason}; nothing to compile (run directory {run})"
                rd.finish(False, exit_code=shadow.exit_code or 2, reason=reason)
                raise ProgramFailed(message, shadow.exit_code) if shadow.exit_code else InputError(message)
        report = compile_inputs(inputs, run, target, static_profile=static_profile, jobs=jobs, limits=limits,
                                progress=progress, source=source)
        report = _write_compile_report(report, rd)
        shadow_code = report.shadow_exit_code
        ok = report.status == "ok" and not shadow_code
        rd.finish(ok, exit_code=0 if ok else (shadow_code or 1),
                  reason=(source["shadow_run"]["reason"] if shadow_code
                          else f"{report.totals.failed} module(s) failed to compile"))
    return CompileResult(run_dir=run, report=report)


def compile_run_artifacts(run: Path, with_llo: bool = True, suggestions: bool = True):
    """(each module's parsed artifacts, the compile report built from them) of a compile run: every
    artifact parsed once, never recompiled (`with_llo`: as for `module_artifacts`; `suggestions`: as
    for `build_compile_report`)."""
    from tpudiag.analyze.compile.report import build_compile_report
    from tpudiag.capture.tpu_compile import load_module
    from tpudiag.targets import resolve_target

    run = Path(run)
    manifest = rundir.read_manifest(run)
    target = resolve_target((manifest.target or {}).get("topology", ""))
    mdirs = sorted(p for p in (run / "modules").iterdir() if (p / "module.json").is_file()) \
        if (run / "modules").is_dir() else []
    arts = [module_artifacts(load_module(d), with_llo) for d in mdirs]
    source = dict(manifest.source or {})
    if "input" not in source and manifest.program:  # a run stopped before its manifest had a source
        source["input"] = manifest.program
    report = build_compile_report(target, arts, source, suggestions)
    return arts, report.with_artifacts({"run_dir": str(run), "report": rundir.REPORT, "modules": "modules"})


def analyze_compile_run(run: Path):
    """Re-build a compile run's report from its module directories (never recompiles)."""
    return compile_run_artifacts(run)[1]


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
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(Path(f"{name}.py")))
    source = {"input": f"{name} (Python function)", "kind": "function"}
    with RunDir(run, "compile", rundir.COMPILE_SUBDIRS, program=name, target=tgt.to_dict(), source=source,
                static_profile=static_profile) as rd:
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
        mlir_path = run / f"{name}.mlir"
        mlir_path.write_text(lowered.as_text(debug_info=True))  # debug_info keeps the source lines
        report = compile_inputs([ModuleInput(name=f"jit_{name}", path=mlir_path, kind="mlir")], run, tgt,
                                static_profile=static_profile, jobs=jobs, limits=limits, source=source)
        report = _write_compile_report(report, rd)
        rd.finish(report.status == "ok", reason=f"{report.totals.failed} module(s) failed to compile")
    return CompileResult(run_dir=run, report=report)


def shadow_compile_run(run: Path, target_text: str, *, static_profile=True, jobs=2, limits=None, progress=None):
    """`profile --target`: compile the run's own jitted computations (its JAX IR dump) for a TPU
    into RUN/tpu/, and return the run's report with its `tpu_estimate` section."""
    from tpudiag.api.profiling import analyze_run
    from tpudiag.capture.inputs import ir_dump_modules
    from tpudiag.targets import require_libtpu, resolve_target

    run = Path(run)
    target = resolve_target(target_text)
    require_libtpu()
    inputs = ir_dump_modules(run / rundir.IR_DIR)
    if not inputs:
        raise InputError(f"{run}: the program compiled no jax computation; nothing to compile for {target_text}")
    source = {"input": str(run / rundir.IR_DIR), "kind": "profile_run"}
    with RunDir(run / TPU_DIR, "compile", rundir.COMPILE_SUBDIRS, program=str(run), target=target.to_dict(),
                source=source, static_profile=static_profile) as rd:
        report = compile_inputs(inputs, rd.path, target, static_profile=static_profile, jobs=jobs, limits=limits,
                                progress=progress, source=source)
        report = _write_compile_report(report, rd)
        rd.finish(report.status == "ok", reason=f"{report.totals.failed} module(s) failed to compile")
    return analyze_run(run)
