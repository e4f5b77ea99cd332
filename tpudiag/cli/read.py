"""The commands that read what earlier runs left: report, targets, fusions, hlo-diff, compare, export.

Options in, one api call, `emit` out, and a failed gate as `GateFailed` (exit 1).
"""

from __future__ import annotations

from pathlib import Path

import click

from tpudiag.cli.common import (check_outputs, emit, force_option, output_format, output_options, selection,
                                selection_options)
from tpudiag.cli.group import cli
from tpudiag.errors import GateFailed

# `compare`: BASE or CUR is a failed run (a crashed or stopped program), whatever its figures say.
EXIT_RUN_FAILED = 5


@cli.command()
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write a self-contained HTML report here (.html; no script; opens offline).")
@force_option("--html")
@click.option("--align", type=click.Choice(["auto", "clock", "collective"]), default="auto", show_default=True,
              help="Several processes' traces: put them on one clock by the hosts' own clocks, or by the end of "
                   "the first collective they all ran (auto: the clock on one host, the collective across hosts).")
@output_options("tpudiag.report/1; tpudiag.compile/1 for a compile run; tpudiag.distributed/1 for several processes")
@click.argument("target", type=click.Path(path_type=Path))
def report(html_path, force, align, as_json, as_md, no_color, width, target):
    """Re-render a run without re-running it.

    TARGET is a run directory, an xprof log directory, or a bare .xplane.pb captured elsewhere. A
    `profile --processes N` run, or a log directory with several hosts' traces in one session
    (plugins/profile/<session>/<host>.xplane.pb, as XProf writes a pod's profile), gives the
    cross-process report: collectives matched across processes, skew, stragglers, overlap.
    """
    from tpudiag import api
    from tpudiag.config import DEFAULT_CONFIG

    fmt = output_format(as_json, as_md)
    check_outputs(html=html_path, force=force)
    loaded = api.load_report(target, align=align)
    if html_path:
        api.write_html(loaded, html_path)
    if loaded.schema.startswith("tpudiag.compile/"):
        emit(loaded, fmt, no_color=no_color, width=width, top=10)
    elif loaded.schema.startswith(("tpudiag.report/", "tpudiag.distributed/")):
        emit(loaded, fmt, no_color=no_color, width=width, top=DEFAULT_CONFIG.top_ops,
             top_compiles=DEFAULT_CONFIG.top_compiles)
    else:  # a search's run (kernels bench, kernels tune, plan): its table as the command printed it
        emit(loaded, fmt, no_color=no_color, width=width)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON (schema tpudiag.targets/1).")
@click.option("--no-color", is_flag=True)
def targets(as_json, no_color):
    """The TPU generations `compile --target` accepts, with each chip's figures."""
    from tpudiag.targets import TARGETS_SCHEMA, targets_table

    fmt = output_format(as_json)
    emit({"schema": TARGETS_SCHEMA, "targets": targets_table()}, fmt, no_color=no_color)
    if fmt == "text":
        click.echo("Also accepted: v5e:2x4, v5p:2x2x1, v6e-4, v5litepod-8, ... (see docs/targets.md)")


@cli.command()
@selection_options
@click.option("--top", type=click.IntRange(1, 10000), default=15, show_default=True, help="Rows per table.")
@output_options("tpudiag.fusions/1, one document per module in a list")
@click.argument("target", type=click.Path(path_type=Path))
def fusions(functions, modules, top, as_json, as_md, no_color, width, target):
    """Fusions and fusion breaks of the optimized HLO in TARGET.

    TARGET is an HLO text file, an XLA dump directory, a profile run (fusions get measured times)
    or a compile run (estimated TPU times). A fusion break is a producer->consumer edge XLA did not
    fuse, so the tensor round-trips memory; the reason is given only when the graph shows it.
    """
    from tpudiag import api

    fmt = output_format(as_json, as_md)
    emit(api.fusions_list(target, selection(functions, modules)), fmt, no_color=no_color, width=width, top=top)


@cli.command(name="hlo-diff")
@selection_options
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Also write a self-contained side-by-side HTML page here (.html).")
@force_option("--html")
@click.option("--fail-on-change", is_flag=True, help="Exit 1 if anything was added, removed, changed or moved (CI).")
@click.option("--all", "show_all", is_flag=True, help="List unchanged instructions too.")
@output_options("tpudiag.hlo_diff/1")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
def hlo_diff(functions, modules, html_path, force, fail_on_change, show_all, as_json, as_md, no_color, width, a, b):
    """What changed between two compiles: A and B are HLO files, dump directories or run directories.

    Instructions are matched by structure (opcode, shape, operands, metadata), not by name.
    """
    from tpudiag import api

    fmt = output_format(as_json, as_md)
    check_outputs(html=html_path, force=force)
    diff = api.hlo_diff(a, b, selection(functions, modules))
    if html_path:
        api.write_diff_html(diff, html_path)
    emit(diff, fmt, no_color=no_color, width=width, unchanged=show_all)
    if fail_on_change and diff.has_changes:
        s = diff.summary
        raise GateFailed(f"HLO changed: {s.added} added, {s.removed} removed, {s.changed} changed, {s.moved} moved")


@cli.command()
@click.option("--metric", type=click.Choice(["work", "device_time", "tpu_time", "peak_memory"]), default=None,
              help="What to compare (default: figures the machine's speed cannot move: work for CPU profile runs, "
                   "tpu_time for compile and profile --target runs, else device_time).")
@click.option("--max-regression", default="5%", show_default=True,
              help="Largest allowed increase of the headline figure: 5% (or the fraction 0.05).")
@click.option("--force", is_flag=True, help="Compare runs of different programs, backends, targets or kinds "
                                           "anyway, or a run with itself.")
@click.option("--top", type=click.IntRange(1, 10000), default=15, show_default=True, help="Rows per table.")
@output_options("tpudiag.compare/1")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("cur", type=click.Path(path_type=Path))
def compare(metric, max_regression, force, top, as_json, as_md, no_color, width, base, cur):
    """Did CUR regress against BASE? Each is a run directory or a report JSON file (profile or compile).

    Two CPU profile runs are compared on the work their steps executed (FLOPs, bytes, op executions,
    peak allocation, from their optimized HLO), which a busy machine cannot move; compile runs on the
    TPU estimates. With --metric device_time and 3 or more steps in each run the median step times
    are compared, and an increase counts only beyond --max-regression and the runs' measured spread.
    Per-module and per-op changes are shown; only the headline figure decides the exit code: 1 on a
    regression, 0 otherwise; 5 when either run failed (its program crashed or was stopped), whatever
    the figures say. BASE and CUR must be two runs.
    """
    from tpudiag import api
    from tpudiag.analyze.compare.runs import parse_max_regression
    from tpudiag.report.compare_render import render_compare_verdict

    fmt = output_format(as_json, as_md)
    result = api.compare_runs(base, cur, metric, parse_max_regression(max_regression), force)
    emit(result, fmt, no_color=no_color, width=width, top=top)
    if result.run_failed:
        raise GateFailed(f"compare: {result.run_failed}: a failed run passes no gate", exit_code=EXIT_RUN_FAILED)
    if result.regression:
        raise GateFailed(render_compare_verdict(result))


@cli.command()
@click.option("--perfetto", "perfetto_path", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Write the op timeline here as a Chrome JSON trace (.json, or .json.gz) for ui.perfetto.dev.")
@force_option("--perfetto")
@click.argument("target", type=click.Path(path_type=Path))
def export(perfetto_path, force, target):
    """Export a profile run's op timeline (HLO names, categories, source lines, steps) for Perfetto."""
    from tpudiag import api

    check_outputs(perfetto=perfetto_path, force=force)
    res = api.perfetto_export(target, perfetto_path)
    click.echo(f"wrote {res['path']}: {res['events']} events, {res['bytes'] / 2**20:.2f} MB")
