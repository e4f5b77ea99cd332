"""The `tpudiag.hlo_diff/1` result as a tree of frozen models (docs/hlo-diff-schema.md has every field).

Built by `analyze.diff.hlo_diff.diff_modules`; `HloDiff.from_dict` reads a saved document back,
checking each field. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model import Model

SCHEMA = "tpudiag.hlo_diff/1"
CHANGE_STATUSES = ("added", "removed", "changed", "moved")


@dataclass(frozen=True)
class DiffSide(Model):
    module: str
    path: str
    instructions: int
    fusions: int
    fused_instructions: int
    flops: int
    bytes_accessed: int
    time_s: float | None


@dataclass(frozen=True)
class DiffSummary(Model):
    added: int
    removed: int
    changed: int
    moved: int
    unchanged: int
    moved_into_fusions: int
    moved_out_of_fusions: int


@dataclass(frozen=True)
class ComputationPair(Model):
    a: str | None
    b: str | None


@dataclass(frozen=True)
class Pair(Model):
    """One instruction of A matched to one of B (either may be None: removed or added)."""

    a: str | None
    b: str | None
    status: str  # added | removed | changed | moved | unchanged
    opcode: str
    computation: str
    fusion_a: str | None
    fusion_b: str | None
    fusion_kind_a: str | None
    fusion_kind_b: str | None
    shape_a: str | None
    shape_b: str | None
    operands_a: tuple[str, ...] | None
    operands_b: tuple[str, ...] | None
    literal_a: str | None
    literal_b: str | None
    op_name: str | None
    source: str | None
    changes: tuple[str, ...]
    flops_a: float | None
    flops_b: float | None
    bytes_accessed_a: float | None
    bytes_accessed_b: float | None
    time_a_s: float | None
    time_b_s: float | None


@dataclass(frozen=True)
class HloDiff(Model):
    SCHEMA = SCHEMA

    schema: str
    a: DiffSide
    b: DiffSide
    summary: DiffSummary
    computations: tuple[ComputationPair, ...]
    pairs: tuple[Pair, ...]

    @property
    def has_changes(self) -> bool:
        """Anything added, removed, changed or moved (`--fail-on-change`)."""
        return any(getattr(self.summary, k) for k in CHANGE_STATUSES)

    @property
    def changed_pairs(self) -> tuple[Pair, ...]:
        """The pairs added, removed, changed or moved, in program order."""
        return tuple(p for p in self.pairs if p.status != "unchanged")
