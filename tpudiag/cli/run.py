"""`tpudiag profile` and `tpudiag compile`: the commands that run something and write a run directory.

Options in, one api call, `emit` out, and the outcome as an exception `main()` maps to an exit code.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import click

from tpudiag.cli.common import (FiniteFloat, cache_options, calibration_choice, calibration_options, check_outputs,
                                check_versions, ci_budget, ci_options,
                                compile_timeout_option, debug_on, emit, force_option, output_format, output_options,
                                program_args, progress, selection, selection_options, static_limits,
                                static_profile_options, step_compile_timeout_option, use_cache_options,
                                write_ci_bundle)
from tpudiag.cli.group import cli
from tpudiag.errors import GateFailed, NothingTraced, ProgramFailed, UsageError

_PASS_THROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": True}


class PassThroughCommand(click.Command):
    """A command whose unknown options go to the program (`ignore_unknown_options`): tpudiag's own
    options may follow SCRIPT, and the program's too. Before SCRIPT, though, an option tpudiag does
    not know is a typo (`--stpes 1 train.py`), not the program's: click would take it for SCRIPT
    itself ("--stpes: no such file"), so it is refused here by name."""

    def parse_args(self, ctx, args):
        unknown = None if ctx.resilient_parsing else self._unknown_before_script(ctx, args)
        if unknown:
            names = sorted({n for p in self.get_params(ctx) if isinstance(p, click.Option)
                            for n in (*p.opts, *p.secondary_opts) if n.startswith("--")})
            close = difflib.get_close_matches(unknown.split("=", 1)[0], names, n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"no such option: {unknown} ({hint}tpudiag's options: {', '.join(names)}; "
                             f"the program's own options go after the script and --)")
        return super().parse_args(ctx, args)

    def _unknown_before_script(self, ctx, args) -> str | None:
        """The first option-looking argument before the first positional one that is not one of
        this command's options, skipping the values of the options that take one."""
        takes_value = {}
        for p in self.get_params(ctx):
            if isinstance(p, click.Option):
                for name in (*p.opts, *p.secondary_opts):
                    takes_value[name] = not (p.is_flag or p.count)
        it = iter(args)
        for arg in it:
            if arg == "--" or not arg.startswith("-") or arg == "-":
                return None  # SCRIPT (or `--`, after which everything is positional)
            name = arg.split("=", 1)[0]
            if name not in takes_value:
                return arg
            if takes_value[name] and "=" not in arg:
                next(it, None)
        return None


@cli.command(cls=PassThroughCommand, context_settings=_PASS_THROUGH)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default tpudiag-runs/<timestamp>-<script>). Never overwritten.")
@click.option("--steps", type=int, default=None,
              help="Trace only N jax.profiler.StepTraceAnnotation steps (default: trace the whole run).")
@click.option("--skip", type=int, default=0, show_default=True, help="With --steps: steps to run untraced first.")
@click.option("--python-trace", is_flag=True, help="Also record every Python call (slow: 2-5x).")
@click.option("--processes", type=click.IntRange(1, 64), default=None,
              help="Run N processes of the program as one JAX job (jax.distributed on this machine, CPU "
                   "collectives through gloo) and report their collectives across processes.")
@click.option("--devices-per-process", type=click.IntRange(1, 512), default=None,
              help="With --processes: CPU devices each process gets (--xla_force_host_platform_device_count).")
@click.option("--process-timeout", type=FiniteFloat(0, min_open=True), default=None,
              help="With --processes: seconds the job may run; then every process is stopped (exit 124).")
@click.option("--coordinator-port", type=click.IntRange(1, 65535), default=None,
              help="With --processes: the coordinator's port (default: a free one; a taken one is retried).")
@click.option("--target", "target_text", default=None,
              help="Also compile the program's computations for this TPU (v5e, v6e:2x2, ...) and show "
                   "the estimated TPU time beside the measured one.")
@click.option("--no-static-profile", is_flag=True, help="With --target: skip the static cycle profile.")
@static_profile_options(120)
@compile_timeout_option
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write a self-contained HTML report here (.html; no script; opens offline).")
@force_option("--html")
@cache_options
@ci_options
@output_options("tpudiag.report/1")
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def profile(out, steps, skip, python_trace, processes, devices_per_process, process_timeout, coordinator_port,
            target_text, no_static_profile, timeout_s, static_memory_gib, compile_timeout_s, html_path, force,
            ci, max_artifact_mb, as_json, as_md, no_color, width, script, args, cache_dir, no_cache):
    """Run SCRIPT [ARGS...] under the profiler and report where its time went.

    tpudiag's options may come before or after SCRIPT; the program's own arguments go after `--`
    (`tpudiag profile train.py --target v5e -- --steps 5`). Options tpudiag does not know are
    passed to the program too when they follow SCRIPT (before it, they are an error). The run
    directory holds the trace (open it with `xprof --logdir RUN/trace`), the HLO and IR dumps, the
    program's log, manifest.json, report.json and report.md.
    """
    import importlib

    from tpudiag import api
    from tpudiag.config import DEFAULT_CONFIG

    fmt = output_format(as_json, as_md)
    if skip and steps is None:
        raise UsageError("--skip needs --steps")
    if processes is None:
        for name, value in (("--devices-per-process", devices_per_process), ("--process-timeout", process_timeout),
                            ("--coordinator-port", coordinator_port)):
            if value is not None:
                raise UsageError(f"{name} needs --processes")
    elif target_text:
        raise UsageError("--target and --processes do not go together: compile a sharded program with "
                         "`tpudiag compile --target v5p:4x4x4 SCRIPT`")
    ci_mb = ci_budget(ci, max_artifact_mb)
    check_outputs(out, html=html_path, force=force)  # before the program runs (default run directory: api.profile)
    check_versions()
    use_cache_options(cache_dir, no_cache)
    if target_text:
        from tpudiag.targets import resolve_target

        resolve_target(target_text)  # a bad target fails before the program runs
    if processes is not None:
        _profile_processes(script, args, out, fmt, processes=processes, devices_per_process=devices_per_process,
                           job_wall_s=process_timeout, coordinator_port=coordinator_port, steps=steps, skip=skip,
                           python_trace=python_trace, html_path=html_path, ci_mb=ci_mb, no_color=no_color,
                           width=width)
        return
    progress_cb, stop = progress() if target_text else (None, lambda: None)
    try:
        # With --json/--md, stdout is exactly the report: the program's stdout goes to stderr (and the
        # log). The analysis stack is imported while the program runs (pandas alone is ~0.7 s).
        result = api.profile(script, program_args(args), out, steps=steps, skip=skip, python_trace=python_trace,
                             target=target_text, static_profile=not no_static_profile, progress=progress_cb,
                             limits=static_limits(timeout_s, static_memory_gib, compile_timeout_s),
                             program_stdout=sys.stderr.buffer if fmt != "text" else None,
                             while_waiting=lambda: importlib.import_module("tpudiag.analyze.profile.report"))
    finally:
        stop()
    if html_path:
        api.write_html(result.report, html_path)
    emit(result.report, fmt, no_color=no_color, width=width, top=DEFAULT_CONFIG.top_ops,
         top_compiles=DEFAULT_CONFIG.top_compiles)
    cap = result.capture
    if ci_mb is not None:  # also for a failed program: that is when the artifacts matter most
        write_ci_bundle(cap.run_dir, ci_mb, result.report, program_failed=cap.exit_code != 0)
    if cap.exit_code != 0:
        raise ProgramFailed(f"the program failed ({cap.reason}); what was captured is in {cap.run_dir}", cap.exit_code)
    report = result.report
    if not report.artifacts.get("xplane"):
        raise NothingTraced(f"nothing was traced: {report.warnings[0] if report.warnings else 'no trace'}")
    if fmt == "text":
        from tpudiag.report.next_steps import TERMS, next_steps

        lines = next_steps(report, str(script), tuple(args), steps, skip)
        if lines:
            click.echo("\nNext:")
            for line in lines:
                click.echo(f"  - {line}")
            click.echo(f"Terms: {TERMS}")


def _profile_processes(script, args, out, fmt, *, processes, devices_per_process, job_wall_s, coordinator_port, steps,
                       skip, python_trace, html_path, ci_mb, no_color, width) -> None:
    """`profile --processes N`: the job, its cross-process report, the outcome as an exit code."""
    import importlib

    from tpudiag import api

    cap, report = api.profile_processes(
        script, program_args(args), out, processes=processes, devices_per_process=devices_per_process,
        job_wall_s=job_wall_s, steps=steps, skip=skip, python_trace=python_trace, coordinator_port=coordinator_port,
        program_stdout=sys.stderr.buffer if fmt != "text" else None,
        while_waiting=lambda: importlib.import_module("tpudiag.analyze.distributed.collectives"))
    if html_path:
        api.write_html(report, html_path)
    emit(report, fmt, no_color=no_color, width=width)
    if ci_mb is not None:
        write_ci_bundle(cap.run_dir, ci_mb, report, program_failed=cap.exit_code != 0)
    if cap.exit_code != 0:
        raise ProgramFailed(f"{cap.reason}; what was captured is in {cap.run_dir}", cap.exit_code)
    if not report.processes:
        raise NothingTraced(f"nothing was traced: {report.warnings[0] if report.warnings else 'no trace'}")


@cli.command(name="compile", cls=PassThroughCommand, context_settings=_PASS_THROUGH)
@click.option("--target", "target_text", required=True, help="TPU target: v4, v5e, v5p, v6e, tpu7x, or a topology (v5e:2x4).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default tpudiag-runs/<timestamp>-<input>). Never overwritten.")
@click.option("--no-static-profile", is_flag=True,
              help="Skip the TPU compiler's static cycle profile (much faster; roofline estimates only).")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True, help="Modules compiled at once.")
@static_profile_options(120)
@compile_timeout_option
@selection_options
@click.option("--each-module", is_flag=True,
              help="Compile every module in its own worker with the static profile, setup modules too (by "
                   "default a script's modules with no matmul, kernel, sort, scatter or collective and small "
                   "arguments are left out, and named on one line).")
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True, help="Ops shown per module.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write a self-contained HTML report here (.html; no script; opens offline).")
@force_option("--html")
@cache_options
@ci_options
@output_options("tpudiag.compile/1")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def compile_(target_text, out, no_static_profile, jobs, timeout_s, static_memory_gib, compile_timeout_s, functions,
             modules, each_module, top, html_path, force, ci, max_artifact_mb, as_json, as_md, no_color, width,
             input_path, args, cache_dir, no_cache):
    """Compile INPUT for a TPU generation on this machine and report the TPU compiler's own estimates.

    INPUT is a Python script (run on CPU; every jitted computation it ran is compiled; ARGS go to
    it), a StableHLO .mlir file or JAX IR dump directory (JAX_DUMP_IR_TO), or an HLO text file.
    """
    fmt = output_format(as_json, as_md)
    ci_mb = ci_budget(ci, max_artifact_mb)
    check_outputs(out, html=html_path, force=force)  # before anything runs or compiles
    check_versions()
    use_cache_options(cache_dir, no_cache)
    from tpudiag.targets import require_libtpu, resolve_target

    resolve_target(target_text)  # a bad target or a missing libtpu fails before anything runs
    require_libtpu()
    args = program_args(args)
    if args and input_path.suffix != ".py":
        raise UsageError(f"{input_path}: program arguments are only for a .py script")
    from tpudiag import api

    progress_cb, stop = progress()
    try:
        result = api.compile_target(target_text, input_path, args, out, static_profile=not no_static_profile,
                                    jobs=jobs, limits=static_limits(timeout_s, static_memory_gib, compile_timeout_s),
                                    progress=progress_cb, selection=selection(functions, modules),
                                    group_setup=not each_module,
                                    program_stdout=sys.stderr.buffer if fmt != "text" else None)
    finally:
        stop()
    report = result.report
    if html_path:
        api.write_html(report, html_path)
    emit(report, fmt, no_color=no_color, width=width, top=top)
    shadow = report.source.get("shadow_run") or {}
    if ci_mb is not None:
        write_ci_bundle(result.run_dir, ci_mb, report, program_failed=bool(report.shadow_exit_code) or report.status != "ok")
    if report.shadow_exit_code:  # the script failed: what it ran before failing was still compiled
        raise ProgramFailed(f"the program failed ({shadow['reason']}); the {len(report.modules)} computation(s) "
                            f"it ran before that were compiled; run directory {result.run_dir}",
                            report.shadow_exit_code)
    if debug_on():  # libtpu's own output is kept out of the way, not thrown away
        for m in report.modules:
            click.echo(f"tpudiag: {m.name}: TPU compiler log in {m.artifacts}/compile.log", err=True)
    if report.failed_modules:
        first = report.failed_modules[0]
        raise GateFailed(f"{len(report.failed_modules)} of {len(report.modules)} module(s) failed to compile for "
                         f"{report.target.topology} (first: {first.name}: {first.error})")


@cli.command(cls=PassThroughCommand, context_settings=_PASS_THROUGH)
@click.option("--target", "target_text", required=True,
              help="TPU slice: v6e-256, v5e:16x16, v5p:8x8x8, ... (tpudiag targets).")
@click.option("--mesh", "mesh_text", default=None,
              help="Mesh axes and sizes, e.g. fsdp=64,tensor=4 (default: every device on one fsdp axis).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default tpudiag-runs/<timestamp>-<file>). Never overwritten.")
@click.option("--static-profile", is_flag=True,
              help="Also ask for the TPU compiler's static cycle profile (slow at scale; default off).")
@step_compile_timeout_option("CPU seconds the step's compile (without the static profile) may take.")
@click.option("--no-matmul-probes", "no_probes", is_flag=True,
              help="Take compute-bound matmuls at the MXU peak instead of timing them by the compiler: each "
                   "distinct one alone with its static profile (v5e, v5p, v6e, TPU7x, without --static-profile), "
                   "the rest by the cycles its convolution cost model recorded in the step's HLO.")
@click.option("--max-probes", type=click.IntRange(1, 256), default=16, show_default=True,
              help="Distinct matmuls timed alone, the largest share of the step first; the rest by the cost "
                   "model. Each takes seconds to a minute of compile.")
@calibration_options
@static_profile_options(300)
@cache_options
@output_options("tpudiag.estimate/1")
@click.argument("entry", metavar="FILE.py:FUNC|maxtext:MODEL")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def estimate(target_text, mesh_text, out, static_profile, no_probes, compile_timeout_s, max_probes, calibration_file,
             no_calibration, timeout_s, static_memory_gib, cache_dir, no_cache, as_json, as_md, no_color, width, entry,
             args):
    """Estimate one step of FUNC at scale on a TPU slice, without running it or allocating its weights.

    FUNC(argv, mesh) receives the program's own arguments (after --) and the slice's Mesh and
    returns {"step": the jitted step, "args": its abstract arguments (ShapeDtypeStructs with
    shardings), "tokens": tokens per step, "model": {"params", "embedding_params", "layers", "seq",
    "heads", "head_dim", "causal"}}. LIBTPU_INIT_ARGS pass through to the compile and are recorded.

    maxtext:MODEL estimates MaxText's own train step (the maxtext package, Python >= 3.12) for a model
    config MaxText ships, with MaxText's key=value overrides after --.
    """
    from tpudiag import api

    fmt = output_format(as_json, as_md)
    check_outputs(out)
    check_versions()
    use_cache_options(cache_dir, no_cache)
    progress_cb = (lambda line: click.echo(f"tpudiag: {line}", err=True))
    _run, report = api.estimate(entry, target_text, program_args(args), out, mesh=mesh_text,
                                static_profile=static_profile, limits=static_limits(timeout_s, static_memory_gib),
                                compile_timeout_s=compile_timeout_s, progress=progress_cb,
                                matmul_probes=not no_probes, max_probes=max_probes,
                                calibration=calibration_choice(calibration_file, no_calibration))
    emit(report, fmt, no_color=no_color, width=width)
    if report.status != "ok" and report.fits is not False:  # a step too big for HBM is a finding, not a failure
        raise GateFailed(f"the step did not compile for {report.target['topology']}: {report.reason}")


@cli.command(cls=PassThroughCommand, context_settings=_PASS_THROUGH)
@click.option("--target", "target_text", required=True,
              help="TPU slice: v5e:2x4, v6e-256, v5p-128, ... (tpudiag targets).")
@click.option("--mesh-axes", "mesh_axes", default=None,
              help="Mesh axes to split the slice over, e.g. fsdp,tensor: every split of the devices is a candidate. "
                   "Checked against FUNC's MESH_AXES (or MaxText's ici_*_parallelism settings). Default: FUNC's "
                   "MESH_AXES (fsdp,tensor for maxtext:MODEL; fsdp where FUNC declares none).")
@click.option("--search", "search", default=None, metavar="NAME=V1,V2,... ...",
              help="Other choices, each passed to the program as --NAME VALUE (maxtext: NAME=VALUE), e.g. "
                   "\"remat=full,minimal batch-per-device=2..4\". Every combination, on every mesh, is a candidate. "
                   "Default: the program's remat choices (the keys of its REMAT dict; MaxText's remat_policy "
                   "full, minimal, save_qkv_proj, save_dot_except_mlpwi), unless its arguments fix one.")
@click.option("--jobs", type=click.IntRange(1, 64), default=None,
              help="Candidates estimated at once on this machine (default: one per two cores).")
@click.option("--ray", "ray_address", default=None, metavar="auto|HOST:PORT",
              help="Estimate the candidates as tasks on a Ray cluster instead (`ray start --head`; auto finds the "
                   "one on this machine). Needs the ray extra; the program must be at the same path on every node.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default tpudiag-runs/<timestamp>-plan-<file>). Never overwritten.")
@step_compile_timeout_option("CPU seconds each candidate's compile may take.")
@calibration_options
@click.option("--measure/--no-measure", default=None,
              help="Run the best candidate's step on the attached TPU and show its time beside the estimate "
                   "(default: where a TPU is attached and the target is one chip, v5e:1x1).")
@output_options("tpudiag.plan/1")
@click.argument("entry", metavar="FILE.py:FUNC|maxtext:MODEL")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def plan(target_text, mesh_axes, search, jobs, ray_address, out, compile_timeout_s, calibration_file, no_calibration,
         measure, as_json, as_md, no_color, width, entry, args):
    """Rank a training step's meshes and choices on a slice by estimated tokens/s, without a TPU.

    Each candidate (a split of the slice's devices over --mesh-axes, times the --search choices) is
    estimated as `tpudiag estimate` does; one the compiler says does not fit in HBM is listed, never
    ranked. Prints the ranked table and the estimate command of the winner. Exit 1 if nothing fits."""
    from tpudiag import api

    fmt = output_format(as_json, as_md)
    check_outputs(out)
    check_versions()
    progress_cb = (lambda line: click.echo(f"tpudiag: {line}", err=True))
    run, doc = api.plan(entry, target_text, program_args(args), out, mesh_axes=mesh_axes, search=search, jobs=jobs,
                        ray_address=ray_address, compile_timeout_s=compile_timeout_s, progress=progress_cb,
                        calibration=calibration_choice(calibration_file, no_calibration), measure=measure)
    emit(doc, fmt, no_color=no_color, width=width)
    if doc.status != "ok":
        reasons = {c.reason for c in doc.candidates}
        if len(reasons) == 1 and all(c.status == "failed" for c in doc.candidates):  # one cause: say it
            raise GateFailed(f"plan: every candidate failed: {reasons.pop()} (run directory {run})")
        raise GateFailed(f"plan: no candidate fits {doc.target['topology']} (run directory {run})")
