"""The `tpudiag.challenge/1` document: a solution's grade on one task, every criterion with its
points and why. docs/challenges.md has every field. No I/O."""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model import Model

SCHEMA = "tpudiag.challenge/1"


@dataclass(frozen=True)
class Criterion(Model):
    name: str  # correctness, determinism, integrity, speed
    points: int  # what it is worth
    awarded: int  # points or 0
    status: str  # "pass", "fail" or "not scored"
    why: str


@dataclass(frozen=True)
class ChallengeResult(Model):
    SCHEMA = SCHEMA

    schema: str
    task: str
    solution: str
    seed: int
    score: int
    max_score: int
    error: str | None  # the grade failed before any criterion: no import, wrong signature, a hang
    criteria: tuple[Criterion, ...]

    @property
    def ok(self) -> bool:
        return self.error is None and self.score == self.max_score

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.criteria if c.status == "fail")

    def criterion(self, name: str) -> Criterion:
        return next(c for c in self.criteria if c.name == name)
