"""What every tpudiag command shares: the output options, one `emit(result, fmt)` that prints a
result through the renderer registry (`report/registry.py`), progress on stderr, the --ci bundle,
the version check and the check of the paths a command will write.

Renderers live in `report/`; this module only names the format and says where the text goes.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import click

from tpudiag.errors import UsageError


class FiniteFloat(click.FloatRange):
    """click's FloatRange that also refuses nan and inf (one line, as every bad option): nan passes
    every range check, so `--timeout nan` was a limit that never fired, and `--static-memory inf`
    ended in an internal error (int(inf)); `validate --k nan` failed a correct port."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


# The width of a console whose output is not a terminal (piped, redirected, CI logs) and was given
# no --width: wide enough that no line is wrapped or table squeezed for a terminal that is not there.
NATURAL_WIDTH = 1 << 15


def console(no_color: bool = False, width: int | None = None):
    """The console a terminal report is printed on: `width` columns, else `COLUMNS` where the
    environment sets it, else the terminal's; piped output (stdout not a terminal) is plain text at
    its natural width (rich then writes no colour either), so a path or an op name is never split
    for a terminal that is not there."""
    import os

    from rich.console import Console

    if width is None and os.environ.get("COLUMNS", "").strip().isdigit() and int(os.environ["COLUMNS"]) > 0:
        width = int(os.environ["COLUMNS"])
    out = Console(no_color=no_color, width=width, highlight=False, soft_wrap=False)
    if width is None and not out.is_terminal:
        out = Console(no_color=no_color, width=NATURAL_WIDTH, highlight=False, soft_wrap=False)
    return out


def output_format(as_json: bool, as_md: bool = False) -> str:
    """The `--json`/`--md` flags as one format name (the two are exclusive)."""
    if as_json and as_md:
        raise UsageError("choose one of --json and --md")
    return "json" if as_json else "md" if as_md else "text"


def emit(result, fmt: str, *, no_color: bool = False, width: int | None = None, **options) -> None:
    """Print a result (a model with `to_dict()`, or a document) to stdout as `fmt`: JSON exactly
    as `report.json` holds it, GitHub Markdown, or the terminal report. The renderer is the
    registry's (`report/registry.py`); `options` go to it (`top=`, `unchanged=`, `show_all=`)."""
    from tpudiag.report.registry import render, renderer

    if fmt == "text":
        renderer(result, "terminal")(result, console(no_color, width), **options)
    else:
        click.echo(render(result, fmt, **options), nl=False)


def calibration_options(f):
    """--calibration FILE and --no-calibration (the command takes `calibration_file` and
    `no_calibration`; `calibration_choice` turns them into the api's argument)."""
    f = click.option("--no-calibration", is_flag=True,
                     help="Price ops at the data sheet's figures alone, not at the chip's measured calibration.")(f)
    f = click.option("--calibration", "calibration_file", type=click.Path(path_type=Path, dir_okay=False),
                     default=None, help="A calibration table `tpudiag calibrate` wrote (default: the one tpudiag "
                                        "ships for the target's chip: tpudiag calibrate --show v5e).")(f)
    return f


def calibration_choice(calibration_file, no_calibration):
    """The api's `calibration`: a path, None (the table shipped for the target's chip) or False (none)."""
    if calibration_file is not None and no_calibration:
        raise click.UsageError("--calibration and --no-calibration: choose one")
    return False if no_calibration else calibration_file


def output_options(schema: str):
    def decorate(f):
        f = click.option("--width", type=click.IntRange(60, 400), default=None,
                         help="Terminal report width (default: the terminal's).")(f)
        f = click.option("--no-color", is_flag=True, help="Plain terminal output.")(f)
        f = click.option("--md", "as_md", is_flag=True,
                         help="Print GitHub-flavoured Markdown (for $GITHUB_STEP_SUMMARY).")(f)
        f = click.option("--json", "as_json", is_flag=True, help=f"Print JSON to stdout (schema {schema}).")(f)
        return f
    return decorate


def ci_options(f):
    f = click.option("--max-artifact-mb", type=FiniteFloat(0, min_open=True), default=None,
                     help="With --ci: the most tpudiag-artifacts.tar.gz may weigh, compressed, in MB "
                          "(default 50); what does not fit is left out and listed in its BUNDLE.txt.")(f)
    f = click.option("--ci", is_flag=True,
                     help="Also write RUN/tpudiag-artifacts.tar.gz (reports, trace, HLO, LLO summaries) "
                          "for a CI artifact upload, and print its path (docs/ci.md).")(f)
    return f


def ci_budget(ci: bool, max_artifact_mb: float | None) -> float | None:
    """The bundle budget in MB, or None without --ci; checked before anything runs."""
    if max_artifact_mb is not None and not ci:
        raise UsageError("--max-artifact-mb needs --ci")
    if not ci:
        return None
    from tpudiag.capture.bundle import DEFAULT_MAX_ARTIFACT_MB

    return DEFAULT_MAX_ARTIFACT_MB if max_artifact_mb is None else max_artifact_mb


def write_ci_bundle(run_dir: Path, max_mb: float, report, program_failed: bool) -> None:
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


def check_versions() -> None:
    """Refuse a jax/jaxlib/libtpu combination known to crash, before anything runs; warn on an
    untested one."""
    from tpudiag.compat import check_installed
    from tpudiag.errors import IncompatibleVersions

    check = check_installed()
    for line in check.warnings:
        click.echo(f"tpudiag: warning: {line}", err=True)
    if check.refusals:
        raise IncompatibleVersions(check.refusals[0])


def check_outputs(run_dir: Path | None = None, *, force: bool = False, **files: Path | None) -> None:
    """Every path the command will write checked before any work starts, so an unwritable one is a
    one-line error, not a failure after the run: the run directory, and each single file by its
    kind (`html=`, `perfetto=`, `junit=`: `outputs.FILE_KINDS`), whose name must have that
    format's extension and which must not exist unless `force` (`--force`). The api functions
    check the paths again for notebook callers (tpudiag/outputs.py)."""
    from tpudiag.outputs import check_extension, check_output_file, check_run_dir

    if run_dir is not None:
        check_run_dir(run_dir)
    for kind, path in files.items():
        if path is None:
            continue
        # `--out RUN --html RUN/report.html`: RUN is created before the file is written (and is new).
        if run_dir is not None and Path(path).parent.resolve() == Path(run_dir).resolve():
            check_extension(path, kind)
        else:
            check_output_file(path, kind, overwrite=force)


def force_option(what: str):
    """`--force`: replace an existing file named by the command's `what` option(s)."""
    return click.option("--force", is_flag=True,
                        help=f"Replace the {what} file if it exists (by default an existing file is refused).")


def program_args(args) -> list[str]:
    """The program's own arguments, without the `--` that separates them from tpudiag's."""
    args = list(args)
    return args[1:] if args and args[0] == "--" else args


def debug_on() -> bool:
    return bool((click.get_current_context().find_root().obj or {}).get("debug"))


# `compile_setup_group` starts its setup modules as one: "3 setup module(s)"; each then ends alone.
_SETUP_GROUP = re.compile(r"^(\d+) setup module\(s\)$")


def progress():
    """Progress of a TPU compile on stderr, never inside the program's or the report's output.
    Returns (on_module, stop). `on_module(None)` says a compile is coming (a script may still be
    running and printing: nothing is shown yet), a `ModuleStarted` that a module (or the group of
    setup modules) began, a `ModuleCompile` that a module finished. On a terminal: one transient
    line from the first module on, with how many finished and each module whose static profile is
    running, with the CPU seconds it has used against its limit. Elsewhere (piped, CI logs): one
    plain line per module as it finishes, with its name, status and wall seconds."""
    import threading
    import time

    from rich.console import Console

    from tpudiag.capture.tpu_compile import ModuleStarted
    from tpudiag.report.units import printable

    err = Console(stderr=True)
    done, running, group_done = [], {}, {}
    lock = threading.Lock()  # modules start and finish on the compile's worker threads

    def how(mc) -> str:
        return f"{mc.status}, from the compile cache" if getattr(mc, "cached", None) else mc.status

    def record(ev) -> float | None:
        """Book `ev` (under the lock); for a finished module, when its compile (or its group's) began."""
        if isinstance(ev, ModuleStarted):
            running[ev.name] = (ev, time.monotonic())
            return None
        done.append(ev)
        entry = running.pop(ev.name, None)
        if entry is None and getattr(ev, "setup", False) and not getattr(ev, "cached", None):
            for name in list(running):
                m = _SETUP_GROUP.match(name)
                if m:
                    entry = running[name]
                    group_done[name] = group_done.get(name, 0) + 1
                    if group_done[name] >= int(m.group(1)):  # the group's last module: the group is done
                        del running[name]
                    break
        return None if entry is None else entry[1]

    if not err.is_terminal:
        def on_finished(ev):
            if ev is None:
                return
            with lock:
                t0 = record(ev)
            if isinstance(ev, ModuleStarted):
                return
            took = "" if t0 is None else f", {time.monotonic() - t0:.1f} s"
            if getattr(ev, "setup", False) and t0 is not None:
                took += " (with the setup group)"
            why = f": {ev.error.strip()}" if ev.status != "ok" and ev.error else ""
            if (ev.static_profile or "").startswith("dropped"):  # the report says why (the compiler's log)
                why += "; static profile dropped"
            click.echo(printable(f"tpudiag: module {ev.name}: {how(ev)}{took}{why}")[:300], err=True)
        return on_finished, lambda: None

    from rich.progress import Progress, ProgressColumn, SpinnerColumn
    from rich.text import Text

    def line() -> str:
        parts = [f"compiling for TPU: {len(done)} module(s) done"]
        if done:
            parts.append(f"last {done[-1].name} ({how(done[-1])})")
        for name, (ev, t0) in list(running.items()):
            if ev.static_limit_s is None:
                parts.append(f"{name}: compiling, {time.monotonic() - t0:.0f} s")
            else:
                parts.append(f"{name}: static profile, {ev.cpu_s():.0f} of {ev.static_limit_s:.0f} s CPU "
                             f"({time.monotonic() - t0:.0f} s wall)")
        return printable("; ".join(parts))

    class _Line(ProgressColumn):
        def render(self, task) -> Text:
            return Text(line(), no_wrap=True, overflow="ellipsis")  # one line, cut to the terminal

    bar = Progress(SpinnerColumn(), _Line(), console=err, transient=True)
    bar.add_task("compile", total=None)

    def on_module(ev):
        if ev is None:
            return  # a script may still be printing: the line starts with the first module
        with lock:
            if not bar.live.is_started:
                bar.start()
            record(ev)

    def stop():
        if bar.live.is_started:
            bar.stop()

    return on_module, stop


def static_profile_options(timeout_default: float):
    """`--timeout` and `--static-memory`: the limits of one module's static-profile attempt, past
    which it is compiled again without the profile (`static_limits` turns them into `Limits`)."""
    def deco(f):
        f = click.option("--static-memory", "static_memory_gib", type=FiniteFloat(0.1), default=8,
                         show_default=True,
                         help="GiB of memory one module's static profile may use before it is dropped (it grows "
                              "with sequence length: a 1024-token attention block needs more than 8).")(f)
        f = click.option("--timeout", "timeout_s", type=FiniteFloat(0.01), default=timeout_default,
                         show_default=True,
                         help="CPU seconds the static profile of a module with up to 9 matmuls may take; a "
                              "module with more gets proportionally more, up to 6x. A busy machine does not "
                              "shrink it.")(f)
        return f
    return deco


def static_limits(static_cpu_s: float, static_memory_gib: float, compile_timeout_s: float | None = None):
    """The `Limits` of `--timeout` (`static_cpu_s`: CPU seconds of one module's static profile; the
    commands' parameter is still `timeout_s`, click's name for it), `--static-memory` and
    `--compile-timeout`."""
    from tpudiag.capture.tpu_compile import Limits

    return Limits(static_timeout_s=static_cpu_s, memory_bytes=int(static_memory_gib * 2**30),
                  compile_timeout_s=compile_timeout_s)


def compile_timeout_option(f):
    """`--compile-timeout`: the CPU seconds one module's plain compile may take."""
    return click.option("--compile-timeout", "compile_timeout_s", type=FiniteFloat(1), default=None,
                        help="CPU seconds one module's compile (without the static profile) may take "
                             "(default: 300 s for up to 9 matmuls, proportionally more for a larger module, "
                             "up to 6000 s).")(f)


def step_compile_timeout_option(help_text: str):
    """`--compile-timeout` of `estimate` and `plan`: CPU seconds one whole step's compile may take,
    1800 by default. Not `compile_timeout_option`'s default (300 s per 9 matmuls, up to 20x) on
    purpose: a step lowered for a slice is one large module, and a 32-layer 8B step for 256 chips
    compiles for minutes on a 2-core machine; a fixed, stated figure is what a user can plan for."""
    return click.option("--compile-timeout", "compile_timeout_s", type=FiniteFloat(1), default=1800,
                        show_default=True, help=help_text)


def selection_options(f):
    """`--function` and `--module`: which modules a command works on (capture/select.py)."""
    f = click.option("--module", "modules", multiple=True, metavar="NAME|INDEX",
                     help="Only this module: its number as the run numbers them (modules/03-jit_step is 3), or "
                          "its name (or part of it). Repeatable.")(f)
    f = click.option("--function", "functions", multiple=True, metavar="NAME",
                     help="Only the module of this jitted function (jax names it jit_NAME). Repeatable.")(f)
    return f


def selection(functions, modules):
    """The `Selection` of `--function` and `--module`."""
    from tpudiag.capture.select import Selection

    return Selection(tuple(functions), tuple(modules))


def cache_options(f):
    f = click.option("--no-cache", is_flag=True,
                     help="Compile every module afresh, neither reading nor filling the compile cache.")(f)
    f = click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
                     help="The compile cache (default $TPUDIAG_CACHE_DIR, else ~/.cache/tpudiag/compile): a module "
                          "compiled for the same target before is copied from it, not compiled again.")(f)
    return f


def use_cache_options(cache_dir: Path | None, no_cache: bool) -> None:
    """`--cache-dir` / `--no-cache` for this process (capture/compile_cache.py reads the environment)."""
    import os

    if no_cache:
        os.environ["TPUDIAG_NO_CACHE"] = "1"
    elif cache_dir is not None:
        os.environ["TPUDIAG_CACHE_DIR"] = str(cache_dir)
        os.environ.pop("TPUDIAG_NO_CACHE", None)
