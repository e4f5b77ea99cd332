"""The worker processes tpudiag starts (TPU compiles, the estimate's lowering, the chip bench), and
how one Ctrl-C or SIGTERM ends them all at once.

Each worker runs in its own session (`popen`: `start_new_session=True`), so the terminal's Ctrl-C
reaches tpudiag alone, and is registered while it runs. `install_handlers` (the CLI, main thread)
makes SIGINT and SIGTERM call `stop_all` first, which kills every registered worker's process group
and sets `stopping()`, and then raise KeyboardInterrupt or `Terminated` as before. A thread waiting
on a worker sees `stopping()` and raises KeyboardInterrupt instead of reporting the killed worker as
a failed compile; so a thread pool's shutdown never waits out a compile. `parent_death.die_with_parent`,
called first thing in a worker, has Linux SIGKILL it when tpudiag itself dies (kill -9), so no
worker is ever left running alone.

A signal that lands inside a garbage-collection callback or a `__del__` (jax's `_xla_gc_callback`
runs often during a verify) raises where Python cannot propagate it: the exception is dropped
silently here (`sys.unraisablehook`), the stop stays recorded, and long loops call
`raise_if_stopping()` between their steps, so the Ctrl-C still ends the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

_LIVE: set[int] = set()
_LOCK = threading.Lock()
_STOP = threading.Event()
_SIGNUM: list[int] = []  # the signal that stopped tpudiag, once one has


def popen(args, **kwargs) -> subprocess.Popen:
    """`subprocess.Popen` in a new session, registered until `forget(proc)`; refused (KeyboardInterrupt)
    once tpudiag is stopping."""
    if _STOP.is_set():
        raise KeyboardInterrupt
    proc = subprocess.Popen(args, start_new_session=True, **kwargs)
    with _LOCK:
        _LIVE.add(proc.pid)
    if _STOP.is_set():  # a signal between the check and the registration
        _kill(proc.pid)
    return proc


def forget(proc: subprocess.Popen) -> None:
    with _LOCK:
        _LIVE.discard(proc.pid)


def run(args, **kwargs) -> int:
    """`subprocess.run(args).returncode` as a registered worker: a stop kills it and raises
    KeyboardInterrupt here."""
    proc = popen(args, **kwargs)
    try:
        code = proc.wait()
    finally:
        forget(proc)
    if _STOP.is_set():
        raise KeyboardInterrupt
    return code


def stopping() -> bool:
    """True once a signal has told tpudiag to stop: a worker's end is then not its own failure."""
    return _STOP.is_set()


def raise_if_stopping() -> None:
    """Raise the stop a signal asked for (KeyboardInterrupt, or `Terminated` for SIGTERM) where its
    handler's own exception was dropped: a loop calls this between its steps."""
    if not _STOP.is_set():
        return
    if _SIGNUM and _SIGNUM[-1] == signal.SIGTERM:
        from tpudiag.errors import Terminated

        raise Terminated("terminated by signal SIGTERM")
    raise KeyboardInterrupt


def stop_all() -> None:
    """Kill every registered worker's process group now, and refuse new ones."""
    _STOP.set()
    with _LOCK:
        pids = list(_LIVE)
    for pid in pids:
        _kill(pid)


def reset() -> None:
    """Work may start workers again: a new command in this process, or a run whose stop has been
    handled (its workers are gone by then)."""
    _STOP.clear()


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the worker leads its own session: its group is its pid
    except (ProcessLookupError, PermissionError):
        pass


def install_handlers() -> None:
    """SIGINT and SIGTERM stop every worker before the usual KeyboardInterrupt / `Terminated`. Main
    thread only (Python's rule); a context that installs its own handler (the profiled program's
    signal forwarding) restores these after."""
    if threading.current_thread() is not threading.main_thread():
        return
    reset()
    _SIGNUM.clear()
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if getattr(sys.unraisablehook, "__name__", "") != _drop_stop.__name__:
        _drop_stop.previous = sys.unraisablehook
        sys.unraisablehook = _drop_stop


def _drop_stop(unraisable) -> None:
    """The stop raised inside a gc callback or `__del__` is dropped without a traceback (it is
    recorded: `raise_if_stopping`); anything else goes to the previous hook."""
    from tpudiag.errors import Terminated

    if _STOP.is_set() and isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
        return
    _drop_stop.previous(unraisable)


def _on_sigint(signum, frame):
    _SIGNUM.append(signum)
    stop_all()
    raise KeyboardInterrupt


def _on_sigterm(signum, frame):
    from tpudiag.errors import Terminated

    _SIGNUM.append(signum)
    stop_all()
    raise Terminated(f"terminated by signal {signal.Signals(signum).name}")
