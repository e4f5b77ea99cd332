"""`tpudiag validate REF CAND`: does a port compute what its reference does, values, gradients,
edge cases? Options in, `api.validate`, `emit` out; a failed case is `GateFailed` (exit 1)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from tpudiag.cli.common import FiniteFloat, check_outputs, emit, force_option, output_format, output_options
from tpudiag.capture import workers
from tpudiag.cli.group import cli
from tpudiag.errors import GateFailed


@cli.command()
@click.option("--inputs", "inputs", required=True, metavar="SPEC|FILE.py:FUNC",
              help='The arguments: a spec ("q=bf16[2,8,1000,128] lengths=s32[2]{1..1000} mask=bool[2,1000]") '
                   "or a generator FILE.py:FUNC called as FUNC(seed, regime).")
@click.option("--static", "static", multiple=True, metavar="NAME=VALUE",
              help="Static keyword arguments for both sides (Python literals), e.g. --static causal=True.")
@click.option("--grad", is_flag=True, help="Also check gradients (a VJP with a random cotangent) of every float input.")
@click.option("--regimes", default="normal", show_default=True,
              help="Comma list of input regimes, or all (those that apply to the inputs). See docs/validate.md.")
@click.option("--seed", type=int, default=None, help="Seed of the inputs (default: a fresh one, printed).")
@click.option("--allow-nondeterminism", is_flag=True,
              help="Skip the bit-for-bit check of two runs of the candidate (for kernels that document it).")
@click.option("--no-shrink", is_flag=True, help="Do not look for a smaller failing case.")
@click.option("--k", "k", type=FiniteFloat(), default=None,
              help="The candidate may be K times as far from float64 as the reference (default 2).")
@click.option("--floor-eps", type=FiniteFloat(), default=None,
              help="Plus this many eps of the output dtype, normwise (default 4).")
@click.option("--bind", "bind", multiple=True, metavar="INPUT=PARAM",
              help="Pass the input INPUT to the candidate's parameter PARAM (inputs are bound by name to both "
                   "sides), e.g. --bind x=inp --bind w=weight.")
@click.option("--unordered", type=int, default=None, metavar="DIM",
              help="Compare integer outputs as sets along DIM (indices a top-k returns in no set order).")
@click.option("--strict-ties", is_flag=True,
              help="Integer and boolean outputs must break ties as the reference does (default: ties are excluded, "
                   "and counted).")
@click.option("--eager", is_flag=True,
              help="Run a JAX candidate op by op, not under jax.jit (the default checks it as it runs jitted).")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write the cases as JUnit XML (.xml).")
@force_option("--junit")
@output_options("tpudiag.validate/1")
@click.argument("reference", metavar="REF")
@click.argument("candidate", metavar="CAND")
def validate(inputs, static, grad, regimes, seed, allow_nondeterminism, no_shrink, k, floor_eps, bind, unordered,
             strict_ties, eager, junit_path, force, as_json, as_md, no_color, width, reference, candidate):
    """Check CAND against REF: values, gradients and determinism, in several input regimes, against
    a float64 computation.

    REF and CAND are FILE.py:FUNCTION or package.module:FUNCTION: JAX functions (a Pallas kernel
    runs with interpret=True), a NumPy reference (float64), or PyTorch functions. The candidate may
    be K times as far from float64 as the reference is, plus a floor. Exit 1 if a case fails, 2 on
    bad arguments."""
    from rich.console import Console

    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # interpret mode on the CPU; no TPU probe
    from tpudiag import api  # noqa: F401
    from tpudiag.api.validate import validate as run_validate

    fmt = output_format(as_json, as_md)
    check_outputs(junit=junit_path, force=force)
    err = Console(stderr=True, highlight=False, markup=False, emoji=False)

    def progress(case):
        if err.is_terminal:
            err.print(f"{'ok  ' if case.ok else 'FAIL'} [{case.regime}] {case.inputs} {case.seconds:.1f} s")
        workers.raise_if_stopping()  # a Ctrl-C that landed in jax's gc callback, where it was dropped

    result = run_validate(reference, candidate, inputs, static=list(static), grad=grad, regimes=regimes, seed=seed,
                          allow_nondeterminism=allow_nondeterminism, shrink=not no_shrink, k=k, floor_eps=floor_eps,
                          bind=list(bind), eager=eager, unordered=unordered, strict_ties=strict_ties, progress=progress,
                          junit_path=junit_path)
    emit(result, fmt, no_color=no_color, width=width)
    if not result.ok:
        raise GateFailed(f"validate: {result.failed} of {len(result.cases)} case(s) failed (seed {result.seed})")
