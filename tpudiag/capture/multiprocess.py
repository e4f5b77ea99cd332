"""Runs N processes of one program with JAX's multi-controller runtime on this machine
(`tpudiag profile --processes N`), each under the profiler, and supervises them as one job.

The program calls `jax.distributed.initialize()` as it would on a pod; each process's child
(`child.py`) supplies the coordinator's address (127.0.0.1 at a free port; a port taken between
choosing and binding is retried with another), the process count, its id, and gloo for CPU
collectives. `--devices-per-process K` appends `--xla_force_host_platform_device_count=K`.

Layout (docs/run-directory.md):

    RUN/manifest.json                     processes[]: id, pid, exit code, status, reason, trace
    RUN/processes/p<I>/                   process I's own profile run directory (`tpudiag report` reads it)
    RUN/trace/plugins/profile/<session>/<host>-p<I>.xplane.pb   hard links to every process's trace,
                                          one session as XProf lays out a pod's hosts

A process that fails (non-zero exit, a signal) or a run past `job_wall_s` (`--process-timeout`,
wall seconds) stops the others:
SIGINT to each (the child then writes its trace; not SIGTERM, which jax's distributed runtime takes
for a preemption notice and handles itself), SIGKILL after `_GRACE_S` (a process blocked in a
collective cannot run Python; it usually fails by itself once its peer's connection closes).
tpudiag's exit code is the first failing process's (124 for the time limit).

Each process lives as a `process.ProgramProcess` (the lifecycle a single `profile` shares): its run
directory stays open until the job's outcome is recorded, so an exception on the way kills the
programs and leaves every process's manifest `failed`, never `running`. It does not analyze
anything (that is `analyze/distributed/collectives.py`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from tpudiag.capture import rundir
from tpudiag.capture.process import (ChildSpec, ProgramProcess, check_program, child_env, describe_signal,
                                     forwarding_signals, recorded_env)
from tpudiag.capture.runner import CaptureResult
from tpudiag.errors import InputError

# SIGINT to SIGKILL, for processes tpudiag stops. An interrupted process writes its trace first:
# under a 2-core machine's full load that took more than 5 s (a lost trace in CI), so 15.
_GRACE_S = 15.0
_PORT_TRIES = 3
# What the coordinator (process 0) prints when its port is taken; it then dies (SIGSEGV in jaxlib).
_BIND_FAILED = (b"Failed to add port to server", b"Address already in use")
TIMED_OUT_EXIT = 124  # as timeout(1)


def process_dir(i: int) -> str:
    return f"{rundir.PROCESSES_DIR}/p{i}"


def free_port() -> int:
    """A TCP port free on every interface now (the coordinator binds [::]:PORT; IPv4 where the
    machine has no IPv6)."""
    for family in ((socket.AF_INET6,) if socket.has_ipv6 else ()) + (socket.AF_INET,):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                return s.getsockname()[1]
        except OSError:
            continue
    raise InputError("no free TCP port for the jax.distributed coordinator on this machine")


def _check(script: Path, processes: int, devices_per_process: int | None, job_wall_s: float | None, steps: int | None,
           skip: int) -> None:
    """The script first, then the job's options, then the step window: the order errors are reported in."""
    check_program(script, None, 0)
    if processes < 1:
        raise InputError(f"--processes must be at least 1 (got {processes})")
    if devices_per_process is not None and devices_per_process < 1:
        raise InputError(f"--devices-per-process must be at least 1 (got {devices_per_process})")
    if job_wall_s is not None and job_wall_s <= 0:
        raise InputError(f"--process-timeout must be more than 0 seconds (got {job_wall_s:g})")
    check_program(script, steps, skip)


def run_processes(
    script: Path,
    args: list[str],
    run: Path,
    *,
    processes: int,
    devices_per_process: int | None = None,
    job_wall_s: float | None = None,
    steps: int | None = None,
    skip: int = 0,
    python_trace: bool = False,
    coordinator_port: int | None = None,
    program_stdout: IO[bytes] | None = None,
    program_stderr: IO[bytes] | None = None,
    env: dict[str, str] | None = None,
    while_waiting: Callable[[], object] | None = None,
) -> CaptureResult:
    """Run `processes` copies of `script args` as one multi-process JAX job, writing `run` (new).

    Each process's output goes to its own `program.log` and, each line marked `[pI]`, to
    `program_stdout` / `program_stderr` (default: ours). `coordinator_port`: the first port tried
    (default: a free one).
    """
    _check(script, processes, devices_per_process, job_wall_s, steps, skip)
    given, run = run, run.resolve()
    opts = [*(["--steps", str(steps)] if steps is not None else []), *(["--skip", str(skip)] if skip else []),
            *(["--python-trace"] if python_trace else []), "--processes", str(processes),
            *(["--devices-per-process", str(devices_per_process)] if devices_per_process else []),
            *(["--process-timeout", f"{job_wall_s:g}"] if job_wall_s else [])]
    base = dict(os.environ if env is None else env)
    fields = {
        "program": str(script),
        "argv": [str(script), *args],
        "command": "tpudiag profile " + shlex.join([*opts, str(script), *(["--", *args] if args else [])]),
        "cwd": os.getcwd(),
        "env": recorded_env(base),
        "steps": steps,
        "skip": skip,
        "python_trace": python_trace,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "num_processes": processes,
        "devices_per_process": devices_per_process,
        "process_timeout_s": job_wall_s,
        "wall_s": None,
    }
    launch = _Launch(script, tuple(args), base, processes, devices_per_process, steps, skip, python_trace,
                     program_stdout or sys.stdout.buffer, program_stderr or sys.stderr.buffer)
    with rundir.RunDir(run, "profile", (rundir.TRACE_DIR, rundir.PROCESSES_DIR), **fields) as rd:
        if while_waiting:
            threading.Thread(target=while_waiting, daemon=True).start()
        port = coordinator_port or free_port()
        for attempt in range(_PORT_TRIES):
            rd.update(coordinator=f"127.0.0.1:{port}")
            outcome = _attempt(rd, launch, port, job_wall_s, may_retry=attempt + 1 < _PORT_TRIES)
            if outcome is not None:
                break
            sys.stderr.write(f"tpudiag: coordinator port {port} was taken; retrying with another\n")
            shutil.rmtree(run / rundir.PROCESSES_DIR)
            (run / rundir.PROCESSES_DIR).mkdir()
            port = free_port()
        exit_code, reason = outcome.failure if outcome.failure else (0, None)
        rd.finish(outcome.failure is None, exit_code=exit_code, reason=reason, wall_s=round(outcome.wall_s, 6),
                  processes=outcome.rows, xplanes=outcome.xplanes,
                  trace_started=any(r["trace_started"] for r in outcome.rows))
    return CaptureResult(run_dir=given, exit_code=exit_code, status=rd.manifest["status"], reason=reason)


@dataclass(frozen=True)
class _Launch:
    """What every process of the job runs, and where its output goes."""

    script: Path
    args: tuple[str, ...]
    base_env: dict[str, str]
    n: int
    devices_per_process: int | None
    steps: int | None
    skip: int
    python_trace: bool
    out: IO[bytes]
    err: IO[bytes]

    def processes(self, run: Path, port: int) -> Iterator[ProgramProcess]:
        """Process I of the job with the coordinator at `port`, its run directory RUN/processes/pI;
        each is created when the one before has been started."""
        width = len(str(self.n - 1))
        coordinator = f"127.0.0.1:{port}"
        for i in range(self.n):
            prun = run / process_dir(i)
            cenv = child_env(prun, self.base_env)
            if self.devices_per_process:
                cenv["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={self.devices_per_process}"
            rd = rundir.RunDir(prun, "profile", rundir.PROFILE_SUBDIRS, program=str(self.script),
                               argv=[str(self.script), *self.args], process_id=i, num_processes=self.n,
                               coordinator=coordinator, steps=self.steps, skip=self.skip,
                               python_trace=self.python_trace, env=recorded_env(cenv), cwd=os.getcwd(),
                               started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=None)
            spec = ChildSpec(self.script, self.args, steps=self.steps, skip=self.skip, python_trace=self.python_trace,
                             distributed={"coordinator": coordinator, "num_processes": self.n, "process_id": i})
            yield ProgramProcess(rd, spec, cenv, stdout=self.out, stderr=self.err, share_stdin=i == 0,
                                 prefix=f"[p{i:0{width}d}] ".encode(), index=i)


@dataclass(frozen=True)
class _Outcome:
    rows: list[dict]  # the job manifest's `processes`
    xplanes: list[str]  # the traces linked as one session
    failure: tuple[int, str] | None  # the job's exit code and reason
    wall_s: float


def _attempt(rd: rundir.RunDir, launch: _Launch, port: int, job_wall_s: float | None, *,
             may_retry: bool) -> _Outcome | None:
    """Run the job once with the coordinator at `port`. Every process's run directory stays open
    until the job's outcome is known: an exception anywhere from the first launch to the linked
    traces kills the programs still running and leaves each process's manifest `failed`. None when
    the coordinator could not bind its port and `may_retry`: the processes' manifests then say so,
    and the caller removes them."""
    with ExitStack() as stack:
        t0 = time.perf_counter()
        procs = [stack.enter_context(p) for p in launch.processes(rd.path, port)]
        rd.update(processes=[{"process_id": p.index, "pid": p.pid, "run_dir": process_dir(p.index),
                              "status": "running"} for p in procs])
        timed_out, interrupted = _supervise(procs, job_wall_s)
        wall_s = time.perf_counter() - t0
        if may_retry and _bind_failed(procs[0]):
            for p in procs:
                p.rd.finish(False, reason="coordinator port taken; retried")
            return None
        rows = _record(procs)
        xplanes = _gather_traces(rd.path, rows)
        return _Outcome(rows, xplanes, _first_failure(procs, rows, timed_out, job_wall_s, interrupted), wall_s)


def _supervise(procs: list[ProgramProcess], job_wall_s: float | None) -> tuple[bool, bool]:
    """Wait for every process. The first to fail, the time limit or a signal to tpudiag stops the
    rest: SIGINT, then SIGKILL after the grace period. Returns (time limit hit, interrupted)."""
    start = time.monotonic()
    stop_at: float | None = None  # when the stop began
    timed_out = False

    def begin_stop(reason: str) -> None:
        nonlocal stop_at
        if stop_at is None:
            stop_at = time.monotonic()
        for p in procs:
            if p.code is None:
                p.stopped = p.stopped or reason
                p.signal_group(signal.SIGINT)

    def forward(signum: int) -> None:
        """Ctrl-C reaches every process (SIGINT: each writes its trace); a second one SIGTERM, a third SIGKILL."""
        for p in procs:
            if p.code is None:
                p.signal_group(signum)

    with forwarding_signals(forward, "the processes") as ctrl_c:
        while any(p.code is None for p in procs):
            now = time.monotonic()
            # every process's state first, then what to do about it
            ended = [p for p in procs if p.code is None and p.poll() is not None]
            failed = sorted((p for p in ended if p.code != 0 and p.stopped is None), key=_program_end)
            if failed and stop_at is None and not ctrl_c.count:
                first = failed[0]
                begin_stop(f"stopped by tpudiag after process {first.index} failed ({_how(first.code)})")
            if job_wall_s is not None and stop_at is None and not ctrl_c.count and now - start > job_wall_s:
                timed_out = True
                begin_stop(f"stopped by tpudiag: still running after --process-timeout {job_wall_s:g} s")
            if (stop_at is not None and now - stop_at > _GRACE_S) or ctrl_c.count >= 3:
                for p in procs:
                    if p.code is None:
                        p.signal_group(signal.SIGKILL)
            time.sleep(0.05)
    return timed_out, bool(ctrl_c.count)


def _program_end(p: ProgramProcess) -> tuple[int, float]:
    """When the process's program ended, by its own clock (capture/child.json), else when tpudiag
    saw it exit: a process that failed because its peer had died ends after that peer's program."""
    try:
        end = json.loads((p.rd.path / rundir.CHILD_STATUS).read_text()).get("program_end_ns")
    except (OSError, ValueError):
        end = None
    return (0, float(end)) if isinstance(end, (int, float)) else (1, p.ended_s or 0.0)


def _how(code: int) -> str:
    return f"killed by {describe_signal(code)}" if code < 0 else f"exit code {code}"


def _bind_failed(p: ProgramProcess) -> bool:
    """Process 0 (the coordinator) died because its port was taken."""
    if p.code == 0 or p.code is None:
        return False
    p.close_output()
    try:
        log = (p.rd.path / rundir.PROGRAM_LOG).read_bytes()
    except OSError:
        return False
    return any(m in log for m in _BIND_FAILED)


def _record(procs: list[ProgramProcess]) -> list[dict]:
    """Each process's manifest finished; the rows the job's manifest lists."""
    rows = []
    for p in procs:
        exit_code, reason = p.finish()
        m = p.rd.manifest
        rows.append({"process_id": p.index, "pid": p.pid, "run_dir": process_dir(p.index),
                     "exit_code": exit_code, "status": m["status"], "reason": reason,
                     "stopped_by_tpudiag": p.stopped is not None, "wall_s": m.get("wall_s"),
                     "trace_started": bool(m.get("trace_started")),
                     "joined_cluster": m.get("joined_cluster"),
                     "xplane": f"{process_dir(p.index)}/{m['xplanes'][-1]}" if m.get("xplanes") else None})
    return rows


def _gather_traces(run: Path, rows: list[dict]) -> list[str]:
    """Every process's xplane, linked into one session under RUN/trace as `<host>-p<I>.xplane.pb`
    (XProf's layout for a pod's hosts: `xprof --logdir RUN/trace` shows them side by side)."""
    found = [(r, run / r["xplane"]) for r in rows if r["xplane"]]
    if not found:
        return []
    session = run / rundir.TRACE_DIR / "plugins" / "profile" / found[0][1].parent.name
    session.mkdir(parents=True, exist_ok=True)
    out = []
    for r, src in found:
        dst = session / f"{src.name.removesuffix('.xplane.pb')}-p{r['process_id']}.xplane.pb"
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
        out.append(str(dst.relative_to(run)))
    return out


def _first_failure(procs: list[ProgramProcess], rows: list[dict], timed_out: bool, job_wall_s,
                   interrupted: bool) -> tuple[int, str] | None:
    """(exit code, reason) of the job: Ctrl-C, the process that failed first by itself, or the time limit."""
    if interrupted:
        return 130, "interrupted (Ctrl-C): every process was stopped"
    own = sorted((p for p in procs if p.code not in (0, None) and p.stopped is None), key=_program_end)
    if own:
        row = rows[own[0].index]
        return row["exit_code"], f"process {own[0].index} failed: {row['reason']}"
    if timed_out:
        return TIMED_OUT_EXIT, f"still running after --process-timeout {job_wall_s:g} s: every process was stopped"
    bad = [r for r in rows if r["exit_code"] != 0]
    if bad:
        return bad[0]["exit_code"], f"process {bad[0]['process_id']} failed: {bad[0]['reason']}"
    return None
