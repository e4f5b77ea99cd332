"""The `tpudiag.fusions/1` result (one module's fusions and fusion breaks) and the short summary
profile and compile reports embed, as frozen models (docs/fusions-schema.md has every field).

Built by `analyze.hlo.fusions.build_fusion_report`; `FusionReport.from_dict` reads a saved document
back, checking each field. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model import Model

SCHEMA = "tpudiag.fusions/1"
LIST_SCHEMA = "tpudiag.fusions_list/1"


@dataclass(frozen=True)
class FusionRow(Model):
    name: str
    computation: str
    kind: str | None
    ops: dict[str, int]  # opcode -> count inside the fusion
    bytes_in: int
    bytes_out: int
    flops: float
    transcendentals: float
    arithmetic_intensity: float | None
    sources: tuple[str, ...]
    time_s: float | None
    time_source: str | None

    @property
    def ranked_ops(self) -> tuple[tuple[str, int], ...]:
        """(opcode, count) inside the fusion, the most frequent first (ties by name)."""
        return tuple(sorted(self.ops.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(frozen=True)
class FusionBreak(Model):
    """A producer -> consumer edge XLA did not fuse: the tensor round-trips memory."""

    producer: str
    producer_kind: str
    output_index: int | None
    consumer: str
    consumer_kind: str
    bytes: int
    shape: str
    memory_space: int
    reason: str
    reasons: tuple[str, ...]
    evidence: str
    via: tuple[str, ...]
    users: int


@dataclass(frozen=True)
class ModuleRef(Model):
    name: str
    path: str


@dataclass(frozen=True)
class FusionTotals(Model):
    fusions: int
    fusion_bytes: int
    breaks: int
    break_bytes: int
    break_bytes_default_memory: int
    breaks_not_inferable: int


@dataclass(frozen=True)
class FusionReport(Model):
    SCHEMA = SCHEMA

    schema: str
    module: ModuleRef
    time_source: str | None
    fusions: tuple[FusionRow, ...]
    breaks: tuple[FusionBreak, ...]
    totals: FusionTotals


@dataclass(frozen=True)
class FusionList(Model):
    """`tpudiag fusions --json`: one report per module."""

    SCHEMA = LIST_SCHEMA

    schema: str
    modules: tuple[FusionReport, ...]
