"""What every tpudiag command shares: the output options, one `emit(result, fmt)` that prints a
result through the renderer registry (`report/registry.py`), progress on stderr, the --ci bundle,
the version check and the check of the paths a command will write.

Renderers live in `report/`; this module only names the format and says where the text goes.
"""

from __future__ import annotations

from pathlib import Path

import click

from tpudiag.errors import UsageError


def console(no_color: bool = False, width: int | None = None):
    from rich.console import Console

    return Console(no_color=no_color, width=width, highlight=False, soft_wrap=False)


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
    f = click.option("--max-artifact-mb", type=click.FloatRange(0, min_open=True), default=None,
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


def check_outputs(run_dir: Path | None = None, *files: Path | None) -> None:
    """Every path the command will write (a run directory, --html/--perfetto/--junit files) checked
    before any work starts, so an unwritable one is a one-line error, not a failure after the run.
    The api functions check again for notebook callers (tpudiag/outputs.py)."""
    from tpudiag.outputs import check_output_file, check_run_dir

    if run_dir is not None:
        check_run_dir(run_dir)
    for path in files:
        # `--out RUN --html RUN/report.html`: RUN is created before the file is written.
        if path is not None and not (run_dir is not None and Path(path).parent.resolve() == Path(run_dir).resolve()):
            check_output_file(path)


def program_args(args) -> list[str]:
    """The program's own arguments, without the `--` that separates them from tpudiag's."""
    args = list(args)
    return args[1:] if args and args[0] == "--" else args


def debug_on() -> bool:
    return bool((click.get_current_context().find_root().obj or {}).get("debug"))


def progress():
    """A progress line on stderr while modules compile: how many finished, and each module whose
    static profile is running, with the CPU seconds it has used against its limit. The line appears
    at the first call: `on_module(None)` says the compile started, a `ModuleStarted` that a module
    began, a `ModuleCompile` that it finished, so a program that runs first (`profile --target`)
    keeps the terminal to itself."""
    import time

    from rich.console import Console
    from rich.progress import Progress, ProgressColumn, SpinnerColumn
    from rich.text import Text

    from tpudiag.capture.tpu_compile import ModuleStarted
    from tpudiag.report.units import printable

    err = Console(stderr=True)
    done, running = [], {}

    def line() -> str:
        parts = [f"compiling for TPU: {len(done)} module(s) done"]
        if done:
            mc = done[-1]
            how = f"{mc.status}, from the compile cache" if getattr(mc, "cached", None) else mc.status
            parts.append(f"last {mc.name} ({how})")
        for name, (ev, t0) in list(running.items()):
            if ev.static_limit_s is None:
                parts.append(f"{name}: compiling, {time.monotonic() - t0:.0f} s")
            else:
                parts.append(f"{name}: static profile, {ev.cpu_s():.0f} of {ev.static_limit_s:.0f} s CPU "
                             f"({time.monotonic() - t0:.0f} s wall)")
        return printable("; ".join(parts))

    class _Line(ProgressColumn):
        def render(self, task) -> Text:
            return Text(line())

    bar = Progress(SpinnerColumn(), _Line(), console=err, transient=True, disable=not err.is_terminal)
    bar.add_task("compile", total=None)

    def on_module(ev):
        if not bar.live.is_started:
            bar.start()
        if isinstance(ev, ModuleStarted):
            running[ev.name] = (ev, time.monotonic())
        elif ev is not None:
            running.pop(ev.name, None)
            done.append(ev)

    return on_module, bar.stop


def static_profile_options(timeout_default: float):
    """`--timeout` and `--static-memory`: the limits of one module's static-profile attempt, past
    which it is compiled again without the profile (`static_limits` turns them into `Limits`)."""
    def deco(f):
        f = click.option("--static-memory", "static_memory_gib", type=click.FloatRange(0.1), default=8,
                         show_default=True,
                         help="GiB of memory one module's static profile may use before it is dropped (it grows "
                              "with sequence length: a 1024-token attention block needs more than 8).")(f)
        f = click.option("--timeout", "timeout_s", type=click.FloatRange(0.01), default=timeout_default,
                         show_default=True,
                         help="CPU seconds the static profile of a module with up to 9 matmuls may take; a "
                              "module with more gets proportionally more, up to 6x. A busy machine does not "
                              "shrink it.")(f)
        return f
    return deco


def static_limits(timeout_s: float, static_memory_gib: float):
    """The `Limits` of `--timeout` and `--static-memory`."""
    from tpudiag.capture.tpu_compile import Limits

    return Limits(static_timeout_s=timeout_s, memory_bytes=int(static_memory_gib * 2**30))


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
