"""The `tpudiag.compile/1` result as a tree of frozen models (docs/compile-schema.md has every field).

Built by `analyze.compile.report.build_compile_report`; `CompileReport.from_dict` reads a saved
`report.json` back, checking each field. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tpudiag.model import Model
from tpudiag.results.suggest import SuggestReport

SCHEMA = "tpudiag.compile/1"


@dataclass(frozen=True)
class OpEstimate(Model):
    """One executed op of a compiled module and how long the TPU should take for it."""

    name: str
    computation: str
    in_entry: bool
    opcode: str
    fusion_kind: str | None
    category: str
    source: str | None
    estimated_cycles: int | None  # the TPU compiler's static estimate; None where it gave none
    # static_profile | none | off | not_estimated; an estimate's: matmul_probe | kernel_probe | cost_model
    cycles_source: str
    flops: int
    bytes_accessed: int
    ici_bytes: int
    modelled: bool  # a collective: its time is a model (bytes, group size, ICI), not the compiler's
    estimated_s: float  # one run of the op
    bound_by: str  # static_cycles | hbm | compute | ici
    bundles: int | None
    utilization: dict[str, float] | None
    spills: int | None
    loops: int | None
    loop_depth: int | None
    limit: str
    # Runs per execution of the module: the trip counts of the while loops around it (analyze/hlo/loops.py;
    # 1 where unknown). The module's totals count estimated_s x runs.
    runs: int = 1
    # The bytes of bytes_accessed that are in HBM, where memory-space assignment kept some operands
    # or results in VMEM (S(1)); absent where all are in HBM. The HBM floor divides these.
    hbm_bytes: int | None = field(default=None, metadata={"omit_none": True})
    # What a measured calibration changed in estimated_s, and from which measurement (an estimate's
    # `analyze/compile/calibrated.py`); absent where it changed nothing.
    calibrated: str | None = field(default=None, metadata={"omit_none": True})

    @property
    def total_s(self) -> float:
        """Every run of the op in one execution of its module."""
        return self.estimated_s * self.runs

    @property
    def arithmetic_intensity(self) -> float | None:
        """FLOPs per byte accessed; None for an op that moves no bytes or does no FLOPs."""
        return self.flops / self.bytes_accessed if self.flops > 0 and self.bytes_accessed > 0 else None

    @property
    def achieved_flops_per_s(self) -> float | None:
        """FLOPs over the estimated time: where the op sits on the roofline."""
        return self.flops / self.estimated_s if self.flops > 0 and self.estimated_s > 0 else None


@dataclass(frozen=True)
class CollectiveEstimate(Model):
    """One collective of a module compiled for a slice (docs/compile.md#collectives-on-a-slice)."""

    name: str
    kind: str  # all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute | ...
    source: str | None
    message_bytes: int  # nccl-tests' size per device: the result (the input of a reduce-scatter)
    ici_bytes: int  # what one device sends over ICI on a bandwidth-optimal ring
    replica_groups: str | None  # as the optimized HLO prints them
    group_size: int
    groups: int
    mesh_axes: tuple[str, ...] | None  # the program's mesh axes the group spans; None: no mesh known
    ici_hops: int | None  # the group's diameter on this topology: the most ICI hops between two of its devices
    estimated_s: float  # one run, from the ICI model
    runs: int
    is_async: bool  # a start/done pair: the schedule may place compute between them
    scheduled_between_s: float  # estimated time of the ops scheduled between its start and done
    exposed_s: float  # estimated_s minus what that compute can hide (all of it when synchronous)


@dataclass(frozen=True)
class ModuleTotals(Model):
    estimated_s: float
    estimated_cycles: int
    ops_with_static_cycles: int
    ops: int
    flops: int
    bytes_accessed: int
    xla_optimal_s: float | None
    compile_s: float | None
    devices: int
    memory: dict[str, Any]  # XLA's memory_analysis() plus peak_hbm_bytes, hbm_capacity_bytes, fits


@dataclass(frozen=True)
class MemoryOnlyTotals(Model):
    """A module the TPU compiler refused for lack of HBM: only its memory figures are known."""

    memory: dict[str, Any]


@dataclass(frozen=True)
class ModuleReport(Model):
    name: str
    status: str  # ok | failed
    error: str | None
    static_profile: str  # ok | off | dropped: why
    artifacts: str
    ops: tuple[OpEstimate, ...]
    totals: ModuleTotals | MemoryOnlyTotals | None
    findings: tuple[str, ...]
    fusions: dict[str, Any] | None = field(default=None, metadata={"omit_none": True})  # fusion_summary
    collectives: tuple[CollectiveEstimate, ...] = ()
    # True: a setup module (parse/setup_modules.py: no matmul, kernel, sort, scatter or collective;
    # small arguments), compiled in one worker with the script's others without the static profile
    # (`profile --target`), or on its own (`compile --each-module`, older runs). Absent otherwise.
    setup: bool | None = field(default=None, metadata={"omit_none": True})

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def estimated_s(self) -> float | None:
        return self.totals.estimated_s if isinstance(self.totals, ModuleTotals) else None

    @property
    def memory(self) -> dict[str, Any]:
        return self.totals.memory if self.totals is not None else {}

    @property
    def fits(self) -> bool:
        """Whether the module fits the device's HBM (True where nothing says otherwise)."""
        return bool(self.memory.get("fits", True))


@dataclass(frozen=True)
class CompileTarget(Model):
    """Figures per compiled-for device (= per chip except on v4, where a device is one TensorCore)."""

    chip: str
    topology: str
    chips: int
    devices: int
    devices_per_chip: int
    clock_hz: float
    peak_bf16_flops_per_s: float
    hbm_bytes_per_s: float
    hbm_bytes: int
    ici_bytes_per_s: float
    ici_ring_bytes_per_s: float
    note: str | None
    # A single chip asked for: the program's mesh is one chip of `topology` (targets.Target.single_chip)
    single_chip: bool | None = field(default=None, metadata={"omit_none": True})

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the HBM slope meets the bf16 peak (the roofline's ridge)."""
        return self.peak_bf16_flops_per_s / self.hbm_bytes_per_s


@dataclass(frozen=True)
class CompileTotals(Model):
    modules: int
    failed: int
    estimated_s: float


@dataclass(frozen=True)
class CompileReport(Model):
    SCHEMA = SCHEMA

    schema: str
    status: str  # ok | partial | failed
    target: CompileTarget
    source: dict[str, Any]  # what was compiled: input, kind, and the shadow run of a script
    modules: tuple[ModuleReport, ...]
    totals: CompileTotals
    artifacts: dict[str, str] | None = field(default=None, metadata={"omit_none": True})
    # The patterns a kernel replaces, with their XLA time and roofline bound, unpriced (analyze/suggest/build.py);
    # `tpudiag suggest RUN` compiles the bundled kernels for them.
    suggestions: SuggestReport | None = field(default=None, metadata={"omit_none": True})

    def with_artifacts(self, artifacts: dict[str, str]) -> CompileReport:
        sug = self.suggestions
        if sug is not None and artifacts.get("run_dir"):
            sug = replace(sug, run_dir=artifacts["run_dir"])
        return replace(self, artifacts=artifacts, suggestions=sug)

    @property
    def ranked_modules(self) -> tuple[ModuleReport, ...]:
        """Modules with ops, slowest (estimated) first: the order the reports show them in."""
        return tuple(sorted((m for m in self.modules if m.ops), key=lambda m: -(m.estimated_s or 0.0)))

    @property
    def module_shares(self) -> tuple[tuple[ModuleReport, float], ...]:
        """(module, its fraction of the estimated total) for the modules with an estimated time."""
        total = self.totals.estimated_s
        return tuple((m, m.estimated_s / total) for m in self.modules if m.estimated_s) if total else ()

    @property
    def grouped_setup(self) -> tuple[ModuleReport, ...]:
        """The setup modules that compiled, where some compiled module is not one: the reports give
        them one line together, not a section each."""
        setup = tuple(m for m in self.modules if m.setup and m.ok)
        return setup if len(setup) < sum(m.ok for m in self.modules) else ()

    @property
    def skipped_setup(self) -> tuple[str, ...]:
        """The setup modules left out of the compile (`NN-name`, as their run would number them)."""
        return tuple((self.source.get("setup_skipped") or {}).get("modules", ()))

    @property
    def failed_modules(self) -> tuple[ModuleReport, ...]:
        return tuple(m for m in self.modules if not m.ok)

    @property
    def shadow_exit_code(self) -> int:
        """The exit code of the script a compile ran first to collect its computations (0: none or ok)."""
        return int((self.source.get("shadow_run") or {}).get("exit_code") or 0)
