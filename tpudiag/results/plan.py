"""`tpudiag plan`'s result: `tpudiag.plan/1` (`Plan`: one row per candidate configuration of a
training step on a slice, each the estimate of that configuration; built by `analyze.plan`). No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tpudiag.model import Model

PLAN_SCHEMA = "tpudiag.plan/1"

# A candidate's status: estimated and fits ("ok"); compiled, and the compiler says it needs more HBM
# than a device has ("does_not_fit"); FUNC, the lowering or the compile failed otherwise ("failed").
CANDIDATE_STATUSES = ("ok", "does_not_fit", "failed")


@dataclass(frozen=True)
class Candidate(Model):
    mesh: dict[str, int]  # axis -> size, in --mesh-axes order
    choice: dict[str, Any]  # --search name -> value
    status: str  # one of CANDIDATE_STATUSES
    reason: str | None
    step_s: float | None
    tokens_per_s_per_device: float | None
    mfu: float | None
    peak_hbm_bytes: int | None  # per device, the compiler's figure
    hbm_capacity_bytes: int | None
    exposed_collective_s: float | None
    top_op: str | None  # the op with the largest share of the step, and what bounds it
    estimate_run: str  # the candidate's estimate run directory, inside the plan's
    rank: int | None  # 1 = most tokens/s per device; None unless it fits
    # transfers to and from host memory (activation offload) the compute beside them does not hide,
    # part of step_s: 0 where the step makes none or the chip has no host-link figure (the estimate's
    # leaves_out says which); None where not estimated, and in a plan written before the field
    exposed_host_s: float | None = None


@dataclass(frozen=True)
class Plan(Model):
    SCHEMA = PLAN_SCHEMA

    schema: str
    program: str  # FILE.py:FUNC or maxtext:MODEL
    argv: tuple[str, ...]  # the program's own arguments, before each candidate's choice
    target: dict[str, Any]
    mesh_axes: tuple[str, ...]
    space: dict[str, list[Any]]  # --search name -> values, in order
    runner: str
    status: str  # ok (a candidate fits) | failed (none does)
    best: int | None  # index into candidates of rank 1
    reproduce: str | None  # the `tpudiag estimate` command of the best candidate
    candidates: tuple[Candidate, ...]  # in enumeration order: meshes, then the space
    artifacts: dict[str, str] | None = field(default=None, metadata={"omit_none": True})
    # The best candidate's step run for real on the attached chip (a one-chip slice): the device's
    # name, `step_s` (median of `runs` calls after two warm-ups) and `estimated_s`; absent otherwise.
    measured: dict[str, Any] | None = field(default=None, metadata={"omit_none": True})

    def with_artifacts(self, artifacts: dict[str, str]) -> Plan:
        return replace(self, artifacts=artifacts)

    def with_measured(self, measured: dict[str, Any]) -> Plan:
        return replace(self, measured=measured)

    @property
    def measured_text(self) -> str | None:
        """One line on the measured check, or None without one."""
        m = self.measured
        if not m:
            return None
        if m.get("error"):
            return f"measured check on the chip failed: {m['error']}"
        return (f"measured on the chip ({m['device']}): the best candidate's step {m['step_s'] * 1e3:.2f} ms "
                f"(median of {m['runs']}), estimated {m['estimated_s'] * 1e3:.2f} ms "
                f"({m['estimated_s'] / m['step_s']:.2f}x)")

    @property
    def ranked(self) -> list[Candidate]:
        """Fitting candidates, most tokens/s first; then those that do not fit; then the failed."""
        order = {"ok": 0, "does_not_fit": 1, "failed": 2}
        return sorted(self.candidates, key=lambda c: (order[c.status], c.rank or 0))
