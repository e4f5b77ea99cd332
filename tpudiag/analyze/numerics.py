"""How far one array is from another, and whether that is far enough to fail: the checks of
`tpudiag validate` and `tpudiag kernels verify`.

Two rules, one comparison:

- `ParityRule` (validate): the candidate's error against a float64 computation may be at most `k`
  times the reference's own error against it, plus a floor of a few units of the output dtype's
  epsilon. Errors are normwise (the largest absolute error over the largest |float64 value|), so a
  near-zero element does not turn one rounding into an infinite relative error. A port may be as
  wrong as the reference it ports, not more. A gradient may be wrong by that plus what the reference's
  working-precision twin loses (`parity_check(twin=...)`: the reference computed wholly in the
  candidate's dtype, validate's gradients).
- `Tolerance` (kernels verify): elementwise |got - want| <= atol + rtol * |want|, each kernel's
  own figures with their reasons (kernels/spec.py).

Both report the same statistics (`ErrorStats`): max absolute and relative error, the distance in
units in the last place of the output dtype (max, p99.9, mean), the fraction of elements within the
floor, where NaN and Inf disagree, and the first differing element. Integer and boolean outputs must
match exactly. Pure NumPy, no I/O; float64 on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpudiag.results.numerics import FirstDiff, ErrorStats, Check


@dataclass(frozen=True)
class NumericsConfig:
    # A port may be twice as far from float64 as its reference: another summation order or a fused
    # multiply-add is as right as the reference's, and its error is of the same size, not equal.
    k: float = 2.0
    # The floor, in units of the output dtype's epsilon (normwise): both sides round their outputs
    # to the dtype (half an ulp each) and a reference whose own error is ~0 (a NumPy reference in
    # float64, or an exact case) still leaves the candidate its rounding. XProf's parity contract
    # recommends 2 ULP with a hard ceiling of 8 for bf16/f16 and 4 for f32; normwise, 4 eps sits
    # between them.
    floor_eps: float = 4.0
    # The ULP percentile reported beside the max and the mean (XProf reports p99.9).
    ulp_percentile: float = 99.9
    # 16-bit outputs, elementwise too: the candidate's mean distance from float64 in ULP of the output
    # dtype may be at most k times the reference's plus this. The normwise figure reads the largest
    # element and its floor is 4 bf16 eps (3%), so a bf16 accumulation that loses the smaller elements
    # hides under it; the mean does not. (f32's normwise floor is 5e-7: tight already.)
    floor_ulp_mean: float = 1.0


DEFAULT_NUMERICS = NumericsConfig()

# Epsilon (2^-mantissa bits) of each floating dtype the harness meets, by NumPy/JAX name.
EPS = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52,
       "float8_e4m3fn": 2.0 ** -3, "float8_e5m2": 2.0 ** -2}


@dataclass(frozen=True)
class ParityRule:
    """Pass iff the candidate's normwise error against float64 <= k * the reference's + floor."""

    k: float
    floor: float  # normwise, absolute after scaling: floor_eps * eps(dtype)

    @classmethod
    def for_dtype(cls, dtype: str, config: NumericsConfig = DEFAULT_NUMERICS) -> "ParityRule":
        return cls(config.k, config.floor_eps * EPS.get(dtype, EPS["float32"]))

    def describe(self) -> str:
        return f"error <= {self.k:g} x reference's + {self.floor:.3g}"


def _max_abs(stats: ErrorStats) -> float | None:
    return None if stats.nonfinite_mismatch else stats.max_abs


def _ulps(got: np.ndarray, want: np.ndarray, dtype: str) -> np.ndarray:
    """|got - want| in units of the last place of `dtype` at |want|: the spacing of the dtype there."""
    eps = EPS.get(dtype, EPS["float32"])
    tiny = {"bfloat16": 2.0 ** -126, "float16": 2.0 ** -14, "float32": 2.0 ** -126}.get(dtype, 2.0 ** -1022)
    _, exp = np.frexp(np.maximum(np.abs(want), tiny))  # |want| = m * 2**exp, m in [0.5, 1)
    return np.abs(got - want) / np.ldexp(eps, exp - 1)


def error_stats(got, want, dtype: str, floor: float, config: NumericsConfig = DEFAULT_NUMERICS,
                truth=None) -> ErrorStats:
    """Statistics of `got` against `want` (float64 on the host); `floor` is normwise."""
    with np.errstate(all="ignore"):  # Inf - Inf, and ULPs past float64's range, are figures here, not warnings
        return _error_stats(got, want, dtype, floor, config, truth)


def _error_stats(got, want, dtype: str, floor: float, config: NumericsConfig, truth) -> ErrorStats:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin_g, fin_w = np.isfinite(g), np.isfinite(w)
    same_nonfinite = (~fin_g & ~fin_w) & ((np.isnan(g) & np.isnan(w)) | (g == w))
    mismatch = int(np.count_nonzero((fin_g != fin_w) | (~fin_g & ~fin_w & ~same_nonfinite)))
    both = fin_g & fin_w
    err = np.where(both, np.abs(g - w), 0.0)
    scale = float(np.max(np.abs(w[both]))) if np.any(both) else 0.0
    scale = scale if scale > 0 else 1.0
    max_abs = float(err.max()) if err.size else 0.0
    rel_ok = both & (np.abs(w) > floor * scale)
    max_rel = float(np.max(err[rel_ok] / np.abs(w[rel_ok]))) if np.any(rel_ok) else 0.0
    ulps = _ulps(g[both], w[both], dtype) if np.any(both) else np.zeros(0)
    bad = (err > floor * scale) | ((fin_g != fin_w) | (~fin_g & ~fin_w & ~same_nonfinite))
    first = None
    if np.any(bad):
        i = tuple(int(j) for j in np.unravel_index(int(np.argmax(bad)), bad.shape)) if bad.shape else ()
        t = None if truth is None else float(np.asarray(truth, np.float64)[i])
        first = FirstDiff(index=i, got=float(g[i]), want=float(w[i]), truth=t)
    return ErrorStats(
        max_abs=max_abs, max_rel=max_rel, normwise=max_abs / scale,
        ulp_max=float(ulps.max()) if ulps.size else 0.0,
        ulp_p999=float(np.percentile(ulps, config.ulp_percentile)) if ulps.size else 0.0,
        ulp_mean=float(ulps.mean()) if ulps.size else 0.0,
        within_floor=float(1.0 - np.count_nonzero(bad) / bad.size) if bad.size else 1.0,
        nonfinite_mismatch=mismatch, first_diff=first)


def _is_exact(a: np.ndarray) -> bool:
    return a.dtype.kind in "biu"


def _shape_problem(got: np.ndarray, want: np.ndarray) -> str | None:
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    return None


def exact_check(what: str, got, want) -> Check:
    """Integer, index and boolean outputs: equal element for element."""
    g, w = np.asarray(got), np.asarray(want)
    problem = _shape_problem(g, w)
    if problem:
        return Check(what, False, "exact", None, None, None, problem)
    bad = np.argwhere(g != w)
    if not bad.size:
        return Check(what, True, "exact", 0.0, 0.0, None)
    i = tuple(int(j) for j in bad[0])
    return Check(what, False, "exact", None, None, None,
                 f"{len(bad)} of {g.size} differ; first at {i}: {g[i]} vs {w[i]}")


def decision_check(what: str, cand, ref, truth, ambiguous, k: float) -> Check:
    """Integer, index and boolean outputs against the float64 run's decisions: outside the ties
    (`ambiguous`, where the reference's own float64 decision changes under a few eps of its inputs,
    its sums moved by their rounding bound, or another order of its classes), the candidate may
    differ from float64 at most `k` times as often as the reference's own working-precision run does
    (a bf16 cumulative sum that crosses p a little early), and not at all where the reference
    matches float64 exactly."""
    c, r, t = np.asarray(cand), np.asarray(ref), np.asarray(truth)
    problem = _shape_problem(c, t)
    if problem:
        return Check(what, False, "exact", None, None, None, problem)
    amb = np.asarray(ambiguous, bool) if ambiguous is not None and np.shape(ambiguous) == c.shape \
        else np.zeros(c.shape, bool)
    cand_bad = (c != t) & ~amb
    ref_bad = int(np.sum((r != t) & ~amb)) if r.shape == t.shape else 0
    allowed = k * ref_bad
    n_amb = int(amb.sum())
    ties = (f"{n_amb} of {c.size} position(s) are ties (the reference's own decision changes under a few eps of "
            f"its inputs, its sums' rounding error or another order of its classes), excluded; "
            f"{int(np.sum((c != t) & amb))} of them differ"
            if n_amb else "")
    rule = f"decisions as float64's outside ties, at most {k:g} x the reference's {ref_bad} miss(es)"
    n_bad = int(cand_bad.sum())
    if n_bad <= allowed:
        detail = "; ".join(x for x in (ties, f"{n_bad} miss(es), the reference {ref_bad}" if ref_bad else "") if x)
        return Check(what, True, rule, n_bad / allowed if allowed else 0.0, 0.0, None, detail or None)
    i = tuple(int(j) for j in np.argwhere(cand_bad)[0])
    return Check(what, False, rule, None, None, None,
                 f"{n_bad} of {c.size} differ from the float64 decision (the reference's own run: {ref_bad}); first at "
                 f"{i}: {c[i]} vs {t[i]}" + (f" ({ties})" if ties else ""))


def mean_ulp(got, truth, dtype: str) -> float | None:
    """The mean distance from float64 in ULP of `dtype`, over the finite elements at least eps times
    the largest |truth| (smaller ones are below what the output's precision bounds: their ULP is
    noise, and XLA on the CPU flushes subnormal partial sums)."""
    g, t = np.asarray(got, np.float64), np.asarray(truth, np.float64)
    finite = np.isfinite(g) & np.isfinite(t)
    if not finite.any():
        return None
    big = finite & (np.abs(t) >= EPS.get(dtype, EPS["float32"]) * np.max(np.abs(t[finite])))
    return float(np.mean(_ulps(g[big], t[big], dtype))) if big.any() else None


def parity_check(what: str, cand, truth, ref_error: float, dtype: str, rule: ParityRule,
                 config: NumericsConfig = DEFAULT_NUMERICS, ref=None, twin=None, twin_dtype: str = "",
                 wide=None) -> Check:
    """`cand` against the float64 `truth`, allowed `rule.k * ref_error + rule.floor` (normwise), and
    for a 16-bit output where the reference's output `ref` is given, a mean ULP distance (`mean_ulp`)
    of `rule.k` times the reference's plus `floor_ulp_mean`. `twin`: the reference computed wholly in
    the working precision `twin_dtype` (validate's gradients); what it loses against `truth`,
    normwise and in mean ULP, is allowed on top of each. `wide`: `cand` recomputed with its 16-bit
    sums added in float32 (parity/wide_sums.py); the distance between the two is allowed on top too."""
    c, t = np.asarray(cand), np.asarray(truth)
    problem = _shape_problem(c, t)
    describe = (rule.describe() + (f" + its {twin_dtype} twin's" if twin is not None else "")
                + (" + its 16-bit sums'" if wide is not None else ""))
    if problem:
        return Check(what, False, describe, None, None, None, problem)
    if _is_exact(c) or _is_exact(t):
        return exact_check(what, c, t)
    twin_err = normwise_error(twin, t) if twin is not None else 0.0
    sums_err = normwise_error(c, wide) if wide is not None else 0.0
    allowed = rule.k * ref_error + rule.floor + twin_err + sums_err
    stats = error_stats(c, t, dtype, allowed, config, truth=t)
    ratio = None if stats.nonfinite_mismatch else stats.normwise / allowed
    ref_ulp_mean = cand_ulp = ulp_allowed = None
    twin_ulp = (mean_ulp(twin, t, dtype) or 0.0) if twin is not None else 0.0
    sums_ulp = (mean_ulp(c, wide, dtype) or 0.0) if wide is not None else 0.0
    if ref is not None and ratio is not None and dtype in ("bfloat16", "float16"):
        ref_ulp_mean, cand_ulp = mean_ulp(ref, t, dtype), mean_ulp(c, t, dtype)
        if ref_ulp_mean is not None and cand_ulp is not None:
            ulp_allowed = rule.k * ref_ulp_mean + config.floor_ulp_mean + twin_ulp + sums_ulp
            ratio = max(ratio, cand_ulp / ulp_allowed)
    ok = ratio is not None and ratio <= 1.0
    detail = None
    own = (f" + its {twin_dtype} twin's {{tw:.3g}}" if twin is not None else "") + (
        " + its 16-bit sums' {su:.3g}" if wide is not None else "")
    if stats.nonfinite_mismatch:
        detail = f"NaN/Inf where the other side has none: {stats.nonfinite_mismatch} element(s)"
    elif not ok and stats.normwise > allowed:
        detail = (f"normwise error {stats.normwise:.3g} > {allowed:.3g} (the reference's {ref_error:.3g} x "
                  f"{rule.k:g} + floor {rule.floor:.3g}{own.format(tw=twin_err, su=sums_err)})")
    elif not ok:
        detail = (f"mean ULP error {cand_ulp:.3g} > {ulp_allowed:.3g} (the reference's {ref_ulp_mean:.3g} x "
                  f"{rule.k:g} + {config.floor_ulp_mean:g}{own.format(tw=twin_ulp, su=sums_ulp)}): elements below the largest "
                  "lose precision it hides")
    if detail and stats.first_diff is not None:
        f = stats.first_diff
        detail += f"; first at {f.index}: {f.got:.6g} vs {f.want:.6g}"
    return Check(what, ok, describe, ratio, _max_abs(stats), stats, detail)


def normwise_error(got, truth) -> float:
    """The normwise error of `got` against `truth` over the elements finite on both sides (0 for
    empty arrays): the reference's yardstick. Where the reference itself turns NaN or Inf, that is
    reported by its own measure, and the candidate is held to the floor there."""
    g, t = np.asarray(got, np.float64), np.asarray(truth, np.float64)
    if g.shape != t.shape or not g.size:
        return 0.0
    return error_stats(g, t, "float64", 0.0).normwise


def tolerance_check(what: str, got, want, atol: float, rtol: float, dtype: str = "float32",
                    exact: bool = False) -> Check:
    """Elementwise |got - want| <= atol + rtol * |want| (kernels verify's rule)."""
    g, w = np.asarray(got), np.asarray(want)
    if exact or _is_exact(g) or _is_exact(w):
        return exact_check(what, g, w)
    problem = _shape_problem(g, w)
    rule = f"|err| <= {atol:g} + {rtol:g} x |want|"
    if problem:
        return Check(what, False, rule, None, None, None, problem)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    stats = error_stats(g64, w64, dtype, 0.0)
    if stats.nonfinite_mismatch:
        i = tuple(int(j) for j in np.argwhere(np.isfinite(g64) != np.isfinite(w64))[0]) \
            if np.any(np.isfinite(g64) != np.isfinite(w64)) else ()
        where = f" at {i}: {g64[i]} vs {w64[i]}" if i else ""
        return Check(what, False, rule, None, None, stats, f"non-finite mismatch{where}")
    fin = np.isfinite(w64)
    err = np.where(fin, np.abs(g64 - w64), 0.0)
    ratio = err / (atol + rtol * np.abs(w64))
    worst = float(ratio.max()) if ratio.size else 0.0
    ok = worst <= 1.0
    detail = None
    if not ok:
        i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        detail = f"worst at {tuple(int(j) for j in i)}: {g64[i]:.6g} vs {w64[i]:.6g}"
    return Check(what, ok, rule, worst, stats.max_abs, stats, detail)
