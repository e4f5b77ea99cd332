"""Runs a Python script in a child process with the profiler on and XLA/JAX dumps enabled.

Writes the run directory (see `rundir.py`): the manifest first with status `running`, then the
program's log, the trace and the dumps, then the manifest again with the final status. The child's
lifecycle (start, output, signals, how it ended) is `process.py`'s. It does not parse or analyze
anything.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from tpudiag.capture import rundir
from tpudiag.capture.process import (ChildSpec, ProgramProcess, check_program, child_env, forwarding_signals,
                                     recorded_env)


@dataclass(frozen=True)
class CaptureResult:
    run_dir: Path
    exit_code: int
    status: str  # "ok" | "failed"
    reason: str | None
    # The signal reaching tpudiag that was passed on to the program (SIGINT, SIGTERM, SIGHUP), or None:
    # the user stopped the run, and a command that would go on (`compile SCRIPT`) stops too.
    stop_signal: int | None = None


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
    check_program(script, steps, skip)
    given, run = run, run.resolve()  # the child gets absolute paths; the user sees the path they gave
    cenv = child_env(run, env)
    fields = {
        "program": str(script),
        "argv": [str(script), *args],
        "command": "tpudiag profile " + shlex.join([
            *(["--steps", str(steps)] if steps is not None else []), *(["--skip", str(skip)] if skip else []),
            *(["--python-trace"] if python_trace else []), str(script), *(["--", *args] if args else [])]),
        "cwd": os.getcwd(),
        "env": recorded_env(cenv),
        "steps": steps,
        "skip": skip,
        "python_trace": python_trace,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": None,  # the program's own wall time, set when it ends
    }
    rd = rundir.RunDir(run, "profile" if trace else "shadow", rundir.PROFILE_SUBDIRS, **fields)
    spec = ChildSpec(script, tuple(args), steps=steps, skip=skip, python_trace=python_trace, trace=trace,
                     distributed=cluster)
    with ProgramProcess(rd, spec, cenv, stdout=program_stdout, stderr=program_stderr) as proc:
        if while_waiting:
            threading.Thread(target=while_waiting, daemon=True).start()
        with forwarding_signals(proc.send_signal, "the program", active=proc.running) as forwarded:
            proc.wait()
        exit_code, reason = proc.finish()
    return CaptureResult(run_dir=given, exit_code=exit_code, status=rd.manifest["status"], reason=reason,
                         stop_signal=forwarded.first)
