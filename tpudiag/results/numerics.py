"""What a numerical comparison found, as models shared by `validate` and `kernels verify`: `Check`
(one comparison and its verdict), `ErrorStats` (error figures against float64), `FirstDiff` (the
first element past the floor). Built by `analyze.numerics`. No I/O."""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model import Model


@dataclass(frozen=True)
class FirstDiff(Model):
    """The first element (in C order) past the floor: where, both values, and the float64 value."""

    index: tuple[int, ...]
    got: float
    want: float
    truth: float | None


@dataclass(frozen=True)
class ErrorStats(Model):
    max_abs: float
    max_rel: float  # over elements whose |want| is above the floor's scale
    normwise: float  # max_abs / max |want| over finite elements (the figure the parity rule reads)
    ulp_max: float
    ulp_p999: float
    ulp_mean: float
    within_floor: float  # fraction of elements within the floor (normwise, elementwise)
    nonfinite_mismatch: int  # elements where one side is NaN or Inf and the other is not (or a different one)
    first_diff: FirstDiff | None


@dataclass(frozen=True)
class Check(Model):
    """One comparison of an output (or a gradient) of one side against another."""

    what: str  # "candidate vs float64", "grad[q] candidate vs reference", "determinism", ...
    ok: bool
    rule: str  # the rule in words, with its figures
    # The error over what the rule allows (<= 1 passes), and the largest absolute error; None where
    # no finite figure exists (the shapes, the NaN/Inf positions or exact values disagree).
    worst_ratio: float | None
    max_abs_err: float | None
    stats: ErrorStats | None
    detail: str | None = None  # what failed, in one line
