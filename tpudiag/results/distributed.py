"""The `tpudiag.distributed/1` report: one multi-process job (or one pod's hosts) seen together.
Every field is documented in docs/distributed.md; times are seconds, sizes bytes. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpudiag.model import Model

SCHEMA = "tpudiag.distributed/1"


@dataclass(frozen=True)
class ProcessSummary(Model):
    """One process: what it ran, and where its traced time went (totals over its traced window,
    averaged over its devices)."""

    process_id: int
    host: str
    xplane: str | None
    devices: tuple[str, ...]
    exit_code: int | None
    status: str | None
    reason: str | None
    run_dir: str | None  # its own run directory (`tpudiag report` gives its op-level report)
    offset_s: float  # added to its timestamps to put it on the job's clock
    steps: int
    step_time_s: float | None  # median of its own steps
    busy_s: float  # any op running, per device
    compute_s: float  # non-collective ops, per device
    communication_s: float  # collectives (their waiting included), per device
    hidden_communication_s: float  # collective time with compute running beside it on the device
    exposed_communication_s: float
    wait_s: float  # collective time above the fastest device's, per device: time spent waiting for others
    overlap_ratio: float | None  # hidden / communication (nsys-jax, HolisticTraceAnalysis)


@dataclass(frozen=True)
class CollectiveRow(Model):
    """One collective op of the program, over all its executions and devices."""

    kind: str
    module: str
    op: str
    source: str | None
    message_bytes: int | None  # nccl-tests' size (per device)
    replica_groups: str | None
    group_size: int  # devices per group (every device when the HLO names no groups)
    instances: int  # executions matched across processes
    devices: int  # devices seen executing it
    duration_s: float  # median over instances of the median device's duration
    fastest_s: float  # median over instances of the fastest device's duration (the others include waiting)
    algbw_bytes_per_s: float | None  # message_bytes / fastest_s
    busbw_bytes_per_s: float | None  # algbw x the nccl-tests factor of its kind and group size
    wait_s: float  # total over instances and devices of duration - fastest
    arrival_spread_s: float  # median over instances of last start - first start
    per_process_s: dict[str, float]  # "p<I>" -> median duration on that process's devices


@dataclass(frozen=True)
class StepSkew(Model):
    """One step (of the reference process's step annotations): its collectives' skew."""

    step: int | None  # step_num; None when the trace has no step annotations (the whole window)
    collectives: int  # instances that began in it
    communication_s: float  # sum of the fastest durations
    max_spread_s: float  # the largest arrival spread of one instance
    last_process: int | None  # who arrived last at that instance: the others waited for it
    op: str | None  # that instance's op
    wait_s: dict[str, float]  # "p<I>" -> its waiting in this step (mean over its devices)


@dataclass(frozen=True)
class Waiting(Model):
    """`waiter` spent `wait_s` in collectives at which `waited_for` arrived last."""

    waiter: int
    waited_for: int
    wait_s: float
    instances: int


@dataclass(frozen=True)
class Straggler(Model):
    """A process that arrived last at the step's most skewed collective in `steps_last` of `steps`
    steps (HolisticTraceAnalysis's straggler definition)."""

    process_id: int
    steps_last: int
    steps: int
    mean_lag_s: float  # its mean arrival lag at those instances
    caused_wait_s: float  # the others' waiting at the instances it arrived last at


@dataclass(frozen=True)
class Segment(Model):
    """One op on one device in the drawn step (the HTML page's timeline, one lane per process and
    device). A collective's waiting (its time above the fastest device's) is its own segment, first."""

    lane: str  # "p<I> <device>"
    op: str
    module: str
    category: str  # collective | waiting | compute
    start_s: float  # from the step's start on the job's clock
    duration_s: float


@dataclass(frozen=True)
class DistributedReport(Model):
    SCHEMA = SCHEMA

    schema: str
    status: str  # ok | failed (a process failed; what was traced is still analyzed)
    reason: str | None
    program: str | None
    backend: str  # cpu | gpu | tpu
    num_processes: int
    devices: int
    alignment: str  # "host clock" | "first shared collective"
    alignment_note: str
    processes: tuple[ProcessSummary, ...]
    collectives: tuple[CollectiveRow, ...]
    steps: tuple[StepSkew, ...]
    waiting: tuple[Waiting, ...]
    stragglers: tuple[Straggler, ...]
    communication_s: float  # all processes: per-device averages summed over processes
    hidden_communication_s: float
    exposed_communication_s: float
    overlap_ratio: float | None
    unmatched_instances: int  # executions seen on some processes only
    warnings: tuple[str, ...] = ()
    artifacts: dict[str, str | None] = field(default_factory=dict)
    # The reference process's median step, every process's ops in it: drawn by the HTML page,
    # rebuilt from the traces by `tpudiag report`, not written to report.json (it can be large).
    timeline_step: int | None = field(default=None, metadata={"json": False})
    timeline: tuple[Segment, ...] = field(default=(), metadata={"json": False})
