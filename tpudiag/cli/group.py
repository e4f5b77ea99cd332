"""The `tpudiag` click group: --version, --debug, and the command modules that register on it.

No jax import at module level: `tpudiag --help` must be instant, and the profiled child sets its
dump flags before jax loads.
"""

from __future__ import annotations

import os

import click

from tpudiag.version import __version__


def _print_versions(ctx, _param, value) -> None:
    if not value or ctx.resilient_parsing:
        return
    import platform

    from tpudiag.compat import check_installed, installed_versions

    click.echo(f"tpudiag {__version__}")
    click.echo(f"python {platform.python_version()}")
    for name, version in installed_versions().items():
        click.echo(f"{name} {version or 'not installed'}")
    check = check_installed()
    for line in check.refusals:
        click.echo(f"unsupported: {line}")
    for line in check.warnings:
        click.echo(f"untested: {line}")
    ctx.exit(0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_versions,
              help="Print the versions of tpudiag, Python, jax, jaxlib, libtpu and xprof, and exit.")
@click.option("--debug", is_flag=True, help="Show tracebacks and libtpu/XLA log noise.")
@click.pass_context
def cli(ctx, debug: bool) -> None:
    """Why is my JAX program slow on a TPU? Profile it, report it, and say what to do."""
    ctx.ensure_object(dict)["debug"] = debug  # main() reads it back to decide on tracebacks
    if not debug:
        # XProf's converters (device-plane traces) log a page of C++ INFO lines per call.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
