"""One program process under tpudiag, from its start to its recorded end: the lifecycle that
`runner.py` (one process) and `multiprocess.py` (a job of N) share.

`ProgramProcess` is a context manager around one process's `RunDir`: entering creates the run
directory (manifest `running`), writes the child's spec (`capture/spec.json`), starts the child
bootstrap (`child.py`) in its own process group and tees its stdout and stderr to tpudiag's (each
line prefixed, for one process among several) and to `program.log`. `finish` reads what the child
recorded (`capture/child.json`) and /proc (what the program left running) and returns the exit code
and reason tpudiag reports. An exception escaping the block kills the program's process group and
leaves the manifest `failed`, never `running`. `forwarding_signals` passes SIGINT, SIGTERM and
SIGHUP reaching tpudiag on to the program(s), Ctrl-C escalating.

It does not decide when a job's processes are stopped (that is `multiprocess.py`), and it parses
no artifact.
"""

from __future__ import annotations

import glob
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from tpudiag.capture import rundir
from tpudiag.errors import InputError

# Environment variables recorded in the manifest (the flags that change what is captured).
RECORDED_ENV = ("XLA_FLAGS", "JAX_DUMP_IR_TO", "JAX_PLATFORMS", "LIBTPU_INIT_ARGS", "TPU_NAME",
                "CUDA_VISIBLE_DEVICES", "JAX_ENABLE_X64")
# How long the program's output pipes may stay open after the program ended: a background process
# it started (a data-loader daemon, a server) keeps them open, and must not keep tpudiag waiting.
PIPE_GRACE_S = 1.0
# Dumps the CPU backend writes that no report reads (LLVM IR and object code, one per kernel):
# 1.5 MB for a 3-op MLP. Pruned after the run; the HLO text, buffer assignment and memory
# report stay.
_PRUNED_SUFFIXES = (".ll", ".o")
# What repeated Ctrl-C sends, for a program that ignores it: the trace is lost only at the third.
_CTRL_C_ESCALATION = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def check_program(script: Path, steps: int | None, skip: int) -> None:
    """The script and the step window a profile asks for, before anything is created."""
    if not script.exists():
        raise InputError(f"{script}: no such file")
    if not script.is_file():
        raise InputError(f"{script}: not a file (give a Python script)")
    if steps is not None and steps < 1:
        raise InputError(f"--steps must be at least 1 (got {steps})")
    if skip < 0:
        raise InputError(f"--skip must be 0 or more (got {skip})")


def default_platforms() -> str | None:
    """JAX_PLATFORMS for a host with no TPU chip, so libtpu does not probe for one.

    With jax[tpu] installed on a machine without a TPU, jax tries libtpu first, prints a page of
    "could not determine TPU accelerator type" warnings, then falls back. TPU VMs expose their
    chips as /dev/accel* (v4, v5p) or /dev/vfio/* (v5e, v6e); without either we skip the probe.
    """
    if tpu_attached():
        return None
    return "cuda,cpu" if glob.glob("/dev/nvidia[0-9]*") else "cpu"


def tpu_attached() -> bool:
    """Whether this machine has a TPU's device files (/dev/accel* or VFIO groups), whether or not
    another program holds the chip; no jax import."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def child_env(run: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the user's, plus dump flags that must be set before jax loads."""
    env = dict(os.environ if base is None else base)
    # Quoted: XLA splits XLA_FLAGS on spaces, and a run directory may contain one.
    dump = f'--xla_dump_to="{run / rundir.HLO_DIR}" --xla_dump_hlo_as_text'
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + dump).strip()
    env["JAX_DUMP_IR_TO"] = str(run / rundir.IR_DIR)
    if "JAX_PLATFORMS" not in env and (platforms := default_platforms()):
        env["JAX_PLATFORMS"] = platforms
    env["PYTHONUNBUFFERED"] = "1"  # keep the program's stdout and stderr in order in the log
    # Several processes (tests, workers) may load libtpu: without this the second one fails on its lock file.
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return env


def recorded_env(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment a manifest records."""
    return {k: env[k] for k in RECORDED_ENV if k in env}


def describe_signal(code: int) -> str:
    """`SIGKILL` for a return code of -9."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def prune_dumps(hlo_dir: Path) -> int:
    removed = 0
    for p in hlo_dir.iterdir() if hlo_dir.is_dir() else ():
        if p.is_file() and p.suffix in _PRUNED_SUFFIXES:
            p.unlink()
            removed += 1
    return removed


@dataclass(frozen=True)
class ChildSpec:
    """What the child bootstrap runs; written as `capture/spec.json` in the process's run directory.
    `distributed`: what `jax.distributed.initialize()` gets in the child (`child._join_cluster`)."""

    script: Path
    args: tuple[str, ...] = ()
    steps: int | None = None
    skip: int = 0
    python_trace: bool = False
    trace: bool = True
    distributed: dict | None = None

    def document(self, run: Path) -> dict:
        return {"run_dir": str(run), "script": str(self.script), "args": list(self.args), "steps": self.steps,
                "skip": self.skip, "python_trace": self.python_trace, "trace": self.trace,
                "parent_pid": os.getpid(), **({"distributed": self.distributed} if self.distributed else {})}


def _tee(src: IO[bytes], sinks: list[IO[bytes]], stop: threading.Event, prefix: bytes = b"",
         prefixed: tuple[IO[bytes], ...] = ()) -> None:
    """Copy `src` to every sink until EOF, or until `stop` is set and nothing more is waiting.
    Sinks in `prefixed` get whole lines only, each with `prefix` before it (one process's output
    among several: a line is held until its newline, so two processes' partial writes, such as
    `print("sum", x)` unbuffered, never interleave within a line)."""
    fd = src.fileno()
    held = b""  # the prefixed sinks' unfinished line

    def write(data: bytes, to_prefixed: bool) -> None:
        for s in sinks:
            if (s in prefixed) != to_prefixed:
                continue
            try:
                s.write(data)
                s.flush()
            except (ValueError, OSError):  # a closed terminal must not stop the log
                pass

    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk and (ready or stop.is_set()):  # EOF, or stopped with nothing waiting
            if held:
                write(prefix + held, True)
            return
        if not chunk:
            continue
        write(chunk, False)
        if prefixed:
            held += chunk
            done, nl, held = held.rpartition(b"\n")
            if nl:
                write(prefix + (done + nl).replace(b"\n", b"\n" + prefix)[:-len(prefix) or None], True)


def _group_members(pgid: int) -> list[int]:
    """Pids still in process group `pgid` (the program's background processes), from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":  # state, ppid, pgrp
            out.append(int(stat.parent.name))
    return sorted(out)


def _stdin(share: bool):
    """The program reads what tpudiag reads when that is a pipe or a file (`echo hi | tpudiag
    profile prog.py`). A terminal is not passed on: the program runs in its own process group,
    where reading the terminal would stop it (SIGTTIN)."""
    if not share:
        return subprocess.DEVNULL
    try:
        return subprocess.DEVNULL if os.isatty(0) else None
    except OSError:
        return subprocess.DEVNULL


class ProgramProcess:
    """One program run by the child bootstrap in its own run directory, as a context manager:

        with ProgramProcess(RunDir(path, "profile", **fields), ChildSpec(script, args), env) as p:
            with forwarding_signals(p.send_signal, "the program", active=p.running):
                p.wait()
            exit_code, reason = p.finish()

    `stdout`/`stderr`: where the program's output goes besides `program.log` (default: ours), each
    line there marked with `prefix`. `share_stdin`: whether the program may read tpudiag's standard
    input. `index`: its process id in a job. `stopped`: why tpudiag ended it early (another process
    failed, the time limit), set by whoever stops it.
    """

    def __init__(self, rd: rundir.RunDir, spec: ChildSpec, env: dict[str, str], *,
                 stdout: IO[bytes] | None = None, stderr: IO[bytes] | None = None, share_stdin: bool = True,
                 prefix: bytes = b"", index: int = 0):
        self.rd, self.spec, self.env, self.index = rd, spec, env, index
        self._out = stdout or sys.stdout.buffer
        self._err = stderr or sys.stderr.buffer
        self._share_stdin, self._prefix = share_stdin, prefix
        self._stdin = _stdin(share_stdin)
        # The program reads nothing from a terminal tpudiag has: say so if it fails on end of input.
        self._stdin_withheld = self._stdin is subprocess.DEVNULL and share_stdin
        self.popen: subprocess.Popen | None = None
        self.t0 = 0.0
        self.code: int | None = None  # the return code, once seen
        self.ended_s: float | None = None  # seconds from the start to when tpudiag saw it end
        self.stopped: str | None = None
        self._log: IO[bytes] | None = None
        self._tees: list[threading.Thread] = []
        self._stop_tees = threading.Event()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def __enter__(self) -> ProgramProcess:
        self.rd.__enter__()
        try:
            spec_path = self.rd.path / rundir.CAPTURE_DIR / "spec.json"
            spec_path.write_text(json.dumps(self.spec.document(self.rd.path)))
            self._log = open(self.rd.path / rundir.PROGRAM_LOG, "wb")
            self.t0 = time.perf_counter()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tpudiag.capture.child", str(spec_path)],
                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=self._stdin,
                # Its own process group: a terminal Ctrl-C reaches only us, and we forward it once,
                # so the child is not interrupted a second time while it writes the trace.
                process_group=0,
            )
            self.rd.update(program_pid=self.popen.pid)
            prefixed = (self._out, self._err) if self._prefix else ()
            self._tees = [threading.Thread(target=_tee, args=(src, [sink, self._log], self._stop_tees, self._prefix,
                                                              prefixed), daemon=True)
                          for src, sink in ((self.popen.stdout, self._out), (self.popen.stderr, self._err))]
            for t in self._tees:
                t.start()
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Close the output and the run directory; when an exception escapes, the program is killed
        first (with its process group) and the manifest says `failed` with the exception."""
        try:
            if exc is not None and self.popen is not None and self.popen.poll() is None:
                self.signal_group(signal.SIGKILL)
                self.popen.wait()
            self.close_output()
        finally:
            self.rd.__exit__(exc_type, exc, tb)
        return False

    def poll(self) -> int | None:
        """The return code once the program has ended (then also `code` and `ended_s`), else None."""
        if self.code is None and (code := self.popen.poll()) is not None:
            self.code, self.ended_s = code, time.perf_counter() - self.t0
        return self.code

    def running(self) -> bool:
        return self.poll() is None

    def wait(self) -> int:
        if self.code is None:
            code = self.popen.wait()
            self.code, self.ended_s = code, time.perf_counter() - self.t0
        return self.code

    def send_signal(self, sig: int) -> None:
        """To the program's own process (the child bootstrap), not its group."""
        self.popen.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        """To the program and everything it started in its process group."""
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close_output(self) -> None:
        """Copy what is left of the program's output, then close its log: a background process that
        holds the pipes gets `PIPE_GRACE_S`, then is no longer read."""
        if self._log is None or self._log.closed:
            return
        deadline = time.monotonic() + PIPE_GRACE_S
        for t in self._tees:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._stop_tees.set()
        for t in self._tees:
            t.join()
        self._log.close()

    def finish(self) -> tuple[int, str | None]:
        """Record how the ended program went in its manifest: its exit code and reason (the child's
        own account, or the signal that killed it), what it traced and left running. When tpudiag
        stopped it (`stopped`), that is the reason unless it failed first. Returns (exit code, reason)."""
        self.close_output()
        run, code = self.rd.path, self.code
        left_running = _group_members(self.popen.pid)
        child = {}
        child_path = run / rundir.CHILD_STATUS
        if child_path.is_file():
            child = json.loads(child_path.read_text())
        if code < 0:
            exit_code, reason = 128 - code, f"killed by {describe_signal(code)}"
        else:
            exit_code = code
            reason = child.get("reason") if code else None
            if code and reason is None:
                reason = f"program exited with code {code}"
        if code and reason and "EOFError" in reason and self._stdin_withheld:
            reason += ("; its standard input was not this terminal (a program under tpudiag cannot read one): "
                       "pipe or redirect its input (tpudiag profile prog.py < FILE)")
        if self.stopped is not None:
            reason = f"{self.stopped}; it then ended: {reason}" if reason else self.stopped
            exit_code = exit_code or 1
        if not child and code == 0:
            exit_code, reason = 1, "the tpudiag child ended without recording the program's status"
        prune_dumps(run / rundir.HLO_DIR)
        extra = {"joined_cluster": child["joined_cluster"]} if "joined_cluster" in child else {}
        if child.get("calibration_loop"):  # which loop `calibration_s` timed; absent in older runs
            extra["calibration_loop"] = child["calibration_loop"]
        self.rd.finish(exit_code == 0, exit_code=exit_code, reason=reason, wall_s=round(self.ended_s or 0.0, 6),
                       trace_started=bool(child.get("trace_started")), steps_entered=child.get("steps_entered"),
                       xplanes=[str(p.relative_to(run)) for p in rundir.find_xplanes(run / rundir.TRACE_DIR)],
                       left_running=left_running, calibration_s=child.get("calibration_s"), **extra)
        return exit_code, reason


@dataclass
class CtrlC:
    """How many times Ctrl-C reached tpudiag while signals were forwarded, and the first signal that
    was forwarded (SIGINT, SIGTERM or SIGHUP: the user stopped the program; None: nothing was)."""

    count: int = 0
    first: int | None = None


@contextmanager
def forwarding_signals(deliver: Callable[[int], object], whom: str, *,
                       active: Callable[[], bool] = lambda: True) -> Iterator[CtrlC]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP reaching tpudiag are passed to `deliver`
    (while `active()`) instead of stopping tpudiag. Ctrl-C escalates, for a program that ignores it:
    the second one sends SIGTERM, the third SIGKILL (the trace is then lost; the run still says why).
    SIGHUP too: a closed terminal ends the program as it would have ended a plain `python prog.py`;
    unless tpudiag runs with SIGHUP ignored (`nohup tpudiag ...`), which the program inherits too.
    Handlers can be set in the main thread only: elsewhere nothing is forwarded."""
    ctrl_c = CtrlC()

    def forward(signum, _frame):
        if not active():
            return
        if ctrl_c.first is None:
            ctrl_c.first = signum
        if signum == signal.SIGINT:
            ctrl_c.count += 1
            signum = _CTRL_C_ESCALATION[min(ctrl_c.count, 3) - 1]
            if ctrl_c.count == 2:
                sys.stderr.write(f"tpudiag: interrupted again: sending SIGTERM; a third Ctrl-C kills {whom}\n")
        deliver(signum)

    forwarded = (signal.SIGINT, signal.SIGTERM) + (
        (signal.SIGHUP,) if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else ())
    previous = {s: signal.signal(s, forward) for s in forwarded} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        yield ctrl_c
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
