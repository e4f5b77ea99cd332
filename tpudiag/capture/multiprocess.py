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

A process that fails (non-zero exit, a signal) or a run past `timeout_s` stops the others:
SIGINT to each (the child then writes its trace; not SIGTERM, which jax's distributed runtime takes
for a preemption notice and handles itself), SIGKILL after `_GRACE_S` (a process blocked in a
collective cannot run Python; it usually fails by itself once its peer's connection closes). tpudiag's exit code is the first failing process's
(124 for the time limit). It does not analyze anything (that is `analyze/distributed/collectives.py`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from tpudiag.capture import rundir
from tpudiag.capture.runner import (_RECORDED_ENV, CaptureResult, _describe_signal, _stdin, _tee, child_env,
                                    finish_process)
from tpudiag.errors import InputError

PROCESSES_DIR = "processes"
# SIGINT to SIGKILL, for processes tpudiag stops. An interrupted process writes its trace first:
# under a 2-core machine's full load that took more than 5 s (a lost trace in CI), so 15.
_GRACE_S = 15.0
_PORT_TRIES = 3
# What the coordinator (process 0) prints when its port is taken; it then dies (SIGSEGV in jaxlib).
_BIND_FAILED = (b"Failed to add port to server", b"Address already in use")
TIMED_OUT_EXIT = 124  # as timeout(1)


def process_dir(i: int) -> str:
    return f"{PROCESSES_DIR}/p{i}"


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


@dataclass
class _Proc:
    index: int
    rd: rundir.RunDir
    popen: subprocess.Popen
    log: IO[bytes]
    tees: list[threading.Thread]
    t0: float
    code: int | None = None
    ended_s: float | None = None
    stopped: str | None = None  # why tpudiag ended it
    stop_tees: threading.Event | None = None


def _check(script: Path, processes: int, devices_per_process: int | None, timeout_s: float | None) -> None:
    if not script.exists():
        raise InputError(f"{script}: no such file")
    if not script.is_file():
        raise InputError(f"{script}: not a file (give a Python script)")
    if processes < 1:
        raise InputError(f"--processes must be at least 1 (got {processes})")
    if devices_per_process is not None and devices_per_process < 1:
        raise InputError(f"--devices-per-process must be at least 1 (got {devices_per_process})")
    if timeout_s is not None and timeout_s <= 0:
        raise InputError(f"--process-timeout must be more than 0 seconds (got {timeout_s:g})")


def run_processes(
    script: Path,
    args: list[str],
    run: Path,
    *,
    processes: int,
    devices_per_process: int | None = None,
    timeout_s: float | None = None,
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
    _check(script, processes, devices_per_process, timeout_s)
    if steps is not None and steps < 1:
        raise InputError(f"--steps must be at least 1 (got {steps})")
    if skip < 0:
        raise InputError(f"--skip must be 0 or more (got {skip})")
    given, run = run, run.resolve()
    opts = [*(["--steps", str(steps)] if steps is not None else []), *(["--skip", str(skip)] if skip else []),
            *(["--python-trace"] if python_trace else []), "--processes", str(processes),
            *(["--devices-per-process", str(devices_per_process)] if devices_per_process else []),
            *(["--process-timeout", f"{timeout_s:g}"] if timeout_s else [])]
    base = dict(os.environ if env is None else env)
    fields = {
        "program": str(script),
        "argv": [str(script), *args],
        "command": "tpudiag profile " + shlex.join([*opts, str(script), *(["--", *args] if args else [])]),
        "cwd": os.getcwd(),
        "env": {k: base[k] for k in _RECORDED_ENV if k in base},
        "steps": steps,
        "skip": skip,
        "python_trace": python_trace,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "num_processes": processes,
        "devices_per_process": devices_per_process,
        "process_timeout_s": timeout_s,
        "wall_s": None,
    }
    out = program_stdout or sys.stdout.buffer
    err = program_stderr or sys.stderr.buffer
    with rundir.RunDir(run, "profile", (rundir.TRACE_DIR, PROCESSES_DIR), **fields) as rd:
        if while_waiting:
            threading.Thread(target=while_waiting, daemon=True).start()
        port = coordinator_port or free_port()
        for attempt in range(_PORT_TRIES):
            rd.update(coordinator=f"127.0.0.1:{port}")
            t0 = time.perf_counter()
            procs = _launch(run, script, args, base, port, processes, devices_per_process, steps, skip,
                            python_trace, out, err)
            rd.update(processes=[{"process_id": p.index, "pid": p.popen.pid, "run_dir": process_dir(p.index),
                                  "status": "running"} for p in procs])
            timed_out, interrupted = _supervise(procs, timeout_s)
            wall_s = time.perf_counter() - t0
            if attempt + 1 < _PORT_TRIES and _bind_failed(procs[0]):
                sys.stderr.write(f"tpudiag: coordinator port {port} was taken; retrying with another\n")
                _discard(run, procs)
                port = free_port()
                continue
            break
        rows = _record(procs)
        xplanes = _gather_traces(run, rows)
        failed = _first_failure(procs, rows, timed_out, timeout_s, interrupted)
        exit_code, reason = failed if failed else (0, None)
        rd.finish(failed is None, exit_code=exit_code, reason=reason, wall_s=round(wall_s, 6), processes=rows,
                  xplanes=xplanes, trace_started=any(r["trace_started"] for r in rows))
    return CaptureResult(run_dir=given, exit_code=exit_code, status=rd.manifest["status"], reason=reason)


def _launch(run: Path, script: Path, args, base: dict, port: int, n: int, k: int | None, steps, skip,
            python_trace, out, err) -> list[_Proc]:
    procs = []
    width = len(str(n - 1))
    for i in range(n):
        prun = run / process_dir(i)
        cenv = child_env(prun, base)
        if k:
            cenv["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={k}"
        rd = rundir.RunDir(prun, "profile", rundir.PROFILE_SUBDIRS, program=str(script), argv=[str(script), *args],
                           process_id=i, num_processes=n, coordinator=f"127.0.0.1:{port}", steps=steps, skip=skip,
                           python_trace=python_trace, env={kk: cenv[kk] for kk in _RECORDED_ENV if kk in cenv},
                           cwd=os.getcwd(), started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=None)
        rd.__enter__()  # finished by `finish_process`, closed by `_record`
        spec = prun / rundir.CAPTURE_DIR / "spec.json"
        spec.write_text(json.dumps({"run_dir": str(prun), "script": str(script), "args": list(args), "steps": steps,
                                    "skip": skip, "python_trace": python_trace, "trace": True,
                                    "parent_pid": os.getpid(),
                                    "distributed": {"coordinator": f"127.0.0.1:{port}", "num_processes": n,
                                                    "process_id": i}}))
        log = open(prun / rundir.PROGRAM_LOG, "wb")
        popen = subprocess.Popen([sys.executable, "-m", "tpudiag.capture.child", str(spec)], env=cenv,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=_stdin() if i == 0 else
                                 subprocess.DEVNULL, process_group=0)
        rd.update(program_pid=popen.pid)
        stop = threading.Event()
        prefix = f"[p{i:0{width}d}] ".encode()
        tees = [threading.Thread(target=_tee, args=(popen.stdout, [out, log], stop, prefix, (out,)), daemon=True),
                threading.Thread(target=_tee, args=(popen.stderr, [err, log], stop, prefix, (err,)), daemon=True)]
        for t in tees:
            t.start()
        procs.append(_Proc(i, rd, popen, log, tees, time.perf_counter(), stop_tees=stop))
    return procs


def _signal_group(p: _Proc, sig: int) -> None:
    try:
        os.killpg(p.popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _supervise(procs: list[_Proc], timeout_s: float | None) -> tuple[bool, bool]:
    """Wait for every process. The first to fail, the time limit or a signal to tpudiag stops the
    rest: SIGTERM, then SIGKILL after the grace period. Returns (time limit hit, interrupted)."""
    start = time.monotonic()
    stop_at: float | None = None  # when the stop began
    timed_out = False
    interrupts = [0]
    stop_reason: list[str] = []

    def begin_stop(reason: str, sig: int = signal.SIGINT) -> None:
        nonlocal stop_at
        if stop_at is None:
            stop_at = time.monotonic()
            stop_reason.append(reason)
        for p in procs:
            if p.code is None:
                p.stopped = p.stopped or reason
                _signal_group(p, sig)

    def forward(signum, _frame):
        """Ctrl-C reaches every process (SIGINT: each writes its trace); a second one SIGTERM, a third SIGKILL."""
        if signum == signal.SIGINT:
            interrupts[0] += 1
            signum = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(interrupts[0], 3) - 1]
            if interrupts[0] == 2:
                sys.stderr.write("tpudiag: interrupted again: sending SIGTERM; a third Ctrl-C kills the processes\n")
        for p in procs:
            if p.code is None:
                _signal_group(p, signum)

    forwarded = (signal.SIGINT, signal.SIGTERM) + (
        (signal.SIGHUP,) if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else ())
    previous = {s: signal.signal(s, forward) for s in forwarded} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        while any(p.code is None for p in procs):
            now = time.monotonic()
            ended = []
            for p in procs:  # every process's state first, then what to do about it
                if p.code is None and (code := p.popen.poll()) is not None:
                    p.code, p.ended_s = code, time.perf_counter() - p.t0
                    ended.append(p)
            failed = sorted((p for p in ended if p.code != 0 and p.stopped is None), key=_program_end)
            if failed and stop_at is None and not interrupts[0]:
                first = failed[0]
                begin_stop(f"stopped by tpudiag after process {first.index} failed ({_how(first.code)})")
            if timeout_s is not None and stop_at is None and not interrupts[0] and now - start > timeout_s:
                timed_out = True
                begin_stop(f"stopped by tpudiag: still running after --process-timeout {timeout_s:g} s")
            if (stop_at is not None and now - stop_at > _GRACE_S) or interrupts[0] >= 3:
                for p in procs:
                    if p.code is None:
                        _signal_group(p, signal.SIGKILL)
            time.sleep(0.05)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return timed_out, bool(interrupts[0])


def _program_end(p: _Proc) -> tuple[int, float]:
    """When the process's program ended, by its own clock (capture/child.json), else when tpudiag
    saw it exit: a process that failed because its peer had died ends after that peer's program."""
    try:
        end = json.loads((p.rd.path / rundir.CHILD_STATUS).read_text()).get("program_end_ns")
    except (OSError, ValueError):
        end = None
    return (0, float(end)) if isinstance(end, (int, float)) else (1, p.ended_s or 0.0)


def _how(code: int) -> str:
    return f"killed by {_describe_signal(code)}" if code < 0 else f"exit code {code}"


def _close(p: _Proc) -> None:
    deadline = time.monotonic() + 1.0
    for t in p.tees:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    p.stop_tees.set()
    for t in p.tees:
        t.join()
    p.log.close()


def _bind_failed(p: _Proc) -> bool:
    """Process 0 (the coordinator) died because its port was taken."""
    if p.code == 0 or p.code is None:
        return False
    _close(p)
    try:
        log = (p.rd.path / rundir.PROGRAM_LOG).read_bytes()
    except OSError:
        return False
    return any(m in log for m in _BIND_FAILED)


def _discard(run: Path, procs: list[_Proc]) -> None:
    """Forget an attempt whose coordinator could not bind: its process directories go."""
    for p in procs:
        if not p.log.closed:
            _close(p)
        p.rd.finish(False, reason="coordinator port taken; retried")
        p.rd.__exit__(None, None, None)
    shutil.rmtree(run / PROCESSES_DIR)
    (run / PROCESSES_DIR).mkdir()


def _record(procs: list[_Proc]) -> list[dict]:
    """Each process's manifest finished; the rows the job's manifest lists."""
    rows = []
    for p in procs:
        if not p.log.closed:
            _close(p)
        exit_code, reason = finish_process(p.rd, p.code, p.ended_s or 0.0, p.popen.pid,
                                           stopped=p.stopped)
        p.rd.__exit__(None, None, None)
        m = p.rd.manifest
        rows.append({"process_id": p.index, "pid": p.popen.pid, "run_dir": process_dir(p.index),
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


def _first_failure(procs: list[_Proc], rows: list[dict], timed_out: bool, timeout_s,
                   interrupted: bool) -> tuple[int, str] | None:
    """(exit code, reason) of the job: Ctrl-C, the process that failed first by itself, or the time limit."""
    if interrupted:
        return 130, "interrupted (Ctrl-C): every process was stopped"
    own = sorted((p for p in procs if p.code not in (0, None) and p.stopped is None), key=_program_end)
    if own:
        row = rows[own[0].index]
        return row["exit_code"], f"process {own[0].index} failed: {row['reason']}"
    if timed_out:
        return TIMED_OUT_EXIT, f"still running after --process-timeout {timeout_s:g} s: every process was stopped"
    bad = [r for r in rows if r["exit_code"] != 0]
    if bad:
        return bad[0]["exit_code"], f"process {bad[0]['process_id']} failed: {bad[0]['reason']}"
    return None
