"""The `tpudiag.challenge/2` document: a solution's grade on one task, every criterion with its
points and why; the speed criterion carries its figures (`Speed`). docs/challenges.md has every
field. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpudiag.model import Model

SCHEMA = "tpudiag.challenge/2"
SPEED_VARIANTS = ("solution", "ground_truth", "reference")


@dataclass(frozen=True)
class SpeedFigure(Model):
    """One variant's measurement: the solution, the task's ground truth, or its reference jitted
    (XLA's version)."""

    variant: str  # solution, ground_truth or reference
    status: str  # "ok" or "failed"
    error: str | None
    cycles: int | None  # static: per op max(the compiler's static estimate, HBM floor, compute floor), summed
    floor_cycles: int | None  # static: per op max(bytes at HBM bandwidth, FLOPs at the bf16 peak), summed
    min_us: float | None = None  # on the chip: the fastest call's device time
    median_us: float | None = None


@dataclass(frozen=True)
class Speed(Model):
    """The speed criterion's figures. `basis` "chip": times on the attached TPU (`unit` "us", the
    fastest call), with the static cycles beside them where they were compiled; "static": the TPU
    compiler's static profile of an AOT compile for `target` (`unit` "cycles")."""

    basis: str  # "chip" or "static"
    target: str  # the chip compiled for (static) or timed on (its device kind)
    inputs: str  # the input spec measured
    unit: str  # "us" or "cycles"
    solution: float | None
    ground_truth: float | None
    reference: float | None
    floor: float | None  # the roofline floor in `unit`: the least of the variants' static floors
    vs_reference: float | None  # solution / reference (lower is faster)
    vs_ground_truth: float | None  # solution / ground truth
    of_floor: float | None  # floor / solution: the share of the roofline the solution reaches
    figures: tuple[SpeedFigure, ...]


@dataclass(frozen=True)
class Criterion(Model):
    name: str  # correctness, determinism, integrity, speed
    points: int  # what it is worth
    awarded: int  # 0 to points
    status: str  # "pass", "partial" (speed only), "fail" or "not scored"
    why: str
    speed: Speed | None = field(default=None, metadata={"omit_none": True})  # the speed criterion's figures


@dataclass(frozen=True)
class ChallengeResult(Model):
    SCHEMA = SCHEMA

    schema: str
    task: str
    solution: str
    seed: int
    score: int
    max_score: int  # the points of every criterion scored (speed's are left out when it is not)
    error: str | None  # the grade failed before any criterion: no import, wrong signature, a hang
    criteria: tuple[Criterion, ...]

    @property
    def ok(self) -> bool:
        return self.error is None and self.score == self.max_score

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.criteria if c.status in ("fail", "partial"))

    def criterion(self, name: str) -> Criterion:
        return next(c for c in self.criteria if c.name == name)
