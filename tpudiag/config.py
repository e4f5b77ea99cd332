"""Thresholds and heuristics, in one place, each with the reason for its value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AnalysisConfig:
    # Ops shown in the terminal and Markdown top-op tables. JSON always carries every op.
    top_ops: int = 15
    # Compile rows shown in the terminal compile table; JSON carries all.
    top_compiles: int = 10


DEFAULT_CONFIG = AnalysisConfig()


@dataclass(frozen=True)
class KernelGoals:
    # A bundled kernel is worth shipping when its corrected estimated cycles are at most
    # this fraction of what XLA makes of the plain-JAX version...
    vs_xla: float = 0.7
    # ...and, where JAX ships its own Pallas kernel for the op, no slower than it.
    vs_jax: float = 1.0
    # A kernel within this factor of the op's floor (the least roofline time any variant needs: HBM
    # bytes at HBM bandwidth or FLOPs at the bf16 peak) meets the XLA goal too: where XLA is
    # already near the floor, no kernel can be 0.7x of it.
    vs_floor: float = 1.05
    # Timed on a chip: a kernel's fastest call takes at most floor / this (80% of its roofline floor).
    chip_of_floor: float = 0.8


KERNEL_GOALS = KernelGoals()
