"""`tpudiag kernels tune`'s result: `tpudiag.kernels-tune/1` (`KernelTune`: one row per point of
the search space, each the TPU compiler's figures for the kernel at that choice; built by
`analyze.compile.tune`). No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tpudiag.model import Model

TUNE_SCHEMA = "tpudiag.kernels-tune/1"

# A point's status: it compiled ("ok"); FUNC or the lowering refused the choice ("error": block
# sizes the kernel rejects, shapes they do not divide); the compiler ran out of VMEM for it
# ("out_of_vmem"); the compile failed otherwise ("failed": a crash, a timeout, another error); it
# compiled but its output does not match the reference by validate's rule ("mismatch", --reference).
POINT_STATUSES = ("ok", "error", "out_of_vmem", "failed", "mismatch")


@dataclass(frozen=True)
class TunePoint(Model):
    choice: dict[str, Any]  # name -> value, in the space's order
    status: str  # one of POINT_STATUSES
    error: str | None
    corrected_cycles: int | None  # sum over ops of max(static estimate, HBM floor, compute floor)
    static_cycles: int | None  # sum of the static estimates the compiler gave (None: it gave none)
    ops: int
    ops_floor_only: int  # ops with no static estimate, counted at their roofline floor
    bytes_accessed: int
    flops: int
    static_profile: str | None  # the module's static-profile outcome ("ok", or why not)
    cached: bool  # the compile came from the compile cache
    module: str | None  # the point's module directory in the run
    rank: int | None  # 1 = fastest; None for a point that did not compile (or did not match)
    # --reference: "pass" (validate's rule, interpret mode on this CPU), "fail" (status "mismatch",
    # `error` says which output), None when not checked
    verified: str | None = field(default=None, metadata={"omit_none": True})
    # On the chip (a bundled kernel tuned where a TPU is attached): device time per call, min and
    # median of the calls, and the point's rank by its fastest call; chip_error where it failed there.
    chip_min_us: float | None = field(default=None, metadata={"omit_none": True})
    chip_median_us: float | None = field(default=None, metadata={"omit_none": True})
    chip_rank: int | None = field(default=None, metadata={"omit_none": True})
    chip_error: str | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class KernelTune(Model):
    SCHEMA = TUNE_SCHEMA

    schema: str
    program: str  # FILE.py:FUNC, or a bundled kernel's name
    inputs: str  # the --inputs spec, as parsed
    target: dict[str, Any]  # the compile report's target section
    space: dict[str, list[Any]]  # name -> the values tried, in order
    runner: str  # "local (N at once)" or "ray (ADDRESS, N nodes)"
    static_profile: bool
    metric: str
    status: str  # ok (every point has a row and one compiled) | failed (none compiled)
    best: dict[str, Any] | None  # the winning choice
    points: tuple[TunePoint, ...]  # in the space's order
    reference: str | None = field(default=None, metadata={"omit_none": True})  # --reference, as given
    # a bundled kernel's own blocks, as a choice over the space's names (None for FILE.py:FUNC)
    default: dict[str, Any] | None = field(default=None, metadata={"omit_none": True})
    artifacts: dict[str, str] | None = field(default=None, metadata={"omit_none": True})
    # "chip": every point also timed on the attached TPU (`device`); then `chip_best` is the chip's
    # winner and `static_best_is_chip_best` says whether the static ranking agreed. None: static only.
    timing: str | None = field(default=None, metadata={"omit_none": True})
    device: str | None = field(default=None, metadata={"omit_none": True})
    chip_best: dict[str, Any] | None = field(default=None, metadata={"omit_none": True})
    static_best_is_chip_best: bool | None = field(default=None, metadata={"omit_none": True})

    def with_artifacts(self, artifacts: dict[str, str]) -> KernelTune:
        return replace(self, artifacts=artifacts)

    @property
    def ranked(self) -> list[TunePoint]:
        """The points that compiled, fastest first, then the others in the space's order."""
        ok = sorted((p for p in self.points if p.rank is not None), key=lambda p: p.rank)
        return ok + [p for p in self.points if p.rank is None]
