"""`tpudiag kernels list | show | verify | bench | tune`: the bundled Pallas TPU kernels, and a
search of any kernel's block sizes.

Options in, one api call, `emit` out; a failed verify or bench is `GateFailed` (exit 1).
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from tpudiag.cli.common import (cache_options, check_outputs, check_versions, emit, force_option, output_format,
                                compile_timeout_option, static_limits, static_profile_options, use_cache_options)
from tpudiag.capture import workers
from tpudiag.cli.group import cli
from tpudiag.errors import GateFailed


def _cpu_jax():
    # Bench lowers here and compiles in workers, and verify without a TPU runs Pallas in interpret
    # mode on the CPU: neither needs a TPU backend, and probing for one prints libtpu's start-up
    # noise. On a machine with a TPU attached (its device files), verify runs on the chip.
    from tpudiag.capture.process import default_platforms

    if default_platforms() is not None:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _fast_forward_option(f):
    return click.option("--fast-forward-loops", is_flag=True,
                        help="Let the static profile fast-forward loops (libtpu >= 0.0.50): quicker for a huge kernel, "
                             "but a gridded kernel's cycles come out inflated, up to 5x (docs/kernels.md). Default: "
                             "every grid step is stepped through.")(f)


def _text_options(f):
    f = click.option("--width", type=click.IntRange(60, 400), default=None)(f)
    return click.option("--no-color", is_flag=True)(f)


@cli.group()
def kernels():
    """Pallas TPU kernels: list, show, verify (CPU, interpret mode), bench and tune (TPU compiler)."""
    check_versions()
    _cpu_jax()


@kernels.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (schema tpudiag.kernels/1).")
@_text_options
def kernels_list(as_json, no_color, width):
    """The bundled kernels: what each replaces and the shapes it was tuned for."""
    from tpudiag import api

    emit(api.kernels_list(), output_format(as_json), no_color=no_color, width=width)


@kernels.command(name="show")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (one tpudiag.kernels/1 entry).")
@_text_options
@click.argument("name")
def kernels_show(as_json, no_color, width, name):
    """One kernel: what it replaces, its signature, the shapes it was tuned for, a usage snippet."""
    from tpudiag import api

    emit(api.kernel_card(name), output_format(as_json), no_color=no_color, width=width)


@kernels.command(name="verify")
@click.option("--seed", type=int, default=None, help="Random seed for the inputs (default: a fresh one, printed).")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write the results as JUnit XML (.xml).")
@force_option("--junit")
@click.option("--on-chip/--interpret", "on_chip", default=None,
              help="Compile each kernel for the attached TPU and run it there, or run Pallas interpret mode on "
                   "the CPU (default: on the chip where a TPU is attached).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (schema tpudiag.kernels-verify/1).")
@_text_options
@click.argument("names", nargs=-1)
def kernels_verify(seed, junit_path, force, on_chip, as_json, no_color, width, names):
    """Check kernels against their reference and float64, values and gradients: on the attached TPU,
    or in interpret mode on the CPU where none is attached.

    Exit 1 if any case fails."""
    from rich.console import Console

    from tpudiag import api

    check_outputs(junit=junit_path, force=force)  # before the cases run (a full verify takes a while)
    err = Console(stderr=True, highlight=False, markup=False, emoji=False)

    def progress(r):
        if err.is_terminal:
            err.print(f"{'ok  ' if r.ok else 'FAIL'} {r.kernel} [{r.label}] {r.seconds:.1f} s")
        workers.raise_if_stopping()  # a Ctrl-C that landed in jax's gc callback, where it was dropped

    if on_chip is False:
        os.environ["JAX_PLATFORMS"] = "cpu"  # --interpret: never touch the chip
    result = api.kernels_verify(names, seed, progress, junit_path=junit_path, on_chip=on_chip)
    emit(result, output_format(as_json), no_color=no_color, width=width)
    if not result.ok:
        raise GateFailed(f"kernels verify: {len(result.failures)} of {len(result.cases)} case(s) failed "
                         f"(seed {result.seed})")


@kernels.command(name="bench")
@click.option("--target", "target_text", required=True, help="TPU target: v5e, v6e, v5p, v4.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default: tpudiag-runs/<timestamp>-kernels-bench).")
@click.option("--no-static-profile", is_flag=True, help="Skip the static cycle profile (roofline floors only).")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True, help="Compiles at once.")
@click.option("--on-chip/--static", "on_chip", default=None,
              help="Also time every variant on the attached TPU by device time (default where a TPU is attached), "
                   "or give the TPU compiler's static figures only.")
@click.option("--calls", type=click.IntRange(3, 1000), default=10, show_default=True,
              help="On the chip: timed calls per variant (min and median reported).")
@_fast_forward_option
@static_profile_options(120)
@compile_timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (schema tpudiag.kernels-bench/1).")
@click.option("--md", "as_md", is_flag=True, help="Print GitHub Markdown.")
@_text_options
@cache_options
@click.argument("names", nargs=-1)
def kernels_bench(target_text, out, no_static_profile, jobs, on_chip, calls, fast_forward_loops, timeout_s,
                  static_memory_gib, compile_timeout_s, as_json, as_md, no_color, width, names, cache_dir, no_cache):
    """Compile kernels, their plain-JAX versions and JAX's own kernels for TPU; compare estimated cycles.

    On a machine with a TPU, also time each variant on the chip: device time per call from the
    trace, argument buffers rotated beyond VMEM, min and median of --calls; beside each the static
    estimate, the roofline floor and "% of floor".

    Exit 1 if a variant failed to lower, compile or run (the others are still reported)."""
    from rich.console import Console

    from tpudiag import api
    from tpudiag.targets import resolve_target

    fmt = output_format(as_json, as_md)
    resolve_target(target_text)  # a bad target fails before any work
    check_outputs(out)
    use_cache_options(cache_dir, no_cache)
    err = Console(stderr=True, highlight=False, markup=False, emoji=False)
    result, run = api.kernels_bench(names, target_text, out, static_profile=not no_static_profile, jobs=jobs,
                                    limits=static_limits(timeout_s, static_memory_gib, compile_timeout_s),
                                    fast_forward=fast_forward_loops, on_chip=on_chip, calls=calls,
                                    progress=(lambda line: err.print(line)) if err.is_terminal else None)
    emit(result, fmt, no_color=no_color, width=width)
    if result.failed:
        raise GateFailed(f"kernels bench: {', '.join(result.failed)} failed to lower, compile or run "
                         f"(run directory {run})")


@kernels.command(name="tune")
@click.option("--target", "target_text", required=True, help="TPU target: v5e, v6e, v5p, v4.")
@click.option("--space", "space_text", default=None, metavar="NAME=V1,V2,... ...",
              help="The choices to search: each NAME a keyword argument of FUNC (or a block-size field of a bundled "
                   "kernel), with its values (LOW..HIGH: every integer between), e.g. \"block_q=128,256,512 "
                   "block_k=128,256,512\". Every combination is a point. A bundled kernel without it: its block "
                   "candidates.")
@click.option("--inputs", "inputs_text", default=None, metavar="SPEC",
              help="FUNC's arguments: NAME=DTYPE[D0,D1,...] each, as validate reads them "
                   "(\"q=bf16[1,8,2048,128] k=bf16[1,8,2048,128] v=bf16[1,8,2048,128]\"). A bundled kernel is "
                   "tuned at its production shape.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default: tpudiag-runs/<timestamp>-kernels-tune).")
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Compiles at once on this machine (default: one per two cores).")
@click.option("--ray", "ray_address", default=None, metavar="auto|HOST:PORT",
              help="Run the points on a Ray cluster instead (`ray start --head` starts one; auto finds the one on "
                   "this machine). Needs the ray extra.")
@click.option("--no-static-profile", is_flag=True, help="Skip the static cycle profile (roofline floors only).")
@_fast_forward_option
@click.option("--reference", default=None, metavar="FILE.py:FUNC",
              help="Also check every point that compiled against this reference on this CPU (Pallas interpret "
                   "mode where the built function takes interpret=), at fresh inputs of --inputs' shapes, by "
                   "validate's rule; a point that does not match is never ranked.")
@click.option("--seed", type=int, default=None, help="--reference: the inputs' seed (default: a fresh one, shown).")
@click.option("--on-chip/--static", "on_chip", default=None,
              help="A bundled kernel: also time every point on the attached TPU and rank them by device time (default "
                   "where a TPU is attached), or rank by the static figures only.")
@click.option("--calls", type=click.IntRange(3, 1000), default=10, show_default=True,
              help="On the chip: timed calls per point.")
@static_profile_options(120)
@compile_timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (schema tpudiag.kernels-tune/1).")
@click.option("--md", "as_md", is_flag=True, help="Print GitHub Markdown.")
@_text_options
@cache_options
@click.argument("entry", metavar="FILE.py:FUNC|KERNEL")
def kernels_tune(target_text, space_text, inputs_text, out, jobs, ray_address, no_static_profile, fast_forward_loops,
                 reference, seed, on_chip, calls, timeout_s,
                 static_memory_gib, compile_timeout_s, as_json, as_md, no_color, width, cache_dir, no_cache, entry):
    """Search a Pallas kernel's block sizes on the TPU compiler, and on the chip where a TPU is attached.

    FUNC(**choice) builds the kernel for one point of --space and returns the function to compile
    at --inputs; a bundled kernel's name (tpudiag kernels list) searches its block candidates, or
    --space over its block sizes, at its production shape. Each point is lowered and compiled for
    the target with the static cycle profile (every grid step stepped through) and ranked by
    corrected estimated cycles (as kernels bench counts them); a point that does not lower, runs
    out of VMEM or fails to compile is a row. Exit 1 if no point compiled."""
    from rich.console import Console

    from tpudiag import api

    fmt = output_format(as_json, as_md)
    check_outputs(out)
    use_cache_options(cache_dir, no_cache)
    err = Console(stderr=True, highlight=False, markup=False, emoji=False)
    result, run = api.kernels_tune(entry, target_text, space_text, inputs_text, out, jobs=jobs,
                                   ray_address=ray_address, static_profile=not no_static_profile,
                                   limits=static_limits(timeout_s, static_memory_gib, compile_timeout_s),
                                   fast_forward=fast_forward_loops, reference=reference, seed=seed,
                                   on_chip=on_chip, calls=calls, progress=(lambda line: err.print(line)) if err.is_terminal else None)
    emit(result, fmt, no_color=no_color, width=width)
    if result.status != "ok":
        raise GateFailed(f"kernels tune: no point of the space compiled{' and matched the reference' if reference else ''}"
                         f" (run directory {run})")
