"""`tpudiag compile`, `tpudiag.compile(fn, ...)` and the TPU half of `profile --target`: compile
computations for a TPU target with libtpu's compile-only client on this machine, into a compile run.

Collects the modules to compile (a script's shadow CPU run, an IR dump or HLO file, a function
lowered by `capture/lower.py`, a profile run's IR dump), has `pipeline.compile_inputs` compile them
and build the `CompileReport`, and writes the run's report. Each run directory goes through
`RunDir`. It does not render or decide exit codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpudiag.api.pipeline import compile_artifacts, compile_inputs
from tpudiag.capture import rundir
from tpudiag.capture.rundir import RunDir
from tpudiag.errors import InputError, ProgramFailed
from tpudiag.outputs import check_run_dir


@dataclass(frozen=True)
class CompileResult:
    run_dir: Path
    report: object  # results.compile.CompileReport


def write_compile_report(report, rd: RunDir):
    """report.json and report.md of a compile run; returns the report as written (with its artifacts)."""
    from tpudiag.report.registry import render

    report = report.with_artifacts(compile_artifacts(rd.path))
    rd.update(source=report.source)  # what was left out (setup modules, a selection), for `tpudiag report RUN`
    for name, fmt in ((rundir.REPORT, "json"), (rundir.REPORT_MD, "md")):
        rd.write_text(name, render(report, fmt))
    return report


def compile_target(target_text: str, input_path, args=(), out=None, *, static_profile=True, jobs=2,
                   limits=None, progress=None, program_stdout=None, selection=None,
                   group_setup: bool = True) -> CompileResult:
    """`tpudiag compile`: a script (run on CPU to collect its computations), a .mlir file or IR dump
    directory, or an HLO text file, compiled for a TPU target on this machine. `selection` (a
    `capture.select.Selection`) compiles some of its modules; `group_setup`: leave setup modules
    out (`compile_inputs`'s `skip_setup`); False compiles every module in its own worker."""
    import os

    from tpudiag.capture.inputs import file_inputs, ir_dump_modules
    from tpudiag.capture.runner import run_program
    from tpudiag.targets import require_libtpu, resolve_target

    target = resolve_target(target_text)
    require_libtpu()
    input_path = Path(input_path)
    is_script = input_path.suffix == ".py"
    if not is_script:
        from tpudiag.capture.select import Selection, pick

        inputs = file_inputs(input_path)  # validate before creating anything
        pick([i.name for i in inputs], selection or Selection(), str(input_path))
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
            shadow = run_program(input_path.resolve(), list(args), run / rundir.SHADOW_DIR, trace=False,
                                 env=cache.jax_cpu_env(env) if cache else env, program_stdout=program_stdout,
                                 cluster={"single": True})
            source = {**source, "shadow_run": {"exit_code": shadow.exit_code, "status": shadow.status,
                                               "reason": shadow.reason}}
            rd.update(source=source)
            if shadow.stop_signal is not None:  # stopped by the user, not failed: compile nothing more
                from tpudiag.capture.workers import stop_exception

                raise stop_exception(shadow.stop_signal)
            inputs = ir_dump_modules(run / rundir.SHADOW_DIR / rundir.IR_DIR)
            if not inputs:
                reason = shadow.reason or "the program compiled no jax computation"
                message = f"{input_path}: {reason}; nothing to compile (run directory {run})"
                rd.finish(False, exit_code=shadow.exit_code or 2, reason=reason)
                raise ProgramFailed(message, shadow.exit_code) if shadow.exit_code else InputError(message)
        report = compile_inputs(inputs, run, target, static_profile=static_profile, jobs=jobs, limits=limits,
                                progress=progress, source=source, selection=selection, group_setup=group_setup,
                                skip_setup=group_setup)
        report = write_compile_report(report, rd)
        shadow_code = report.shadow_exit_code
        ok = report.status == "ok" and not shadow_code
        rd.finish(ok, exit_code=0 if ok else (shadow_code or 1),
                  reason=(source["shadow_run"]["reason"] if shadow_code
                          else f"{report.totals.failed} module(s) failed to compile"))
    return CompileResult(run_dir=run, report=report)


def compile_function(fn, *args, target: str = "v5e", out=None, static_profile: bool = True, jobs: int = 2,
                     limits=None) -> CompileResult:
    """`tpudiag.compile(fn, *args, target="v5e")`: lower `fn` for TPU here, compile it in a worker.

    `args` are arrays or `jax.ShapeDtypeStruct`s (shapes are all that matter). The run directory
    (default `tpudiag-runs/<timestamp>-<fn name>`) holds the same artifacts as `tpudiag compile`.
    """
    from tpudiag.capture.lower import lower_for_tpu
    from tpudiag.capture.tpu_compile import ModuleInput
    from tpudiag.targets import require_libtpu, resolve_target

    tgt = resolve_target(target)
    require_libtpu()
    name = getattr(fn, "__name__", "fn")
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(Path(f"{name}.py")))
    source = {"input": f"{name} (Python function)", "kind": "function"}
    with RunDir(run, "compile", rundir.COMPILE_SUBDIRS, program=name, target=tgt.to_dict(), source=source,
                static_profile=static_profile) as rd:
        mlir_path = lower_for_tpu(fn, args, run / f"{name}.mlir")  # with debug info: the source lines
        report = compile_inputs([ModuleInput(name=f"jit_{name}", path=mlir_path, kind="mlir")], run, tgt,
                                static_profile=static_profile, jobs=jobs, limits=limits, source=source)
        report = write_compile_report(report, rd)
        rd.finish(report.status == "ok", reason=f"{report.totals.failed} module(s) failed to compile")
    return CompileResult(run_dir=run, report=report)


def shadow_compile_run(run: Path, target_text: str, *, static_profile=True, jobs=2, limits=None, progress=None,
                       selection=None):
    """`profile --target`: compile the run's own jitted computations (its JAX IR dump) for a TPU
    into RUN/tpu/ and write its report there; returns that `CompileReport`."""
    from tpudiag.capture.inputs import ir_dump_modules
    from tpudiag.targets import require_libtpu, resolve_target

    run = Path(run)
    target = resolve_target(target_text)
    require_libtpu()
    inputs = ir_dump_modules(run / rundir.IR_DIR)
    if not inputs:
        raise InputError(f"{run}: the program compiled no jax computation; nothing to compile for {target_text}")
    source = {"input": str(run / rundir.IR_DIR), "kind": "profile_run"}
    with RunDir(run / rundir.TPU_DIR, "compile", rundir.COMPILE_SUBDIRS, program=str(run), target=target.to_dict(),
                source=source, static_profile=static_profile) as rd:
        report = compile_inputs(inputs, rd.path, target, static_profile=static_profile, jobs=jobs, limits=limits,
                                progress=progress, source=source, selection=selection)
        report = write_compile_report(report, rd)
        rd.finish(report.status == "ok", reason=f"{report.totals.failed} module(s) failed to compile")
    return report
