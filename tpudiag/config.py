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
