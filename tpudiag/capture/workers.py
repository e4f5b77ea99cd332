"""The worker processes tpudiag starts (TPU compiles, the estimate's lowering, the chip bench), and
how one Ctrl-C, SIGTERM or SIGHUP ends them all at once.

Each worker runs in its own session (`popen`: `start_new_session=True`), so the terminal's Ctrl-C
reaches tpudiag alone, and is registered while it runs. `install_handlers` (the CLI, main thread)
makes SIGINT, SIGTERM and SIGHUP (a closed terminal; not under `nohup`, which ignores it) call
`stop_all` first, which kills every registered worker's process group and sets `stopping()`, and
then raise KeyboardInterrupt or `Terminated` (exit 143, 129). A thread waiting on a worker sees
`stopping()` and raises KeyboardInterrupt instead of reporting the killed worker as a failed
compile; so a thread pool's shutdown never waits out a compile. `parent_death.die_with_parent`,
called first thing in a worker, has Linux SIGKILL it when tpudiag itself dies (kill -9), so no
worker is ever left running alone.

A signal that lands inside a garbage-collection callback or a `__del__` (jax's `_xla_gc_callback`
runs often during a verify, and during imports) raises where Python cannot propagate it: the
exception is dropped (`sys.unraisablehook`), the stop stays recorded, and `redeliver` has the
signal handled again 50 ms later, from a timer thread (`_thread.interrupt_main`), where it raises at
the main thread's next ordinary bytecode. Before that, a dropped SIGTERM in `kernels verify` ended
the command only after its current case, 20-30 s later. Long loops also call `raise_if_stopping()`
between their steps. The profiled program's bootstrap (`child.py`) redelivers its own the same way.

No handler runs while the main thread waits in C (an interpret-mode computation in XLA, a long
import). For the CLI (`install_handlers(leave=...)`, disarmed when its `main` returns) a stop watch
thread sees each stop signal as it arrives (`signal.set_wakeup_fd`), kills the workers at once, and
`FORCE_AFTER_S` later, if the stop is still pending, records it in the open run directories
(`on_forced_stop`) and leaves through `leave`.
"""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from tpudiag.parent_death import PARENT_ENV

_LIVE: set[int] = set()
_LOCK = threading.Lock()
_STOP = threading.Event()
_SIGNUM: list[int] = []  # the signal that stopped tpudiag, once one has
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long after a stop was dropped (raised inside a gc callback) its signal is handled again: long
# enough to be out of the callback (they take microseconds), short beside the 5 s a stop may take.
REDELIVER_S = 0.05


def popen(args, **kwargs) -> subprocess.Popen:
    """`subprocess.Popen` in a new session, registered until `forget(proc)`; refused (KeyboardInterrupt)
    once tpudiag is stopping."""
    if _STOP.is_set():
        raise KeyboardInterrupt
    # Who started it: a worker whose parent died before it could ask to die with it (parent_death)
    # sees the difference and stops.
    kwargs["env"] = {**(kwargs.get("env") or os.environ), PARENT_ENV: str(os.getpid())}
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
    if _STOP.is_set():
        raise stop_exception()


def stopped_by() -> int | None:
    """The signal that stopped this command (SIGINT, SIGTERM, SIGHUP), or None; still known after a
    run directory has handled the stop (`reset`), so that the exit code says which it was."""
    return _SIGNUM[-1] if _SIGNUM else None


def stop_exception(signum: int | None = None) -> BaseException:
    """What a stop by `signum` (default: the one that stopped tpudiag) raises: KeyboardInterrupt for
    Ctrl-C (and for a stop with no signal), `Terminated` (exit 128 + its number) for the others."""
    from tpudiag.errors import Terminated

    signum = stopped_by() if signum is None else signum
    return KeyboardInterrupt() if signum in (None, signal.SIGINT) else Terminated(signum)


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


def install_handlers(leave: Callable[[BaseException], object] | None = None) -> None:
    """SIGINT, SIGTERM and SIGHUP stop every worker before the usual KeyboardInterrupt /
    `Terminated`. Main thread only (Python's rule); a context that installs its own handler (the
    profiled program's signal forwarding) restores these after. `leave` (the CLI's: its one line,
    then out with the stop's exit code) arms the stop watch: a stop still unhandled FORCE_AFTER_S
    after its signal is ended by `leave`, once the open run directories are marked."""
    if threading.current_thread() is not threading.main_thread():
        return
    reset()
    _SIGNUM.clear()
    for signum in STOP_SIGNALS:
        if signum != signal.SIGHUP or signal.getsignal(signum) is not signal.SIG_IGN:  # `nohup tpudiag`
            signal.signal(signum, on_stop_signal)
    if getattr(sys.unraisablehook, "__name__", "") != _drop_stop.__name__:
        _drop_stop.previous = sys.unraisablehook
        sys.unraisablehook = _drop_stop
    if leave is not None:
        _LEAVE[:] = [leave]
        if not _WATCH:
            read, write = os.pipe()
            os.set_blocking(write, False)
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            _WATCH.append(threading.Thread(target=_watch, args=(read,), daemon=True, name="tpudiag-stop-watch"))
            _WATCH[0].start()


# How long after a stop signal tpudiag may still be running before the stop watch ends it. The main
# thread raises a stop at its next Python bytecode, but none runs while it waits in C: a kernel's
# interpret-mode computation in `kernels verify` kept a SIGTERM waiting 39 s. The watch thread sees
# the signal at once (`signal.set_wakeup_fd`), kills the workers, and at this deadline marks the
# open run directories and leaves. A stop must end tpudiag within 5 s; a handled one takes well under 1 s.
FORCE_AFTER_S = 3.0
_WATCH: list[threading.Thread] = []
_LEAVE: list[Callable[[BaseException], object]] = []
_OPEN: dict[int, Callable[[BaseException], object]] = {}  # what to record if a stop is forced (run directories)


def disarm() -> None:
    """The command is over (`cli.main` returns or raises SystemExit): the stop watch does nothing more
    in this process (a test's own process, which runs many)."""
    _LEAVE.clear()


def on_forced_stop(key: int, record: Callable[[BaseException], object] | None) -> None:
    """Register (or, with None, forget) what to record under `key` if a stop has to be forced."""
    with _LOCK:
        if record is None:
            _OPEN.pop(key, None)
        else:
            _OPEN[key] = record


def _watch(fd: int) -> None:
    """The stop watch thread: a stop signal that tpudiag's own handler is set for (not one passed on
    to a profiled program) starts the deadline; at the deadline a stop still set (not handled:
    `reset` clears it) is forced."""
    import select

    deadline = None
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        stops = [s for s in (os.read(fd, 64) if ready else b"")
                 if _LEAVE and s in STOP_SIGNALS and signal.getsignal(s) is on_stop_signal]
        if stops and deadline is None:
            _SIGNUM.append(stops[0])
            stop_all()  # the workers die now, whatever the main thread is doing
            deadline = time.monotonic() + FORCE_AFTER_S
        if deadline is not None and time.monotonic() >= deadline:
            if _STOP.is_set() and _LEAVE:
                _force(_SIGNUM[-1])
            deadline = None


def _force(signum: int) -> None:
    stop = stop_exception(signum)
    with _LOCK:
        records = list(_OPEN.values())
    for record in records:
        try:
            record(stop)
        except Exception:  # a run directory that cannot be written must not keep tpudiag running
            pass
    if _LEAVE:
        _LEAVE[0](stop)
    os._exit(getattr(stop, "exit_code", 130))



def _drop_stop(unraisable) -> None:
    """The stop raised inside a gc callback or `__del__` is dropped without a traceback and handled
    again shortly (`redeliver`); anything else goes to the previous hook."""
    from tpudiag.errors import Terminated

    if _STOP.is_set() and isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
        redeliver(_SIGNUM[-1] if _SIGNUM else signal.SIGINT)
        return
    _drop_stop.previous(unraisable)


def redeliver(signum: int, delay_s: float = REDELIVER_S) -> None:
    """Have `signum`'s handler run again in the main thread in `delay_s`, as if the signal came again
    (a stop whose exception was dropped). Nothing happens if the signal is ignored by then."""
    timer = threading.Timer(delay_s, _thread.interrupt_main, args=(signum,))
    timer.daemon = True
    timer.start()


def on_stop_signal(signum, frame):
    """SIGINT, SIGTERM, SIGHUP: kill every worker, then raise the stop (`stop_exception`)."""
    _SIGNUM.append(signum)
    stop_all()
    raise stop_exception(signum)
