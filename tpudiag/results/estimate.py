"""The `tpudiag.estimate/1` result: one step of a program at scale on a TPU slice, its time split by
what bounds it (`StepBreakdown`), the ops that take longest, MFU and HBM per device
(docs/estimate.md has every field). Built by `analyze.compile.estimate.build_estimate`. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpudiag.model import Model

SCHEMA = "tpudiag.estimate/1"


@dataclass(frozen=True)
class StepBreakdown(Model):
    """Where the estimated step time goes, per device (each op's time x its runs, by what bounds it)."""

    compute_s: float  # ops bound by the MXU peak or the compiler's static cycles
    hbm_s: float  # ops bound by HBM bandwidth
    collective_s: float  # collectives' exposed time (the ICI model, less the compute scheduled beside them)
    hidden_collective_s: float  # collective time the schedule hides behind compute (not in step_s)
    # transfers to and from host memory (activation offload) on the chip's host link: exposed (in step_s)
    # and hidden behind the compute scheduled beside them (not in step_s); 0 when none or not timed
    host_s: float = 0.0
    hidden_host_s: float = 0.0


@dataclass(frozen=True)
class TopOp(Model):
    name: str
    opcode: str
    bound_by: str
    total_s: float  # estimated_s x runs
    share: float  # of step_s
    runs: int
    source: str | None
    limit: str


@dataclass(frozen=True)
class PeakBuffer(Model):
    """Buffers live at the step's HBM peak that one source line (or one parameter shape) made."""

    bytes: int  # summed over `count` buffers
    count: int
    kind: str  # parameter | output | temporary
    where: str  # "file:line op" or "parameters SHAPE"
    shape: str


@dataclass(frozen=True)
class EstimateReport(Model):
    SCHEMA = SCHEMA

    schema: str
    status: str  # ok | failed
    reason: str | None
    program: str  # FILE.py:FUNC
    argv: tuple[str, ...]
    target: dict[str, Any]  # the compile report's target (chip, topology, devices, peaks)
    mesh: dict[str, int]
    libtpu_init_args: str | None
    step_s: float | None
    breakdown: StepBreakdown | None
    tokens: int  # per step, all devices
    model_flops: float | None  # per step, all devices; None without the model's dimensions
    model_flops_detail: dict[str, float] | None  # weights, attention
    mfu: float | None
    tokens_per_s_per_device: float | None
    peak_hbm_bytes: int | None  # per device
    hbm_capacity_bytes: int | None
    fits: bool | None
    top_ops: tuple[TopOp, ...]
    findings: tuple[str, ...]
    leaves_out: tuple[str, ...]
    artifacts: dict[str, str] = field(default_factory=dict)
    # the largest buffers live at the peak (XLA's live-range dump), by source line; () when not dumped
    peak_buffers: tuple[PeakBuffer, ...] = ()
