"""`tpudiag suggest`: which ops deserve a custom Pallas kernel, with the gain."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tpudiag.cli.common import (cache_options, check_outputs, check_versions, emit, output_format, output_options,
                                compile_timeout_option, program_args, progress, selection, selection_options,
                                static_limits, static_profile_options, use_cache_options)
from tpudiag.cli.group import cli
from tpudiag.cli.run import _PASS_THROUGH, PassThroughCommand


@cli.command(cls=PassThroughCommand, context_settings=_PASS_THROUGH)
@click.option("--target", "target_text", default=None,
              help="TPU target (default: the run's own; v5e when INPUT is a script). A run compiled for another "
                   "chip is refused, with the command that compiles it for this one.")
@click.option("--all", "show_all", is_flag=True, help="Also list matches below the minimum share and speedup.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="With a script: the run directory (default tpudiag-runs/<timestamp>-<script>).")
@click.option("--no-static-profile", is_flag=True,
              help="Skip the static cycle profile for the script and for the kernels (roofline figures only).")
@click.option("--no-calibration", is_flag=True,
              help="Price every kernel from static figures only, not from the chip's measured kernel table "
                   "(on v5e, the bundled kernels' measured times scaled to the matched shapes).")
@click.option("--measure", is_flag=True,
              help="Also time each suggestion's kernel and its plain-JAX twin on the attached TPU at the program's "
                   "matched shapes (device time, the fastest of --calls), beside the estimate. Needs a TPU here.")
@click.option("--calls", type=click.IntRange(3, 1000), default=10, show_default=True,
              help="With --measure: timed calls per variant.")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True, help="Compiles at once.")
@static_profile_options(120)
@compile_timeout_option
@selection_options
@cache_options
@output_options("tpudiag.suggest/1")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def suggest(target_text, show_all, out, no_static_profile, no_calibration, measure, calls, jobs, timeout_s,
            static_memory_gib, compile_timeout_s, functions, modules, as_json, as_md,
            no_color, width, input_path, args, cache_dir, no_cache):
    """Which ops of INPUT deserve a custom Pallas kernel, and what it would save.

    INPUT is a compile run, a profile run made with --target, or a script (profiled with --target
    first; ARGS go to it). Each suggestion names the XLA ops it replaces, their source lines, the
    bundled kernel compiled at the matched shapes for the same target, the expected speedup and the
    seconds saved, and what the estimate rests on.
    """
    import os

    # Kernels are lowered for TPU in this process: libtpu must not probe for a TPU (and print its
    # warnings) when jax loads.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from tpudiag import api  # noqa: F401  (the analysis stack, imported once)
    from tpudiag.api.suggest import suggest as run_suggest
    from tpudiag.errors import UsageError

    fmt = output_format(as_json, as_md)
    if measure:  # first: without a TPU, one line and nothing written
        from tpudiag.api.suggest_chip import require_tpu

        require_tpu()
    is_script = input_path.suffix == ".py"
    if args and not is_script:
        raise UsageError(f"{input_path}: program arguments are only for a .py script")
    check_outputs(out if is_script else None)
    if is_script or not no_static_profile:
        check_versions()
    use_cache_options(cache_dir, no_cache)
    if target_text:
        from tpudiag.targets import resolve_target

        resolve_target(target_text)
    progress_cb, stop = progress()
    try:
        report, _ = run_suggest(input_path, program_args(args), target_text, out, static_profile=not no_static_profile,
                                jobs=jobs, limits=static_limits(timeout_s, static_memory_gib, compile_timeout_s),
                                progress=progress_cb, selection=selection(functions, modules),
                                include_all=show_all, calibration=not no_calibration, measure=measure, calls=calls,
                                chip_progress=lambda line: click.echo(f"tpudiag: {line}", err=True),
                                program_stdout=sys.stderr.buffer if fmt != "text" else None)
    finally:
        stop()
    emit(report, fmt, no_color=no_color, width=width, show_all=show_all)
