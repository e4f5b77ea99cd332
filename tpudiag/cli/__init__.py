"""The `tpudiag` command line: options in, an api call, a renderer out, an exit code.

`group` holds the click group; `run` (profile, compile), `read` (report, targets, fusions, hlo-diff,
compare, export) and `kernels` register their commands on it; `common` has what they share.
`main()` is the only place that calls `sys.exit`: it maps tpudiag's errors to one line on stderr
and an exit code (errors.py), with the traceback only under --debug. An interrupted command
(Ctrl-C: 130, SIGTERM: 143, SIGHUP: 129) leaves with `os._exit` once its line is written and flushed.
"""

from __future__ import annotations

import os
import sys

import click

from tpudiag.cli import calibrate, challenge, kernels, read, run, suggest, validate  # noqa: F401  (register the commands)
from tpudiag.cli.group import cli
from tpudiag.errors import GateFailed, ProgramFailed, Terminated, TpudiagError

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps tpudiag errors to one-line messages and exit codes."""
    obj: dict = {"debug": False}  # the group callback records --debug here (click's ctx.obj)
    from tpudiag.capture.workers import disarm, install_handlers

    install_handlers(leave=_leave)  # one Ctrl-C, SIGTERM or SIGHUP ends every worker process at once
    try:
        _main(argv, obj)
    finally:
        disarm()


def _main(argv: list[str] | None, obj: dict) -> None:
    from tpudiag.capture.workers import raise_if_stopping

    try:
        cli.main(args=argv, prog_name="tpudiag", standalone_mode=False, obj=obj)
        raise_if_stopping()  # a signal whose exception was dropped (workers.py) still ends as one
    except (click.exceptions.Abort, KeyboardInterrupt):  # click turns KeyboardInterrupt into Abort
        _stopped()
    except click.ClickException as e:  # a bad option or argument: one line, as every other error
        if type(e).__name__ == "NoArgsIsHelpError":  # `tpudiag` or a group alone: its help
            e.show()
            sys.exit(e.exit_code)
        where = getattr(getattr(e, "ctx", None), "command_path", None)
        hint = f" (see {where} --help)" if isinstance(e, click.UsageError) and where else ""
        message = " ".join(e.format_message().split())
        click.echo(f"tpudiag: error: {message}{hint}", err=True)
        sys.exit(e.exit_code)
    except Terminated as e:
        _interrupted(f"tpudiag: error: {e}", e.exit_code)
    except TpudiagError as e:
        if obj["debug"]:
            raise
        # A failed program or gate is a verdict, not an error of tpudiag or of its input.
        prefix = "tpudiag: " if isinstance(e, (ProgramFailed, GateFailed)) else "tpudiag: error: "
        click.echo(f"{prefix}{e}", err=True)
        sys.exit(e.exit_code)
    except Exception as e:  # a bug in tpudiag: say so in one line, traceback with --debug
        if obj["debug"]:
            raise
        click.echo(f"tpudiag: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        sys.exit(70)
    sys.exit(0)


def _stopped() -> None:
    """A KeyboardInterrupt reached main: Ctrl-C, or a thread's KeyboardInterrupt that got here before
    the SIGTERM or SIGHUP that stopped tpudiag, whose exit code it then takes."""
    from tpudiag.capture.workers import stop_exception

    _leave(stop_exception())


def _leave(stop: BaseException) -> None:
    """Out, for a stop: its one line and exit code (also from the stop watch thread, capture/workers.py)."""
    if isinstance(stop, Terminated):
        _interrupted(f"tpudiag: error: {stop}", stop.exit_code)
    _interrupted("tpudiag: interrupted", 130)


def _interrupted(line: str, code: int) -> None:
    """One line, flushed, then out without the interpreter's teardown: XLA's own threads (a compile,
    an asynchronous dispatch) may still be running when a signal cuts a command short, and
    finalizing jax's modules under them ended in a segmentation fault (exit 139) in 7 of 8 Ctrl-Cs of
    `tpudiag kernels verify` at 3-6 s. Everything a command writes is written in its own `finally`
    blocks before the exception arrives here."""
    import signal

    from tpudiag.capture.rundir import release_unused_claims

    release_unused_claims()  # os._exit runs no atexit hook
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal while leaving changes nothing
        try:
            signal.signal(signum, signal.SIG_IGN)
        except ValueError:  # not the main thread (the stop watch): os._exit comes next anyway
            break
    click.echo(line, err=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)
