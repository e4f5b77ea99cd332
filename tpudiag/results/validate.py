"""The `tpudiag.validate/1` result: per case (a regime at a shape), the checks that decide and the
measures that are reported; the smallest failing case where one was found. docs/validate.md has
every field. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpudiag.model import Model
from tpudiag.results.numerics import Check, ErrorStats

SCHEMA = "tpudiag.validate/1"


@dataclass(frozen=True)
class Measure(Model):
    """A reported comparison that does not decide: candidate vs reference, reference vs float64."""

    what: str
    stats: ErrorStats | None
    detail: str | None = None


@dataclass(frozen=True)
class Shrunk(Model):
    """The smallest failing case found from a failing one: its regime, its inputs, what failed."""

    regime: str
    inputs: str
    check: str
    detail: str | None


@dataclass(frozen=True)
class ValidateCase(Model):
    regime: str
    inputs: str  # the arguments' names, dtypes and shapes
    seed: int  # the case's own seed (derived from the run's)
    checks: tuple[Check, ...]
    measures: tuple[Measure, ...]
    error: str | None  # a side raised
    seconds: float
    shrunk: Shrunk | None = field(default=None, metadata={"omit_none": True})

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def why(self) -> str:
        return self.error or "; ".join(f"{c.what}: {c.detail}" for c in self.checks if not c.ok)


@dataclass(frozen=True)
class ValidateResult(Model):
    SCHEMA = SCHEMA

    schema: str
    reference: str
    candidate: str
    kinds: dict[str, str]  # {"reference": "jax" | "numpy" | "torch", "candidate": ...}
    seed: int
    inputs: str  # the spec, or the generator as given
    static: dict[str, str]  # static keyword arguments, as given
    regimes: tuple[str, ...]
    skipped: tuple[str, ...]  # regimes the generator does not make, or these shapes cannot (notes say why)
    grad: bool
    determinism: bool
    rule: dict[str, float]  # k and floor_eps of the parity rule
    cases: tuple[ValidateCase, ...]
    ok: bool
    passed: int
    failed: int
    notes: tuple[str, ...] = ()  # why a regime was skipped, what the run could not do

    @property
    def failures(self) -> list[ValidateCase]:
        return [c for c in self.cases if not c.ok]

    def summary(self) -> str:
        """One line per failure after a count: what `assert result.ok, result.summary()` shows."""
        lines = [f"{self.passed}/{len(self.cases)} cases passed ({self.candidate} vs {self.reference}, "
                 f"seed {self.seed})"]
        for c in self.failures:
            line = f"FAIL [{c.regime}] {c.inputs}: {c.why}"
            if c.shrunk is not None:
                line += f" (smallest failing: [{c.shrunk.regime}] {c.shrunk.inputs})"
            lines.append(line)
        return "\n".join(lines)
