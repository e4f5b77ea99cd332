"""`tpudiag calibrate`: measure the attached TPU's calibration table, or show one."""

from __future__ import annotations

from pathlib import Path

import click

from tpudiag.cli.common import emit, output_format, output_options
from tpudiag.cli.group import cli


@cli.command()
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=Path("tpudiag-calibration.json"),
              show_default=True, help="Where to write the measured table (never overwritten without --force).")
@click.option("--force", is_flag=True, help="Overwrite --out.")
@click.option("--calls", type=click.IntRange(3, 1000), default=10, show_default=True,
              help="Timed calls per microbenchmark (the fastest is the figure).")
@click.option("--only", default=None, metavar="NAME,...",
              help="Only these measurements or groups (hbm, mxu, sort, gather, pallas, kernel, host).")
@click.option("--show", "show", default=None, metavar="CHIP|FILE",
              help="Print a table instead of measuring: the one tpudiag ships for CHIP (v5e), or FILE. No TPU needed.")
@output_options("tpudiag.calibration/1")
def calibrate(out, force, calls, only, show, as_json, as_md, no_color, width):
    """Measure what the static model misjudges on the attached TPU: HBM bandwidth, MXU rates, sort,
    gather, Pallas grid steps and DMAs, the bundled flash kernels, host transfers.

    Writes a per-chip table (schema tpudiag.calibration/1) that `estimate --calibration FILE` and
    `plan --calibration FILE` read; tpudiag ships the v5e's (`--show v5e`).
    """
    from tpudiag.api.calibrate import load_calibration, measure, read_calibration
    from tpudiag.errors import InputError

    fmt = output_format(as_json, as_md)
    if show is not None:
        path = Path(show)
        cal = read_calibration(path) if path.suffix == ".json" or path.exists() else load_calibration(None, show)
        if cal is None:
            raise InputError(f"--show {show}: tpudiag ships no calibration for {show} (it ships: v5e); "
                             "measure one with `tpudiag calibrate` on that chip")
        emit(cal, fmt, no_color=no_color, width=width)
        return
    names = tuple(x.strip() for x in only.split(",") if x.strip()) if only else ()
    import shlex
    import sys

    cal = measure(out, calls=calls, only=names, force=force, progress=lambda s: click.echo(f"tpudiag: {s}", err=True),
                  command=shlex.join(["tpudiag", "calibrate", *sys.argv[sys.argv.index("calibrate") + 1:]])
                  if "calibrate" in sys.argv else "tpudiag calibrate")
    emit(cal, fmt, no_color=no_color, width=width)
    if fmt == "text":
        click.echo(f"written: {out}")

