"""`manifest.json`, the record every run directory starts with, as a typed model (docs/run-directory.md).

Profile, shadow, compile and kernels-bench runs share `schema`, `kind`, `status`, `exit_code`,
`reason`, `wall_s` and `versions`; the other fields belong to some kinds only and are None where a
run has none. `read` in `capture/rundir.py` validates a manifest once, naming the field that is
wrong; `capture.rundir.RunDir` writes it. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpudiag.model import Model

SCHEMA = "tpudiag.manifest/1"
_ABSENT = {"omit_none": True}


def _opt():
    return field(default=None, metadata=_ABSENT)


@dataclass(frozen=True)
class ProcessEntry(Model):
    """One process of a `profile --processes N` job, as the job's manifest lists it."""

    process_id: int
    pid: int
    run_dir: str  # its own run directory, relative to the job's: processes/p<I>
    status: str  # running | ok | failed
    exit_code: int | None = _opt()
    reason: str | None = _opt()
    stopped_by_tpudiag: bool | None = _opt()  # ended early because another process failed, or the time limit
    wall_s: float | None = _opt()
    trace_started: bool | None = _opt()
    joined_cluster: bool | None = _opt()
    xplane: str | None = _opt()  # relative to the job's run directory


@dataclass(frozen=True)
class Manifest(Model):
    SCHEMA = SCHEMA

    schema: str
    kind: str  # profile | shadow | compile | kernels-bench
    status: str  # running | ok | failed
    exit_code: int | None = _opt()
    reason: str | None = _opt()
    wall_s: float | None = _opt()
    versions: dict[str, str | None] | None = _opt()
    pid: int | None = _opt()  # the tpudiag process writing the run
    host: str | None = _opt()
    program: str | None = _opt()
    argv: tuple[str, ...] | None = _opt()
    # profile and shadow runs
    command: str | None = _opt()
    cwd: str | None = _opt()
    env: dict[str, str] | None = _opt()
    steps: int | None = _opt()
    skip: int | None = _opt()
    python_trace: bool | None = _opt()
    started_at: str | None = _opt()
    trace_started: bool | None = _opt()
    steps_entered: int | None = _opt()
    xplanes: tuple[str, ...] | None = _opt()
    program_pid: int | None = _opt()
    left_running: tuple[int, ...] | None = _opt()  # background processes the program left behind
    # A fixed CPU loop, timed before the program, after traced steps and after it (capture/child.py);
    # `calibration_loop` names the loop (absent: the OpenBLAS matmul loop, timed before and after only).
    calibration_s: tuple[float, ...] | None = _opt()
    calibration_loop: str | None = _opt()
    # profile --processes N: the job's manifest lists its processes; each process's own run
    # directory (processes/p<I>) has process_id, num_processes and coordinator
    num_processes: int | None = _opt()
    devices_per_process: int | None = _opt()
    process_timeout_s: float | None = _opt()
    coordinator: str | None = _opt()  # host:port of the jax.distributed coordinator
    processes: tuple[ProcessEntry, ...] | None = _opt()
    process_id: int | None = _opt()
    joined_cluster: bool | None = _opt()  # the program called jax.distributed.initialize
    # compile and kernels-bench runs
    target: dict[str, Any] | None = _opt()
    static_profile: bool | None = _opt()
    source: dict[str, Any] | None = _opt()
    kernels: tuple[str, ...] | None = _opt()

    @property
    def is_compile(self) -> bool:
        return self.kind == "compile"
