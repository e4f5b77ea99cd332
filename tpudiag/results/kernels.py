"""The bundled kernels' results: `tpudiag.kernels-bench/1` (`KernelBench`: per kernel, the TPU
compiler's figures for the kernel, plain XLA and JAX's own kernel; built by
`analyze.compile.kernel_bench`) and `tpudiag.kernels-verify/1` (`VerifyResult`: per case, the
checks against the reference; built by `kernels.verify`). No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tpudiag.model import Model
from tpudiag.results.numerics import Check

BENCH_SCHEMA = "tpudiag.kernels-bench/1"


VARIANTS = ("kernel", "xla", "jax")


@dataclass(frozen=True)
class VariantFigures(Model):
    variant: str  # "kernel" (ours), "xla" (plain JAX through XLA), "jax" (JAX's own Pallas kernel)
    status: str  # "ok" | "failed"
    error: str | None
    static_cycles: int | None  # sum of the static estimates the compiler gave (None: it gave none)
    corrected_cycles: int | None  # sum over ops of max(static, HBM floor); floors where no estimate
    ops: int
    ops_floor_only: int  # ops with no static estimate, counted at their roofline floor
    hbm_bound_ops: int  # ops whose HBM floor exceeded the static estimate
    compute_bound_ops: int  # ops whose compute floor exceeded the static estimate and the HBM floor
    bytes_accessed: int
    flops: int
    static_profile: str | None  # the module's static-profile outcome ("ok", or why not)
    module: str | None  # the module's directory in the bench run
    # Sum over ops of max(HBM floor, compute floor): the roofline time of the variant's own traffic
    # and work, static estimate left out.
    floor_cycles: int | None = field(default=None, metadata={"omit_none": True})


def uncounted_variants(figures: dict[str, VariantFigures]) -> tuple[str, ...]:
    """The compiled variants that count no FLOPs where another does: each holds a Pallas call that
    declares no `pl.CostEstimate` (JAX's and tpu-inference's ragged paged attention). XLA charges it
    its operands' bytes and no compute, so its floor is below the work of a compute-bound shape (a
    long prefill chunk); a bench row's floor leaves it out."""
    ok = {name: f for name, f in figures.items() if f.status == "ok"}
    if not any(f.flops for f in ok.values()):
        return ()
    return tuple(name for name, f in ok.items() if not f.flops)


@dataclass(frozen=True)
class ChipTime(Model):
    """One variant timed on the chip (capture/chip_bench.py): device time per call, from the trace."""

    variant: str
    status: str  # "ok" | "failed"
    error: str | None
    calls: int
    buffers: int | None  # argument sets rotated across the calls
    min_us: float | None
    median_us: float | None
    wall_us: float | None  # wall clock per call with the calls queued: dispatch included
    first_call_s: float | None  # the first call: compile and load


_WITH_JAX = {"present_if": "jax_name"}
_CHIP = {"omit_none": True}  # keys a row has only where JAX has its own kernel


@dataclass(frozen=True)
class KernelRow(Model):
    name: str
    shape: str
    blocks: str | None
    kernel_cycles: int | None
    xla_cycles: int | None
    ratio_vs_xla: float | None
    goal_vs_xla: float
    meets_xla_goal: bool | None
    variants: dict[str, VariantFigures]
    status: str  # ok | failed
    jax_name: str | None = field(default=None, metadata={"omit_none": True})
    jax_cycles: int | None = field(default=None, metadata=_WITH_JAX)
    ratio_vs_jax: float | None = field(default=None, metadata=_WITH_JAX)
    goal_vs_jax: float | None = field(default=None, metadata=_WITH_JAX)
    meets_jax_goal: bool | None = field(default=None, metadata=_WITH_JAX)
    # The least floor_cycles of the compiled variants, and the kernel's and XLA's cycles against it.
    floor_cycles: int | None = field(default=None, metadata={"omit_none": True})
    kernel_vs_floor: float | None = field(default=None, metadata={"omit_none": True})
    xla_vs_floor: float | None = field(default=None, metadata={"omit_none": True})
    goal_vs_floor: float | None = field(default=None, metadata={"omit_none": True})
    # Timed on the chip (kernels bench on a TPU): each variant's device time, and the verdicts from it.
    chip: dict[str, ChipTime] | None = field(default=None, metadata=_CHIP)
    chip_ratio_vs_xla: float | None = field(default=None, metadata=_CHIP)  # min over min
    chip_ratio_vs_jax: float | None = field(default=None, metadata=_CHIP)
    floor_us: float | None = field(default=None, metadata=_CHIP)  # floor_cycles at the chip's clock
    pct_of_floor: float | None = field(default=None, metadata=_CHIP)  # 100 * floor / our fastest call
    goal_pct_of_floor: float | None = field(default=None, metadata=_CHIP)
    static_over_chip: float | None = field(default=None, metadata=_CHIP)  # our static time / our median call
    meets_floor_goal: bool | None = field(default=None, metadata=_CHIP)
    meets_jax_goal_on_chip: bool | None = field(default=None, metadata=_CHIP)

    @property
    def missed_goal(self) -> bool:
        """On a chip, the chip's verdicts (80% of the floor, no slower than JAX's); else the static ones."""
        if self.chip is not None:
            return self.meets_floor_goal is False or self.meets_jax_goal_on_chip is False
        return self.meets_xla_goal is False or self.meets_jax_goal is False


@dataclass(frozen=True)
class KernelBench(Model):
    SCHEMA = BENCH_SCHEMA

    schema: str
    target: dict[str, Any]  # the compile report's target section
    static_profile: bool
    metric: str
    status: str  # ok | partial | failed
    failed: tuple[str, ...]
    goals_missed: tuple[str, ...]
    kernels: tuple[KernelRow, ...]
    artifacts: dict[str, str] | None = field(default=None, metadata={"omit_none": True})
    # "chip": also timed on the attached TPU (`device`); None: the TPU compiler's figures only
    timing: str | None = field(default=None, metadata={"omit_none": True})
    device: str | None = field(default=None, metadata={"omit_none": True})

    def with_artifacts(self, artifacts: dict[str, str]) -> KernelBench:
        return replace(self, artifacts=artifacts)

    @property
    def worst_ratio_vs_xla(self) -> float | None:
        ratios = [k.ratio_vs_xla for k in self.kernels if k.ratio_vs_xla is not None]
        return max(ratios) if ratios else None


VERIFY_SCHEMA = "tpudiag.kernels-verify/1"


@dataclass(frozen=True)
class CaseResult:
    kernel: str
    label: str
    dtype: str
    shapes: str  # the argument shapes and dtypes
    checks: tuple[Check, ...]
    error: str | None  # the kernel or reference raised
    seconds: float

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def worst_ratio(self) -> float | None:
        """The largest error/tolerance ratio of the case's checks (<= 1 passes; inf where a check has
        no finite figure); None without checks."""
        return max((float("inf") if c.worst_ratio is None else c.worst_ratio for c in self.checks), default=None)

    @property
    def why(self) -> str:
        """What failed: the error raised, or each failing check with its detail."""
        return self.error or "; ".join(f"{k.what}: {k.detail}" for k in self.checks if not k.ok)

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "case": self.label, "dtype": self.dtype, "shapes": self.shapes,
                "ok": self.ok, "error": self.error, "seconds": round(self.seconds, 3),
                "checks": [c.to_dict() for c in self.checks]}


@dataclass(frozen=True)
class VerifyResult:
    seed: int
    cases: tuple[CaseResult, ...]
    tolerances: dict  # kernel name -> {dtype: Tolerance.to_dict()}
    # "interpret": Pallas interpret mode on the CPU; "chip": compiled for and run on the attached TPU
    # (its name in `device`), the reference there at 'highest' matmul precision.
    mode: str = "interpret"
    device: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.ok]

    @property
    def passed(self) -> int:
        return sum(c.ok for c in self.cases)

    def by_kernel(self) -> dict[str, list[CaseResult]]:
        """The cases of each kernel, in the order they ran."""
        out: dict[str, list[CaseResult]] = {}
        for c in self.cases:
            out.setdefault(c.kernel, []).append(c)
        return out

    def summary(self) -> str:
        lines = [f"{self.passed}/{len(self.cases)} cases passed (seed {self.seed})"]
        lines += [f"FAIL {c.kernel} [{c.label}]: {c.why}" for c in self.failures]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        doc = {"schema": VERIFY_SCHEMA, "ok": self.ok, "seed": self.seed,
               "passed": self.passed, "failed": len(self.failures),
               "cases": [c.to_dict() for c in self.cases], "tolerances": self.tolerances}
        if self.mode != "interpret":  # interpret mode's documents are as they always were
            doc.update(mode=self.mode, device=self.device)
        return doc
