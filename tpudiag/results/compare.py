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
    verdict: str  # unchanged | within_threshold | within_noise | regression | improvement
    regression: bool


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

    @property
    def flagged(self) -> tuple[ChangeRow, ...]:
        """Module and op rows that grew past the threshold (they do not decide the exit code)."""
        return tuple(r for r in (*self.modules, *self.ops) if r.flagged)
