"""Thresholds and heuristics, in one place, each with the reason for its value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AnalysisConfig:
    # Ops shown in the terminal and Markdown top-op tables. JSON always carries every op.
    top_ops: int = 15
    # Breakdown parts must sum to the traced window; the tests hold us to this tolerance (issue #2: 1%).
    breakdown_tolerance: float = 0.01
    # Compile rows shown in the terminal compile table; JSON carries all.
    top_compiles: int = 10


DEFAULT_CONFIG = AnalysisConfig()
