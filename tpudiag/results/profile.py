"""The `tpudiag.report/1` result of a profile run as frozen models (docs/report-schema.md has every
field): `ProfileReport` and its parts, the time `Breakdown`, the executed `Work` and the
`profile --target` section `TpuEstimate`. Built by `analyze.profile.report.build_profile_report`;
`ProfileReport.from_dict` reads a saved `report.json` back, checking every field. The `timeline`
and `op_frame` frames ride beside the document for renderers and exporters, outside its JSON. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from tpudiag.model import Model
from tpudiag.results.compile import CompileTarget
from tpudiag.results.suggest import SuggestReport

SCHEMA = "tpudiag.report/1"


_FRAME = {"json": False}  # kept beside the document for renderers and exporters


@dataclass(frozen=True)
class Traced(Model):
    steps: int | None
    skip: int | None


@dataclass(frozen=True)
class Totals(Model):
    op_instances: int
    distinct_ops: int
    op_self_s: float
    modules: int
    compile_s: float
    compile_cache_hits: int


@dataclass(frozen=True)
class StepRow(Model):
    step_num: int
    duration_s: float
    op_s: float


@dataclass(frozen=True)
class Steps(Model):
    count: int
    median_s: float | None
    rows: tuple[StepRow, ...]


@dataclass(frozen=True)
class XprofOp(Model):
    """XProf's own figures for an op (device-plane traces only)."""

    category: str | None
    bound_by: str | None
    model_gflops_per_s: float | None
    memory_gib_per_s: float | None
    flops_per_byte: float | None


@dataclass(frozen=True)
class OpRate(Model):
    """An op's measured rates on a TPU (its trace's FLOPs and bytes over its self time), and the bound
    they give: the largest fraction of the chip's peak among compute, HBM, VMEM read and VMEM write."""

    bound_by: str | None  # compute | hbm | vmem_read | vmem_write; None when it did no counted work
    flops_per_s: float
    hbm_bytes_per_s: float | None
    compute_util: float  # of the chip's peak FLOP/s
    memory_util: float  # the largest of HBM, VMEM read and VMEM write, each of its own peak


@dataclass(frozen=True)
class OpRow(Model):
    name: str
    module: str
    program_id: int
    category: str
    opcode: str | None
    bound: str
    shape: str | None
    source: str | None
    occurrences: int
    total_s: float
    self_s: float
    avg_s: float
    share: float
    xprof: XprofOp | None
    # One execution's cost from the optimized HLO (analyze/hlo/cost.py); absent when the op has no
    # instruction in the dump.
    flops: int | None = field(default=None, metadata={"omit_none": True})
    bytes_accessed: int | None = field(default=None, metadata={"omit_none": True})
    measured: OpRate | None = field(default=None, metadata={"omit_none": True})  # TPU traces


@dataclass(frozen=True)
class CompileRow(Model):
    function: str
    compiles: int
    tracing_s: float
    lowering_s: float
    backend_compile_s: float
    total_s: float

# `ProfileReport.backend` of a run that traced nothing (its program failed before jax started).
NO_BACKEND = "unknown"


@dataclass(frozen=True)
class ProfileReport(Model):
    """The `tpudiag.report/1` document of one run, field for field."""

    SCHEMA = SCHEMA

    schema: str
    status: str
    reason: str | None
    exit_code: int | None
    program: str | None
    argv: tuple[str, ...] | None
    command: str | None
    backend: str
    host: str
    devices: tuple[str, ...]
    wall_s: float
    process_wall_s: float | None
    traced: Traced
    breakdown: Breakdown
    breakdown_share: dict[str, float | None]
    totals: Totals
    steps: Steps
    ops: tuple[OpRow, ...]
    compile: tuple[CompileRow, ...]
    artifacts: dict[str, str | None]
    versions: dict[str, str | None]
    fusions: tuple[dict[str, Any], ...]  # analyze.hlo.fusions.fusion_summary documents
    warnings: tuple[str, ...]
    # The executed setup modules (parse/setup_modules.py), most op time first: named here, not summarized in `fusions`.
    # Absent where none ran, or where every module is one.
    fusions_setup: tuple[str, ...] | None = field(default=None, metadata={"omit_none": True})
    tpu_estimate: TpuEstimate | None = field(default=None, metadata={"omit_none": True})  # profile --target
    # The machine's speed: a fixed CPU loop timed before the program, after traced steps and after it
    # (compare's drift check); `calibration_loop` names the loop (None: the matmul loop of older runs).
    calibration_s: tuple[float, ...] | None = field(default=None, metadata={"omit_none": True})
    calibration_loop: str | None = field(default=None, metadata={"omit_none": True})
    # What was executed, machine-independent (analyze/profile/work.py): compare's default on CPU runs.
    work: Work | None = field(default=None, metadata={"omit_none": True})
    # TPU traces: device busy time by class, inside and outside the steps (analyze/profile/device_time.py).
    device: DeviceTime | None = field(default=None, metadata={"omit_none": True})
    timeline: pd.DataFrame | None = field(default=None, repr=False, compare=False, metadata=_FRAME)
    op_frame: pd.DataFrame | None = field(default=None, repr=False, compare=False, metadata=_FRAME)

    def with_tpu_estimate(self, section: TpuEstimate, compile_dir: str) -> ProfileReport:
        """The same report with `profile --target`'s estimate and the compile run it came from."""
        return replace(self, tpu_estimate=section, artifacts={**self.artifacts, "tpu_compile": compile_dir})


@dataclass(frozen=True)
class Breakdown(Model):
    total_s: float
    compute_s: float
    memory_s: float
    communication_s: float
    host_s: float
    idle_s: float
    compile_s: float

    def parts(self) -> dict[str, float]:
        d = self.to_dict()
        d.pop("total_s")
        return d

    def shares(self) -> dict[str, float | None]:
        """Each part as a fraction of the window (`compute` for `compute_s`); None for an empty window."""
        return {k[:-2]: (round(v / self.total_s, 6) if self.total_s else None) for k, v in self.parts().items()}


@dataclass(frozen=True)
class DeviceStep(Model):
    """The device inside one step, or inside all of them: busy time by class, and idle (waiting on the host)."""

    step_num: int | None  # None for the sum over all steps
    step_s: float  # wall time
    busy_s: float  # op self time inside it
    compute_s: float
    memory_s: float
    communication_s: float
    host_s: float  # host transfers
    unknown_s: float  # ops the trace records no FLOPs or bytes for (custom calls without a cost estimate)
    idle_s: float  # step_s - busy_s

    def parts(self) -> list[tuple[str, float, float | None]]:
        """(class, seconds, share of the step's time) for compute, memory, communication, host, unknown, idle."""
        parts = [("compute", self.compute_s), ("memory", self.memory_s), ("communication", self.communication_s),
                 ("host", self.host_s), ("unknown", self.unknown_s), ("idle", self.idle_s)]
        return [(k, v, (v / self.step_s) if self.step_s else None) for k, v in parts]


@dataclass(frozen=True)
class DeviceStepTime(Model):
    """The device inside the program's steps: the median step by duration (a first step that compiles
    is not it) and the sum over all steps."""

    steps: int
    median: DeviceStep
    total: DeviceStep


@dataclass(frozen=True)
class DeviceTime(Model):
    """A TPU's time from its device planes: op self time by class over the whole trace, the same
    inside the steps, the rest of the trace outside them, and the async ops beside the ops."""

    chip: str | None  # as the trace names it ("TPU v5 Lite")
    peak_flops_per_s: float | None  # the peaks the trace records, which measured bounds are judged by
    hbm_bytes_per_s: float | None
    busy_s: float  # op self time, the whole trace (XProf's device time)
    compute_s: float
    memory_s: float
    communication_s: float
    host_s: float
    unknown_s: float  # ops the trace records no FLOPs or bytes for: bound unknown, as XProf has it
    in_steps: DeviceStepTime | None  # None when the trace has no steps
    outside_steps_s: float | None  # the trace window less the steps: setup, compile, shutdown
    outside_steps_busy_s: float | None
    async_s: float  # the union of Async XLA Ops spans (copies, collectives, host transfers)
    async_overlapped_s: float  # of it, while an op ran
    unknown_lines: tuple[str, ...]  # device lines with events that tpudiag does not read


@dataclass(frozen=True)
class OpWork(Model):
    """One op's executed work (per step or per run, as the section's `per` says)."""

    module: str
    name: str
    executions: float
    flops: float
    bytes_accessed: float
    roofline_s: float


@dataclass(frozen=True)
class Work(Model):
    """A run's executed HLO work. With traced steps: the ops executed inside them, divided by the
    number of steps (`per` "step"), so setup outside the steps does not count and runs of different
    lengths compare. Without: every traced execution (`per` "run")."""

    per: str  # "step" | "run"
    steps: int
    flops: float
    transcendentals: float
    bytes_accessed: float
    op_executions: float
    roofline_s: float  # each execution at the reference chip's peak FLOP/s or HBM bandwidth, whichever binds
    reference_chip: str
    peak_allocation_bytes: int | None  # the largest executed module's buffer assignment; None: no memory report
    uncosted_ops: int  # distinct ops with no instruction in the HLO dump (counted as no work)
    setup_modules: tuple[str, ...]  # seen in half the steps or fewer (async setup running on): not counted
    ops: tuple[OpWork, ...]  # by roofline work, largest first


@dataclass(frozen=True)
class TpuModuleRow(Model):
    name: str
    program_id: int | None  # the CPU program this compile pairs with; None where the pairing is unknown
    executions: float  # a share of the function's runs where unpaired
    cpu_self_s: float
    tpu_estimated_s: float | None  # one execution
    tpu_estimated_total_s: float | None  # all executions in the trace
    status: str
    error: str | None
    # Executions inside the traced steps per step (None without steps): what a saving per execution
    # is multiplied by to be a saving per step.
    executions_per_step: float | None = field(default=None, metadata={"omit_none": True})
    # A run measured on a TPU: its op time per execution, and the estimate over it.
    measured_per_run_s: float | None = field(default=None, metadata={"omit_none": True})
    estimate_ratio: float | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class TpuStep(Model):
    count: int
    tpu_estimated_s: float | None
    # A run measured on a TPU: the device's op time in the median step, beside the estimate.
    measured_s: float | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class TpuOpRow(Model):
    """One op of a run measured on a TPU: its measured time beside the static estimate, per module execution."""

    module: str
    name: str
    measured_s: float  # self time per execution of its module (every run inside loops)
    estimated_s: float  # the estimate of the same, every run inside loops
    ratio: float | None  # estimated / measured; None where nothing was measured
    cycles_source: str  # where the estimate came from (static_profile, none, ...)


@dataclass(frozen=True)
class TpuLine(Model):
    source: str
    cpu_self_s: float
    tpu_estimated_s: float


@dataclass(frozen=True)
class TpuEstimate(Model):
    """The measured CPU run beside the TPU compiler's estimate of the same computations."""

    target: CompileTarget
    status: str
    modules: tuple[TpuModuleRow, ...]
    step: TpuStep
    lines: tuple[TpuLine, ...]
    note: str
    # The compile's unpriced suggestions (CompileReport.suggestions): what `tpudiag suggest RUN` prices.
    suggestions: SuggestReport | None = field(default=None, metadata={"omit_none": True})
    # A run measured on a TPU: its ops beside their estimates, by measured time (the static model's
    # misses are where the two part).
    ops: tuple[TpuOpRow, ...] | None = field(default=None, metadata={"omit_none": True})
