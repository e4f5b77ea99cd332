"""Runs a Python script in a child process with the profiler on and XLA/JAX dumps enabled.

Writes the run directory (see `rundir.py`): the manifest first with status `running`, then the
program's log, the trace and the dumps, then the manifest again with the final status. It does
not parse or analyze anything.
"""

from __future__ import annotations

import glob
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from tpudiag.capture import rundir
from tpudiag.errors import InputError

# Dumps the CPU backend writes that no report reads (LLVM IR and object code, one per kernel):
# 1.5 MB for a 3-op MLP. Pruned after the run; the HLO text, buffer assignment and memory
# report stay.
_PRUNED_SUFFIXES = (".ll", ".o")
# Environment variables recorded in the manifest (the flags that change what is captured).
_RECORDED_ENV = ("XLA_FLAGS", "JAX_DUMP_IR_TO", "JAX_PLATFORMS", "LIBTPU_INIT_ARGS", "TPU_NAME",
                 "CUDA_VISIBLE_DEVICES", "JAX_ENABLE_X64")


@dataclass(frozen=True)
class CaptureResult:
    run_dir: Path
    exit_code: int
    status: str  # "ok" | "failed"
    reason: str | None


# How long the program's output pipes may stay open after the program ended: a background process
# it started (a data-loader daemon, a server) keeps them open, and must not keep tpudiag waiting.
_PIPE_GRACE_S = 1.0


def _tee(src: IO[bytes], sinks: list[IO[bytes]], stop: threading.Event, prefix: bytes = b"",
         prefixed: tuple[IO[bytes], ...] = ()) -> None:
    """Copy `src` to every sink until EOF, or until `stop` is set and nothing more is waiting.
    Sinks in `prefixed` get each line with `prefix` before it (one process's output among several)."""
    fd = src.fileno()
    at_line_start = True
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            if stop.is_set():
                return
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        marked = chunk
        if prefix:
            marked = (prefix if at_line_start else b"") + chunk[:-1].replace(b"\n", b"\n" + prefix) + chunk[-1:]
            at_line_start = chunk.endswith(b"\n")
        for s in sinks:
            try:
                s.write(marked if s in prefixed else chunk)
                s.flush()
            except (ValueError, OSError):  # a closed terminal must not stop the log
                pass


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


def _stdin():
    """The program reads what tpudiag reads when that is a pipe or a file (`echo hi | tpudiag
    profile prog.py`). A terminal is not passed on: the program runs in its own process group,
    where reading the terminal would stop it (SIGTTIN)."""
    try:
        return subprocess.DEVNULL if os.isatty(0) else None
    except OSError:
        return subprocess.DEVNULL


def _default_platforms() -> str | None:
    """JAX_PLATFORMS for a host with no TPU chip, so libtpu does not probe for one.

    With jax[tpu] installed on a machine without a TPU, jax tries libtpu first, prints a page of
    "could not determine TPU accelerator type" warnings, then falls back. TPU VMs expose their
    chips as /dev/accel* (v4, v5p) or /dev/vfio/* (v5e, v6e); without either we skip the probe.
    """
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return None
    return "cuda,cpu" if glob.glob("/dev/nvidia[0-9]*") else "cpu"


def child_env(run: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the user's, plus dump flags that must be set before jax loads."""
    env = dict(os.environ if base is None else base)
    # Quoted: XLA splits XLA_FLAGS on spaces, and a run directory may contain one.
    dump = f'--xla_dump_to="{run / rundir.HLO_DIR}" --xla_dump_hlo_as_text'
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + dump).strip()
    env["JAX_DUMP_IR_TO"] = str(run / rundir.IR_DIR)
    if "JAX_PLATFORMS" not in env and (platforms := _default_platforms()):
        env["JAX_PLATFORMS"] = platforms
    env["PYTHONUNBUFFERED"] = "1"  # keep the program's stdout and stderr in order in the log
    # Several processes (tests, workers) may load libtpu: without this the second one fails on its lock file.
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return env


def _describe_signal(code: int) -> str:
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


def run_program(
    script: Path,
    args: list[str],
    run: Path,
    *,
    steps: int | None = None,
    skip: int = 0,
    python_trace: bool = False,
    trace: bool = True,
    program_stdout: IO[bytes] | None = None,
    program_stderr: IO[bytes] | None = None,
    env: dict[str, str] | None = None,
    while_waiting: Callable[[], object] | None = None,
    cluster: dict | None = None,
) -> CaptureResult:
    """Run `script args` under the profiler, writing the run directory `run` (which must be new).

    `cluster`: what `jax.distributed.initialize()` gets in the child (`child._join_cluster`);
    `{"single": True}` makes it a no-op, the program then being the whole job (`compile`'s run of
    a script written for a pod).

    The program's stdout goes to `program_stdout` (default: our stdout), its stderr to
    `program_stderr` (default: our stderr), and both to `run/program.log`. `while_waiting` runs
    in a thread while the program runs (the CLI imports the analysis stack there: pandas alone
    is ~0.7 s that would otherwise follow the program).
    """
    if not script.exists():
        raise InputError(f"{script}: no such file")
    if not script.is_file():
        raise InputError(f"{script}: not a file (give a Python script)")
    if steps is not None and steps < 1:
        raise InputError(f"--steps must be at least 1 (got {steps})")
    if skip < 0:
        raise InputError(f"--skip must be 0 or more (got {skip})")
    given, run = run, run.resolve()  # the child gets absolute paths; the user sees the path they gave
    cenv = child_env(run, env)
    fields = {
        "program": str(script),
        "argv": [str(script), *args],
        "command": "tpudiag profile " + shlex.join([
            *(["--steps", str(steps)] if steps is not None else []), *(["--skip", str(skip)] if skip else []),
            *(["--python-trace"] if python_trace else []), str(script), *(["--", *args] if args else [])]),
        "cwd": os.getcwd(),
        "env": {k: cenv[k] for k in _RECORDED_ENV if k in cenv},
        "steps": steps,
        "skip": skip,
        "python_trace": python_trace,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": None,  # the program's own wall time, set when it ends
    }
    with rundir.RunDir(run, "profile" if trace else "shadow", rundir.PROFILE_SUBDIRS, **fields) as rd:
        exit_code, reason = _run_child(rd, script, args, cenv, steps=steps, skip=skip, python_trace=python_trace,
                                       trace=trace, program_stdout=program_stdout, program_stderr=program_stderr,
                                       while_waiting=while_waiting, cluster=cluster)
    return CaptureResult(run_dir=given, exit_code=exit_code, status=rd.manifest["status"], reason=reason)


def _run_child(rd, script: Path, args: list[str], cenv: dict[str, str], *, steps, skip, python_trace, trace,
               program_stdout, program_stderr, while_waiting, cluster=None) -> tuple[int, str | None]:
    """Start the child, tee its output, wait for it; record how it ended in the run's manifest."""
    run = rd.path
    spec_path = run / rundir.CAPTURE_DIR / "spec.json"
    spec_path.write_text(json.dumps({"run_dir": str(run), "script": str(script), "args": args,
                                     "steps": steps, "skip": skip, "python_trace": python_trace,
                                     "trace": trace, "parent_pid": os.getpid(),
                                     **({"distributed": cluster} if cluster else {})}))

    out = program_stdout or sys.stdout.buffer
    err = program_stderr or sys.stderr.buffer
    t0 = time.perf_counter()
    with open(run / rundir.PROGRAM_LOG, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tpudiag.capture.child", str(spec_path)],
            env=cenv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=_stdin(),
            # Its own process group: a terminal Ctrl-C reaches only us, and we forward it once,
            # so the child is not interrupted a second time while it writes the trace.
            process_group=0,
        )
        rd.update(program_pid=proc.pid)
        stop = threading.Event()
        tees = [threading.Thread(target=_tee, args=(proc.stdout, [out, log], stop), daemon=True),
                threading.Thread(target=_tee, args=(proc.stderr, [err, log], stop), daemon=True)]
        for t in tees + ([threading.Thread(target=while_waiting, daemon=True)] if while_waiting else []):
            t.start()

        interrupts = [0]

        def forward(signum, _frame):
            """Pass the signal on. Ctrl-C escalates, for a program that ignores it: the second one
            sends SIGTERM, the third SIGKILL (the trace is then lost; the run still says why)."""
            if proc.poll() is not None:
                return
            if signum == signal.SIGINT:
                interrupts[0] += 1
                signum = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(interrupts[0], 3) - 1]
                if interrupts[0] == 2:
                    sys.stderr.write("tpudiag: interrupted again: sending SIGTERM; a third Ctrl-C kills the program\n")
            proc.send_signal(signum)

        # SIGHUP too: a closed terminal ends the program as it would have ended a plain `python prog.py`;
        # unless tpudiag runs with SIGHUP ignored (`nohup tpudiag ...`), which the program inherits too.
        forwarded = (signal.SIGINT, signal.SIGTERM) + (
            (signal.SIGHUP,) if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else ())
        previous = {s: signal.signal(s, forward) for s in forwarded} \
            if threading.current_thread() is threading.main_thread() else {}
        try:
            code = proc.wait()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        deadline = time.monotonic() + _PIPE_GRACE_S
        for t in tees:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stop.set()  # a background process holds the pipes: stop reading once they go quiet
        for t in tees:
            t.join()
    return finish_process(rd, code, time.perf_counter() - t0, proc.pid)


def finish_process(rd, code: int, wall_s: float, pid: int, stopped: str | None = None) -> tuple[int, str | None]:
    """Record how one program process ended in its run directory's manifest: its exit code and
    reason (the child's own account, or the signal that killed it), what it traced and left running.
    `stopped`: why tpudiag ended it early (another process failed, the time limit), which is the
    reason when it did not fail first."""
    run = rd.path
    left_running = _group_members(pid)
    child = {}
    child_path = run / rundir.CHILD_STATUS
    if child_path.is_file():
        child = json.loads(child_path.read_text())
    if code < 0:
        exit_code, reason = 128 - code, f"killed by {_describe_signal(code)}"
    else:
        exit_code = code
        reason = child.get("reason") if code else None
        if code and reason is None:
            reason = f"program exited with code {code}"
    if stopped is not None:
        reason = f"{stopped}; it then ended: {reason}" if reason else stopped
        exit_code = exit_code or 1
    if not child and code == 0:
        exit_code, reason = 1, "the tpudiag child ended without recording the program's status"
    prune_dumps(run / rundir.HLO_DIR)
    extra = {"joined_cluster": child["joined_cluster"]} if "joined_cluster" in child else {}
    rd.finish(exit_code == 0, exit_code=exit_code, reason=reason, wall_s=round(wall_s, 6),
              trace_started=bool(child.get("trace_started")), steps_entered=child.get("steps_entered"),
              xplanes=[str(p.relative_to(run)) for p in rundir.find_xplanes(run / rundir.TRACE_DIR)],
              left_running=left_running, calibration_s=child.get("calibration_s"), **extra)
    return exit_code, reason
