"""The `tpudiag.compare/1` result as a tree of frozen models (docs/compare.md has every field).

Built by `analyze.compare.runs.compare_reports`; `Comparison.from_dict` reads a saved document back,
checking each field. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpudiag.model import Model

SCHEMA = "tpudiag.compare/1"


@dataclass(frozen=True)
class Side(Model):
    """What a side is: enough to say why two runs may not be comparable."""

    path: str
    schema: str
    kind: str
    program: str | None
    argv: tuple[str, ...] | None
    status: str | None
    reason: str | None
    backend: str
    devices: int | None
    target: str | None
    steps: int | None


@dataclass(frozen=True)
class Headline(Model):
    basis: str
    base: float
    cur: float
    delta: float
    delta_pct: float | None
    spread: float | None
    base_spread: float | None
    cur_spread: float | None
    verdict: str  # unchanged | within_threshold | within_noise | regression | improvement | refused
    regression: bool
    # verdict "refused" (device_time): why measured times cannot decide, in one line.
    refused: str | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class CalibrationSide(Model):
    """One run's calibration samples (seconds the loop took); `slowest_s` once the slowest tenth is set
    aside."""

    samples: int
    median_s: float
    fastest_s: float
    slowest_s: float
    spread: float  # slowest_s / fastest_s - 1: how far the machine's speed moved during the run


@dataclass(frozen=True)
class Calibration(Model):
    """device_time's machine-drift check (analyze/compare/drift.py; docs/compare.md#machine-drift)."""

    loop: str  # which calibration loop both runs timed
    base: CalibrationSide
    cur: CalibrationSide
    ratio: float  # cur's median sample / base's: how much longer the loop took in cur
    ratio_low: float  # cur's fastest / base's slowest
    ratio_high: float  # cur's slowest / base's fastest
    spread_max: float  # the largest spread a run may have for a time verdict
    # How much more than the loop the program may slow with the machine: cur's figure is divided by
    # the ratio to this power at most (XLA's threads wait on each other; the loop's do not).
    sensitivity: float
    consistent: bool  # both runs' spreads within spread_max
    # cur's headline figure over every correction the samples allow (none, up to dividing by
    # max(1, ratio_high) ** sensitivity; or by min(1, ratio_low) ** sensitivity): a time verdict is given
    # only when it is the same at both ends and as measured.
    cur_low: float
    cur_high: float


@dataclass(frozen=True)
class ChangeRow(Model):
    """One module or op on either side; `module` and the occurrence counts for op rows only."""

    name: str
    base: float | None
    cur: float | None
    delta: float
    delta_pct: float | None
    status: str  # added | removed | changed | unchanged
    flagged: bool
    module: str | None = field(default=None, metadata={"omit_none": True})
    occurrences_base: int | None = field(default=None, metadata={"omit_none": True})
    occurrences_cur: int | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class Regression(Model):
    kind: str  # headline | module | op | figure
    name: str
    base: float | None
    cur: float | None
    delta: float
    delta_pct: float | None
    decides_exit: bool
    module: str | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class Comparison(Model):
    SCHEMA = SCHEMA

    schema: str
    metric: str
    unit: str
    max_regression_pct: float
    base: Side
    cur: Side
    forced: bool
    differences: tuple[str, ...]
    headline: Headline
    modules: tuple[ChangeRow, ...]
    ops: tuple[ChangeRow, ...]
    regressions: tuple[Regression, ...]
    regression: bool
    note: str
    warnings: tuple[str, ...]
    # Why this metric: "asked for", or why the default chose it (analyze.compare.default_metric).
    metric_reason: str | None = field(default=None, metadata={"omit_none": True})
    # `work` only: flops, bytes_accessed, op_executions, peak_allocation_bytes of both runs.
    figures: tuple[ChangeRow, ...] | None = field(default=None, metadata={"omit_none": True})
    # device_time with median steps, when both runs timed the calibration loop: the drift check.
    calibration: Calibration | None = field(default=None, metadata={"omit_none": True})
    # device_time whose time verdict was refused, when both runs have executed-work figures: the `work`
    # headline, which then decides `regression` (the exit code).
    fallback: Headline | None = field(default=None, metadata={"omit_none": True})
    # A side whose run failed (its program crashed or was stopped): the gate fails whatever the
    # figures say (`tpudiag compare` exits 5), and this says which side and why.
    run_failed: str | None = field(default=None, metadata={"omit_none": True})

    @property
    def flagged(self) -> tuple[ChangeRow, ...]:
        """Module and op rows that grew past the threshold (they do not decide the exit code)."""
        return tuple(r for r in (*self.modules, *self.ops) if r.flagged)
