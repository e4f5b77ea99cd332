"""The `tpudiag` command line: options in, an api call, a renderer out, an exit code.

No jax import at module level: `tpudiag --help` must be instant, and the profiled child sets its
dump flags before jax loads. `main()` is the only place that calls `sys.exit`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tpudiag import __version__
from tpudiag.errors import NothingTraced, ProgramFailed, TpudiagError, UsageError

_STATE = {"debug": False}


def _console(no_color: bool, width: int | None):
    from rich.console import Console

    return Console(no_color=no_color, width=width, highlight=False, soft_wrap=False)


def _emit(doc: dict, as_json: bool, as_md: bool, no_color: bool, width: int | None) -> None:
    from tpudiag.config import DEFAULT_CONFIG

    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json(doc), nl=False)
    elif as_md:
        from tpudiag.report.markdown import render_markdown

        click.echo(render_markdown(doc, DEFAULT_CONFIG.top_ops, DEFAULT_CONFIG.top_compiles), nl=False)
    else:
        from tpudiag.report.terminal import render_terminal

        render_terminal(doc, _console(no_color, width), DEFAULT_CONFIG.top_ops, DEFAULT_CONFIG.top_compiles)


def _emit_compile(doc: dict, as_json: bool, as_md: bool, no_color: bool, width: int | None, top: int) -> None:
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json(doc), nl=False)
    elif as_md:
        from tpudiag.report.compile_markdown import render_compile_markdown

        click.echo(render_compile_markdown(doc, top), nl=False)
    else:
        from tpudiag.report.compile_terminal import render_compile_terminal

        render_compile_terminal(doc, _console(no_color, width), top)


def _output_options(f, schema: str = "tpudiag.report/1"):
    f = click.option("--width", type=click.IntRange(60, 400), default=None,
                     help="Terminal report width (default: the terminal's).")(f)
    f = click.option("--no-color", is_flag=True, help="Plain terminal output.")(f)
    f = click.option("--md", "as_md", is_flag=True, help="Print GitHub-flavoured Markdown (for $GITHUB_STEP_SUMMARY).")(f)
    f = click.option("--json", "as_json", is_flag=True, help=f"Print JSON to stdout (schema {schema}).")(f)
    return f


def _ci_options(f):
    f = click.option("--max-artifact-mb", type=click.FloatRange(0, min_open=True), default=None,
                     help="With --ci: the most tpudiag-artifacts.tar.gz may weigh, compressed, in MB "
                          "(default 50); what does not fit is left out and listed in its BUNDLE.txt.")(f)
    f = click.option("--ci", is_flag=True,
                     help="Also write RUN/tpudiag-artifacts.tar.gz (reports, trace, HLO, LLO summaries) "
                          "for a CI artifact upload, and print its path (docs/ci.md).")(f)
    return f


def _ci_budget(ci: bool, max_artifact_mb: float | None) -> float | None:
    """The bundle budget in MB, or None without --ci; checked before anything runs."""
    if max_artifact_mb is not None and not ci:
        raise UsageError("--max-artifact-mb needs --ci")
    if not ci:
        return None
    from tpudiag.capture.bundle import DEFAULT_MAX_ARTIFACT_MB

    return DEFAULT_MAX_ARTIFACT_MB if max_artifact_mb is None else max_artifact_mb


def _write_ci_bundle(run_dir: Path, max_mb: float, report, program_failed: bool) -> None:
    """`--ci`: RUN/tpudiag-artifacts.tar.gz with the HTML report, its path on stderr (stdout stays the report)."""
    from tpudiag import api
    from tpudiag.capture.bundle import MB, write_bundle

    try:
        res = write_bundle(run_dir, int(max_mb * MB), html=api.html_report(report))
    except UsageError as e:
        if not program_failed:
            raise
        click.echo(f"tpudiag: error: {e}", err=True)  # the program's own exit code still wins
        return
    left = (f"; {len(res.left_out)} file(s) left out to fit --max-artifact-mb {max_mb:g}, listed in BUNDLE.txt"
            if res.left_out else "")
    click.echo(f"tpudiag: CI artifacts {res.path} ({res.bytes / MB:.2f} MB{left})", err=True)


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


def _check_versions() -> None:
    """Refuse a jax/jaxlib/libtpu combination known to crash, before anything runs; warn on an
    untested one."""
    from tpudiag.compat import check_installed
    from tpudiag.errors import IncompatibleVersions

    check = check_installed()
    for line in check.warnings:
        click.echo(f"tpudiag: warning: {line}", err=True)
    if check.refusals:
        raise IncompatibleVersions(check.refusals[0])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_versions,
              help="Print the versions of tpudiag, Python, jax, jaxlib, libtpu and xprof, and exit.")
@click.option("--debug", is_flag=True, help="Show tracebacks and libtpu/XLA log noise.")
def cli(debug: bool) -> None:
    """Why is my JAX program slow on a TPU? Profile it, report it, and say what to do."""
    _STATE["debug"] = debug
    if not debug:
        # XProf's converters (device-plane traces) log a page of C++ INFO lines per call.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True})
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default tpudiag-runs/<timestamp>-<script>). Never overwritten.")
@click.option("--steps", type=int, default=None,
              help="Trace only N jax.profiler.StepTraceAnnotation steps (default: trace the whole run).")
@click.option("--skip", type=int, default=0, show_default=True, help="With --steps: steps to run untraced first.")
@click.option("--python-trace", is_flag=True, help="Also record every Python call (slow: 2-5x).")
@click.option("--target", "target_text", default=None,
              help="Also compile the program's computations for this TPU (v5e, v6e:2x2, ...) and show "
                   "the estimated TPU time beside the measured one.")
@click.option("--no-static-profile", is_flag=True, help="With --target: skip the static cycle profile.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write a self-contained HTML report here (no script; opens offline).")
@_ci_options
@_output_options
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def profile(out, steps, skip, python_trace, target_text, no_static_profile, html_path, ci, max_artifact_mb,
            as_json, as_md, no_color, width, script, args):
    """Run SCRIPT [ARGS...] under the profiler and report where its time went.

    tpudiag's options may come before or after SCRIPT; the program's own arguments go after `--`
    (`tpudiag profile train.py --target v5e -- --steps 5`). Options tpudiag does not know are
    passed to the program too. The run directory holds the
    trace (open it with `xprof --logdir RUN/trace`), the HLO and IR dumps, the program's log,
    manifest.json, report.json and report.md.
    """
    import importlib

    from tpudiag.capture import rundir
    from tpudiag.capture.runner import run_program

    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    if skip and steps is None:
        raise UsageError("--skip needs --steps")
    ci_mb = _ci_budget(ci, max_artifact_mb)
    _check_versions()
    if target_text:
        from tpudiag.targets import resolve_target

        resolve_target(target_text)  # a bad target fails before the program runs
    args = list(args)
    if args and args[0] == "--":
        args = args[1:]
    # With --json/--md, stdout is exactly the report: the program's stdout goes to stderr (and the log).
    program_stdout = sys.stderr.buffer if (as_json or as_md) else None
    cap = run_program(script, args, out or rundir.default_run_dir(script), steps=steps, skip=skip,
                      python_trace=python_trace, program_stdout=program_stdout,
                      while_waiting=lambda: importlib.import_module("tpudiag.api"))
    from tpudiag import api

    result = api.finish_capture(cap)
    if target_text and cap.exit_code == 0:
        progress_cb, stop = _progress()
        try:
            report = api.shadow_compile_run(cap.run_dir, target_text, static_profile=not no_static_profile,
                                            progress=progress_cb)
        finally:
            stop()
        api.write_report(report, cap.run_dir)
        result = api.ProfileResult(capture=cap, report=report)
    doc = result.report.to_dict()
    if html_path:
        api.write_html(result.report, html_path)
    _emit(doc, as_json, as_md, no_color, width)
    cap = result.capture
    if ci_mb is not None:  # also for a failed program: that is when the artifacts matter most
        _write_ci_bundle(cap.run_dir, ci_mb, result.report, program_failed=cap.exit_code != 0)
    if cap.exit_code != 0:
        raise ProgramFailed(f"the program failed ({cap.reason}); what was captured is in {cap.run_dir}", cap.exit_code)
    if not doc["artifacts"].get("xplane"):
        raise NothingTraced(f"nothing was traced: {doc['warnings'][0] if doc['warnings'] else 'no trace'}")


@cli.command()
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write a self-contained HTML report here (no script; opens offline).")
@lambda f: _output_options(f, "tpudiag.report/1, or tpudiag.compile/1 for a compile run")
@click.argument("target", type=click.Path(path_type=Path))
def report(html_path, as_json, as_md, no_color, width, target):
    """Re-render a run without re-running it.

    TARGET is a run directory, an xprof log directory, or a bare .xplane.pb captured elsewhere.
    """
    from tpudiag import api

    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    loaded = api.load_report(target)
    doc = loaded.to_dict()
    if html_path:
        api.write_html(loaded, html_path)
    if doc["schema"].startswith("tpudiag.compile/"):
        _emit_compile(doc, as_json, as_md, no_color, width, 10)
    else:
        _emit(doc, as_json, as_md, no_color, width)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON (schema tpudiag.targets/1).")
@click.option("--no-color", is_flag=True)
def targets(as_json, no_color):
    """The TPU generations `compile --target` accepts, with each chip's figures."""
    from tpudiag.targets import TARGETS_SCHEMA, targets_table

    rows = targets_table()
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json({"schema": TARGETS_SCHEMA, "targets": rows}), nl=False)
        return
    from tpudiag.report.compile_terminal import render_targets_terminal

    render_targets_terminal(rows, _console(no_color, None))
    click.echo("Also accepted: v5e:2x4, v5p:2x2x1, v6e-4, v5litepod-8, ... (see docs/targets.md)")


@cli.command(name="compile", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True})
@click.option("--target", "target_text", required=True, help="TPU target: v4, v5e, v5p, v6e, or a topology (v5e:2x4).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default tpudiag-runs/<timestamp>-<input>). Never overwritten.")
@click.option("--no-static-profile", is_flag=True,
              help="Skip the TPU compiler's static cycle profile (much faster; roofline estimates only).")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True, help="Modules compiled at once.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=60, show_default=True,
              help="Seconds a module may spend in the static-profile compile before falling back.")
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True, help="Ops shown per module.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write a self-contained HTML report here (no script; opens offline).")
@_ci_options
@lambda f: _output_options(f, "tpudiag.compile/1")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def compile_(target_text, out, no_static_profile, jobs, timeout_s, top, html_path, ci, max_artifact_mb, as_json,
             as_md, no_color, width, input_path, args):
    """Compile INPUT for a TPU generation on this machine and report the TPU compiler's own estimates.

    INPUT is a Python script (run on CPU; every jitted computation it ran is compiled; ARGS go to
    it), a StableHLO .mlir file or JAX IR dump directory (JAX_DUMP_IR_TO), or an HLO text file.
    """
    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    ci_mb = _ci_budget(ci, max_artifact_mb)
    _check_versions()
    from tpudiag.targets import require_libtpu, resolve_target

    resolve_target(target_text)  # a bad target or a missing libtpu fails before anything runs
    require_libtpu()
    args = list(args)
    if args and args[0] == "--":
        args = args[1:]
    if args and input_path.suffix != ".py":
        raise UsageError(f"{input_path}: program arguments are only for a .py script")
    from tpudiag import api
    from tpudiag.capture.tpu_compile import Limits

    progress_cb, stop = _progress()
    try:
        result = api.compile_target(target_text, input_path, args, out, static_profile=not no_static_profile,
                                    jobs=jobs, limits=Limits(static_timeout_s=timeout_s), progress=progress_cb,
                                    program_stdout=sys.stderr.buffer if (as_json or as_md) else None)
    finally:
        stop()
    doc = result.report.to_dict()
    if html_path:
        api.write_html(result.report, html_path)
    _emit_compile(doc, as_json, as_md, no_color, width, top)
    shadow = doc["source"].get("shadow_run") or {}
    if ci_mb is not None:
        _write_ci_bundle(result.run_dir, ci_mb, result.report,
                         program_failed=bool(shadow.get("exit_code")) or doc["status"] != "ok")
    if shadow.get("exit_code"):  # the script failed: what it ran before failing was still compiled
        raise ProgramFailed(f"the program failed ({shadow['reason']}); the {len(doc['modules'])} computation(s) "
                            f"it ran before that were compiled; run directory {result.run_dir}",
                            shadow["exit_code"])
    if _STATE["debug"]:  # libtpu's own output is kept out of the way, not thrown away
        for m in doc["modules"]:
            click.echo(f"tpudiag: {m['name']}: TPU compiler log in {m['artifacts']}/compile.log", err=True)
    if doc["status"] != "ok":
        failed = [m for m in doc["modules"] if m["status"] != "ok"]
        raise ProgramFailed(f"{len(failed)} of {len(doc['modules'])} module(s) failed to compile for "
                            f"{doc['target']['topology']} (first: {failed[0]['name']}: {failed[0]['error']})", 1)


@cli.command()
@click.option("--module", "module_name", default=None, help="Only modules whose name contains this.")
@click.option("--top", type=click.IntRange(1, 10000), default=15, show_default=True, help="Rows per table.")
@lambda f: _output_options(f, "tpudiag.fusions/1, one document per module in a list")
@click.argument("target", type=click.Path(path_type=Path))
def fusions(module_name, top, as_json, as_md, no_color, width, target):
    """Fusions and fusion breaks of the optimized HLO in TARGET.

    TARGET is an HLO text file, an XLA dump directory, a profile run (fusions get measured times)
    or a compile run (estimated TPU times). A fusion break is a producer->consumer edge XLA did not
    fuse, so the tensor round-trips memory; the reason is given only when the graph shows it.
    """
    from tpudiag import api

    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    docs = api.fusion_reports(target, module_name)
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json({"schema": "tpudiag.fusions_list/1", "modules": docs}), nl=False)
    elif as_md:
        from tpudiag.report.fusions_render import render_fusions_markdown

        click.echo("\n".join(render_fusions_markdown(d, top) for d in docs), nl=False)
    else:
        from tpudiag.report.fusions_render import render_fusions_terminal

        console = _console(no_color, width)
        for d in docs:
            render_fusions_terminal(d, console, top)


@cli.command(name="hlo-diff")
@click.option("--module", "module_name", default=None, help="The module to compare when a side holds several.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Also write a self-contained side-by-side HTML page here.")
@click.option("--fail-on-change", is_flag=True, help="Exit 1 if anything was added, removed, changed or moved (CI).")
@click.option("--all", "show_all", is_flag=True, help="List unchanged instructions too.")
@lambda f: _output_options(f, "tpudiag.hlo_diff/1")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
def hlo_diff(module_name, html_path, fail_on_change, show_all, as_json, as_md, no_color, width, a, b):
    """What changed between two compiles: A and B are HLO files, dump directories or run directories.

    Instructions are matched by structure (opcode, shape, operands, metadata), not by name.
    """
    from tpudiag import api
    from tpudiag.analyze.hlo_diff import has_changes
    from tpudiag.report import diff_render

    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    doc = api.hlo_diff(a, b, module_name)
    if html_path:
        from tpudiag.capture.rundir import write_text_atomic

        write_text_atomic(html_path, diff_render.render_diff_html(doc))
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json(doc), nl=False)
    elif as_md:
        click.echo(diff_render.render_diff_markdown(doc), nl=False)
    else:
        click.echo(diff_render.render_diff_text(doc, unchanged=show_all), nl=False)
    if fail_on_change and has_changes(doc):
        s = doc["summary"]
        raise ProgramFailed(f"HLO changed: {s['added']} added, {s['removed']} removed, {s['changed']} changed, "
                            f"{s['moved']} moved", 1)




@cli.command()
@click.option("--metric", type=click.Choice(["device_time", "tpu_time", "peak_memory"]), default=None,
              help="What to compare (default: device_time for profile runs, tpu_time for compile runs).")
@click.option("--max-regression", default="5%", show_default=True,
              help="Largest allowed increase of the headline figure: 5% (or the fraction 0.05).")
@click.option("--force", is_flag=True, help="Compare runs of different programs, backends, targets or kinds anyway.")
@click.option("--top", type=click.IntRange(1, 10000), default=15, show_default=True, help="Rows per table.")
@lambda f: _output_options(f, "tpudiag.compare/1")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("cur", type=click.Path(path_type=Path))
def compare(metric, max_regression, force, top, as_json, as_md, no_color, width, base, cur):
    """Did CUR regress against BASE? Each is a run directory or a report JSON file (profile or compile).

    With 3 or more steps in each run the median step times are compared, and an increase counts only
    beyond --max-regression and the runs' measured spread. Per-module and per-op changes are shown;
    only the headline figure decides the exit code: 1 on a regression, 0 otherwise.
    """
    from tpudiag import api
    from tpudiag.analyze.compare import compare_reports, parse_max_regression
    from tpudiag.report import compare_render

    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    threshold = parse_max_regression(max_regression)
    doc = compare_reports(api.load_for_compare(base), api.load_for_compare(cur), metric, threshold, force,
                          base_path=str(base), cur_path=str(cur))
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json(doc), nl=False)
    elif as_md:
        click.echo(compare_render.render_compare_markdown(doc, top), nl=False)
    else:
        compare_render.render_compare_terminal(doc, _console(no_color, width), top)
    if doc["regression"]:
        raise ProgramFailed(compare_render.render_compare_verdict(doc), 1)


@cli.command()
@click.option("--perfetto", "perfetto_path", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Write the op timeline here as a Chrome JSON trace (.json, or .json.gz) for ui.perfetto.dev.")
@click.argument("target", type=click.Path(path_type=Path))
def export(perfetto_path, target):
    """Export a profile run's op timeline (HLO names, categories, source lines, steps) for Perfetto."""
    from tpudiag import api

    res = api.perfetto_export(target, perfetto_path)
    click.echo(f"wrote {res['path']}: {res['events']} events, {res['bytes'] / 2**20:.2f} MB")


@cli.group()
def kernels():
    """The bundled Pallas TPU kernels: list, show, verify (CPU, interpret mode), bench (TPU compiler)."""
    _check_versions()


def _kernel_specs(names):
    from tpudiag.kernels.registry import all_specs, get_spec

    return [get_spec(n) for n in names] if names else all_specs()


def _cpu_jax():
    # Verification runs Pallas in interpret mode on the CPU, and bench lowers here and compiles in
    # workers: neither needs a TPU backend, and probing for one prints libtpu's start-up noise.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@kernels.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (schema tpudiag.kernels/1).")
@click.option("--no-color", is_flag=True)
@click.option("--width", type=click.IntRange(60, 400), default=None)
def kernels_list(as_json, no_color, width):
    """The bundled kernels: what each replaces and the shapes it was tuned for."""
    from tpudiag.report.kernels_render import LIST_SCHEMA, render_list

    _cpu_jax()
    doc = {"schema": LIST_SCHEMA, "kernels": [s.describe() for s in _kernel_specs(())]}
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json(doc), nl=False)
    else:
        render_list(doc, _console(no_color, width))


@kernels.command(name="show")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (one tpudiag.kernels/1 entry).")
@click.option("--no-color", is_flag=True)
@click.option("--width", type=click.IntRange(60, 400), default=None)
@click.argument("name")
def kernels_show(as_json, no_color, width, name):
    """One kernel: what it replaces, its signature, the shapes it was tuned for, a usage snippet."""
    from tpudiag.report.kernels_render import LIST_SCHEMA, render_show

    _cpu_jax()
    (spec,) = _kernel_specs((name,))
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json({"schema": LIST_SCHEMA, **spec.describe()}), nl=False)
    else:
        render_show(spec.describe(), _console(no_color, width))


@kernels.command(name="verify")
@click.option("--seed", type=int, default=None, help="Random seed for the inputs (default: a fresh one, printed).")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write the results as JUnit XML.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (schema tpudiag.kernels-verify/1).")
@click.option("--no-color", is_flag=True)
@click.option("--width", type=click.IntRange(60, 400), default=None)
@click.argument("names", nargs=-1)
def kernels_verify(seed, junit_path, as_json, no_color, width, names):
    """Check kernels (interpret mode, CPU) against their reference and float64, values and gradients.

    Exit 1 if any case fails."""
    from rich.console import Console

    from tpudiag.report.kernels_render import render_junit, render_verify

    _cpu_jax()
    specs = _kernel_specs(names)
    from tpudiag.kernels.verify import verify_specs

    err = Console(stderr=True, highlight=False)

    def progress(r):
        if err.is_terminal:
            err.print(f"{'ok  ' if r.ok else 'FAIL'} {r.kernel} [{r.label}] {r.seconds:.1f} s")

    result = verify_specs(specs, seed, progress)
    doc = result.to_dict()
    if junit_path is not None:
        from tpudiag.capture.rundir import write_text_atomic

        write_text_atomic(junit_path, render_junit(doc))
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json(doc), nl=False)
    else:
        render_verify(doc, _console(no_color, width))
    if not result.ok:
        raise ProgramFailed(f"kernels verify: {len(result.failures)} of {len(result.cases)} case(s) failed "
                            f"(seed {result.seed})", 1)


@kernels.command(name="bench")
@click.option("--target", "target_text", required=True, help="TPU target: v5e, v6e, v5p, v4.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default: tpudiag-runs/<timestamp>-kernels-bench).")
@click.option("--no-static-profile", is_flag=True, help="Skip the static cycle profile (roofline floors only).")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True, help="Compiles at once.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=120, show_default=True,
              help="Seconds allowed for one static-profile compile before falling back to a plain compile.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (schema tpudiag.kernels-bench/1).")
@click.option("--md", "as_md", is_flag=True, help="Print GitHub Markdown.")
@click.option("--no-color", is_flag=True)
@click.option("--width", type=click.IntRange(60, 400), default=None)
@click.argument("names", nargs=-1)
def kernels_bench(target_text, out, no_static_profile, jobs, timeout_s, as_json, as_md, no_color, width, names):
    """Compile kernels, their plain-JAX versions and JAX's own kernels for TPU; compare estimated cycles.

    Exit 1 if a variant failed to lower or compile (the others are still reported)."""
    from rich.console import Console

    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.kernels.bench import run_bench
    from tpudiag.report.kernels_render import render_bench, render_bench_markdown
    from tpudiag.targets import resolve_target

    _cpu_jax()
    resolve_target(target_text)  # a bad target fails before any work
    specs = _kernel_specs(names)
    err = Console(stderr=True, highlight=False)
    doc, _ = run_bench(specs, target_text, out, static_profile=not no_static_profile, jobs=jobs,
                       limits=Limits(static_timeout_s=timeout_s),
                       progress=(lambda line: err.print(line)) if err.is_terminal else None)
    if as_json:
        from tpudiag.report.json_report import render_json

        click.echo(render_json(doc), nl=False)
    elif as_md:
        click.echo(render_bench_markdown(doc), nl=False)
    else:
        render_bench(doc, _console(no_color, width))
    if doc["failed"]:
        raise ProgramFailed(f"kernels bench: {', '.join(doc['failed'])} failed to lower or compile "
                            f"(run directory {doc['artifacts']['run_dir']})", 1)


def _progress():
    """A progress line on stderr while modules compile (counts modules as they finish)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn

    console = Console(stderr=True)
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console, transient=True,
                   disable=not console.is_terminal)
    task = bar.add_task("compiling for TPU...", total=None)
    bar.start()
    done = []

    def on_module(mc):
        done.append(mc)
        bar.update(task, description=f"compiled {len(done)} module(s); last: {mc.name} ({mc.status})")

    return on_module, bar.stop


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps tpudiag errors to one-line messages and exit codes."""
    try:
        cli.main(args=argv, prog_name="tpudiag", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("tpudiag: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except TpudiagError as e:
        if _STATE["debug"]:
            raise
        prefix = "tpudiag: " if isinstance(e, ProgramFailed) else "tpudiag: error: "
        click.echo(f"{prefix}{e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("tpudiag: interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # a bug in tpudiag: say so in one line, traceback with --debug
        if _STATE["debug"]:
            raise
        click.echo(f"tpudiag: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        sys.exit(70)
    sys.exit(0)
