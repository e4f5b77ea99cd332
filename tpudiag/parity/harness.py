"""The parity harness: one case (a regime at a shape) of a candidate against its reference and a
float64 computation, values and gradients, plus determinism; the shrinking of a failing case; and
the whole run. `tpudiag validate` and `tpudiag kernels verify` both check through `compare_outputs`.

Per case:
1. the candidate, the reference and the reference in float64 (a NumPy reference is float64 already)
   run on the same inputs;
2. each output: candidate vs float64 under the rule (analyze/numerics.py) with the reference's own
   error as the yardstick; candidate vs reference and reference vs float64 are measured and
   reported; integer outputs must be equal;
3. `grad`: the VJP with a random cotangent of every floating input, the same way, and allowed on
   top what the reference's working-precision twin loses (the reference with its inputs and every
   value it computes, f32 statistics included, in the inputs' lowest floating dtype, differentiated
   there): autodiff emits the backward's reductions in the working dtype (JAX's transpose of a
   broadcast is a bf16 `reduce_sum`), which neither side wrote;
4. `determinism`: the candidate again on the same inputs, equal bit for bit.

A case that fails is shrunk: every dimension halved (alike across arguments) while it still fails,
then the simplest regime (`normal`) tried at that size; the smallest failing case is reported with
its first differing element.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from tpudiag.analyze.numerics import (DEFAULT_NUMERICS, NumericsConfig, ParityRule, decision_check, error_stats,
                                      exact_check, normwise_error, parity_check, tolerance_check)
from tpudiag.results.numerics import Check
from tpudiag.results.validate import SCHEMA, Measure, Shrunk, ValidateCase, ValidateResult
from tpudiag.errors import InputError, one_line
from tpudiag.parity import inputs as inp
from tpudiag.parity.neighbours import (NEAR_RUNS, ambiguous as find_ties, float64_truth, nearby_errors, sorted_along,
                                       working_dtype)
from tpudiag.parity.sides import Side, call, clear_compiled, grads, is_float, param_names

_SHRINK_STEPS = 8  # halvings at most: 1024 -> 4


@dataclass(frozen=True)
class Outputs:
    """What a case's sides returned: flat lists of NumPy arrays."""

    cand: list
    ref: list
    truth: list


def _dtype(a: np.ndarray) -> str:
    return str(a.dtype)


def _structure(o: Outputs, cand_label: str, ref_label: str) -> None:
    """Both sides return the same number of outputs of the same shapes: else a one-line InputError."""
    if len(o.cand) != len(o.ref):
        raise InputError(f"{cand_label} returns {len(o.cand)} output(s), {ref_label} returns {len(o.ref)}")
    for n, (c, r) in enumerate(zip(o.cand, o.ref)):
        if c.shape != r.shape:
            where = f"output {n}" if len(o.cand) > 1 else "the output"
            raise InputError(f"{cand_label}: {where} has shape {list(c.shape)}, {ref_label}'s has {list(r.shape)}")


def compare_outputs(o: Outputs, prefix: str, *, atol_rtol=None,
                    config: NumericsConfig = DEFAULT_NUMERICS, exact: bool = False,
                    names: tuple[str, str] = ("candidate", "reference"),
                    ambiguous: list | None = None, twins: list | None = None,
                    twin_dtype: str = "", wide: list | None = None,
                    nearby: list | None = None) -> tuple[list[Check], list[Measure]]:
    """The checks and measures of one set of outputs: the parity rule of each output's dtype
    (validate), or with `atol_rtol` (kernels verify) an elementwise tolerance,
    checked for candidate vs reference, candidate vs float64 and reference vs float64. `twins`: the
    reference's working-precision twin's outputs, whose own loss is allowed on top (gradients).
    `wide`: the candidate's outputs with its 16-bit sums added in float32, whose difference from
    the candidate's is allowed on top too (a JAX candidate's bf16 gradients). `nearby`: per output,
    the reference's largest normwise error on inputs a few eps away (`neighbours.nearby_errors`), which
    stands for its error here where it is larger."""
    checks, measures = [], []
    cn, rn = names
    many = len(o.cand) > 1
    for n, (c, r, t) in enumerate(zip(o.cand, o.ref, o.truth)):
        tag = f"{prefix}[{n}] " if many else (f"{prefix} " if prefix else "")
        dt = _dtype(c)
        if atol_rtol is not None:
            atol, rtol = atol_rtol
            checks.append(tolerance_check(f"{tag}{cn} vs {rn}", c, r, atol, rtol, dt, exact))
            checks.append(tolerance_check(f"{tag}{cn} vs float64", c, t, atol, rtol, dt, exact))
            checks.append(tolerance_check(f"{tag}{rn} vs float64", r, t, atol, rtol, dt, exact))
            continue
        if exact or c.dtype.kind in "biu":
            if ambiguous is None or exact:  # no tie analysis (--strict-ties, kernels verify): as the reference
                checks.append(exact_check(f"{tag}{cn} vs {rn}", c, r))
            else:
                checks.append(decision_check(f"{tag}{cn} vs float64", c, r, t, ambiguous[n], config.k))
            continue
        rl = ParityRule.for_dtype(dt, config)
        ref_err = normwise_error(r, t)
        near = nearby[n] if nearby is not None else None
        if near is not None and near > ref_err:
            ref_err = near
            measures.append(Measure(f"{tag}{rn} vs float64 on inputs a few eps away", None,
                                    f"normwise error up to {near:.3g} on {NEAR_RUNS} such inputs: the yardstick "
                                    f"here (the problem is ill-conditioned, and one run of the reference was lucky)"))
        rs = error_stats(r, t, dt, rl.floor, config)
        w = twins[n] if twins is not None and twins[n] is not None and np.shape(twins[n]) == t.shape else None
        if w is not None and not np.isfinite(np.asarray(w, np.float64)).all():
            w = None  # a twin that overflows or turns NaN bounds nothing
        ws = wide[n] if wide is not None and wide[n] is not None and np.shape(wide[n]) == c.shape else None
        if ws is not None and not np.isfinite(np.asarray(ws, np.float64)).all():
            ws = None
        checks.append(parity_check(f"{tag}{cn} vs float64", c, t, ref_err, dt, rl, config,
                                   ref=None if rs.nonfinite_mismatch else r, twin=w, twin_dtype=twin_dtype,
                                   wide=ws))
        if w is not None:
            measures.append(Measure(f"{tag}{rn} in {twin_dtype} vs float64", error_stats(w, t, dt, rl.floor, config)))
        if ws is not None:
            measures.append(Measure(f"{tag}{cn} vs itself with float32 sums", error_stats(c, ws, dt, rl.floor, config)))
        measures.append(Measure(f"{tag}{cn} vs {rn}", error_stats(c, r, dt, rl.floor, config)))
        measures.append(Measure(f"{tag}{rn} vs float64", rs,
                                f"the reference turns NaN/Inf at {rs.nonfinite_mismatch} element(s)"
                                if rs.nonfinite_mismatch else None))
    return checks, measures


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@dataclass(frozen=True)
class Pair:
    ref: Side
    cand: Side
    static: dict
    grad: bool
    determinism: bool
    config: NumericsConfig = DEFAULT_NUMERICS
    unordered: int | None = None  # outputs compared as sets along this dimension
    strict_ties: bool = False  # discrete outputs must break ties as the reference does


class SideRaised(Exception):
    """One side raised on one case's inputs: that case's ERROR, naming the side; the reference
    raising in every case is a bad argument instead (`validate_pair`)."""

    def __init__(self, message: str, by_reference: bool):
        super().__init__(message)
        self.by_reference = by_reference


def _raised(side: Side, what: str, named, e: Exception, pair: Pair) -> SideRaised:
    return SideRaised(f"{what} {side.label} raised on {_describe(named)}: {one_line(e, 300)}", side is pair.ref)


def _same_bits(ref: list, truth: list) -> bool:
    """The float64 run returned the working-precision run's values exactly (no output computed in
    float64 at all)."""
    floats = [(r, t) for r, t in zip(ref, truth) if is_float(r) and r.size]
    return bool(floats) and all(np.array_equal(np.asarray(r, np.float64), np.asarray(t, np.float64))
                                for r, t in floats)


def _finite_misses(checks, against: str = "") -> bool:
    """Whether any check (whose label ends with `against`) failed by a finite margin: such a case is
    judged again against the reference's own error on nearby inputs (`neighbours.nearby_errors`); a
    NaN or Inf never passes, so it is not."""
    return any(not c.ok and c.what.endswith(against) and "NaN/Inf" not in (c.detail or "") for c in checks)


def check_case(pair: Pair, named: list[tuple[str, np.ndarray]], seed: int) -> tuple[list[Check], list[Measure]]:
    """Every check of one case (a side that raises: `SideRaised`). `named`: the inputs, (name, array)."""
    note = None
    try:  # the reference first: it is the oracle
        ref = call(pair.ref, named, pair.static)
        if pair.unordered is not None and not any(a.ndim > pair.unordered >= -a.ndim for a in ref):
            raise InputError(f"--unordered {pair.unordered}: no output has that dimension (they have "
                             f"{', '.join(str(a.ndim) for a in ref)})")
        ref = sorted_along(ref, pair.unordered)
        truth, note = float64_truth(pair, named)
        truth = sorted_along(truth, pair.unordered)
        ambiguous = None if pair.strict_ties else find_ties(pair, named, truth, seed)
    except InputError:
        raise
    except Exception as e:
        raise _raised(pair.ref, "the reference", named, e, pair) from e
    try:
        cand = sorted_along(call(pair.cand, named, pair.static), pair.unordered)
    except InputError:
        raise
    except Exception as e:
        raise _raised(pair.cand, "the candidate", named, e, pair) from e
    o = Outputs(cand, ref, truth)
    if pair.ref.kind != "numpy" and _same_bits(ref, truth):
        note = ((note + "; ") if note else "") + (
            "the float64 run came out bit-identical to the working-precision run: the reference computes in its "
            "own precision whatever it is given, so its own error reads as zero and the tolerance rests on the "
            "floor alone")
    _structure(o, pair.cand.label, pair.ref.label)
    checks, measures = compare_outputs(o, "", config=pair.config, ambiguous=ambiguous)
    if _finite_misses(checks, against="vs float64"):
        nearby = nearby_errors(pair, named, seed)
        if nearby is not None:
            checks, measures = compare_outputs(o, "", config=pair.config, ambiguous=ambiguous, nearby=nearby)
    if note:
        measures.append(Measure("float64 run", None, note))
    if pair.grad:
        floats = [k for k, (_, a) in enumerate(named) if is_float(a)]
        rng = np.random.default_rng(seed + 7919)
        cts = [rng.standard_normal(c.shape) if is_float(c) else None for c in o.cand]
        wrt = tuple(floats)
        try:
            gr = grads(pair.ref, named, pair.static, cts, wrt), grads(pair.ref, named, pair.static, cts, wrt, f64=True)
        except InputError:
            raise
        except Exception as e:
            raise _raised(pair.ref, "the reference's gradient:", named, e, pair) from e
        try:
            gc = grads(pair.cand, named, pair.static, cts, wrt)
        except InputError:
            raise
        except Exception as e:
            raise _raised(pair.cand, "the candidate's gradient:", named, e, pair) from e
        g = Outputs(gc, *gr)
        low, tw, why = _twin_grads(pair, named, cts, wrt)
        if why:
            measures.append(Measure("gradient twin", None, why))
        wide = _wide_grads(pair, named, cts, wrt, low)
        nearby = False  # the reference's gradients on inputs a few eps away: only once one fails
        for j, k in enumerate(floats):
            one = Outputs([g.cand[j]], [g.ref[j]], [g.truth[j]])
            kw = dict(config=pair.config, twins=None if tw is None else [tw[j]], twin_dtype=low,
                      wide=None if wide is None else [wide[j]])
            ch, me = compare_outputs(one, f"grad[{named[k][0]}]", **kw)
            if _finite_misses(ch):
                if nearby is False:
                    nearby = nearby_errors(pair, named, seed, wrt=wrt, cotangents=cts)
                if nearby is not None:
                    ch, me = compare_outputs(one, f"grad[{named[k][0]}]", nearby=[nearby[j]], **kw)
            checks += ch
            measures += me
    if pair.determinism:
        again = sorted_along(call(pair.cand, named, pair.static), pair.unordered)
        same = all(_bits_equal(a, b) for a, b in zip(o.cand, again))
        detail = None
        if not same:
            n = next(k for k, (a, b) in enumerate(zip(o.cand, again)) if not _bits_equal(a, b))
            a, b = np.asarray(o.cand[n], np.float64), np.asarray(again[n], np.float64)
            diff = np.argwhere(a != b) if a.shape == b.shape else np.zeros((0, 0))
            if diff.size:
                idx = tuple(int(j) for j in diff[0])
                detail = (f"two runs on the same inputs differ at {len(diff)} element(s); first at {idx}: "
                          f"{a[idx]:.9g} vs {b[idx]:.9g}")
            else:
                detail = f"two runs on the same inputs differ in their bits (output {n}: NaN payloads or signed zeros)"
        checks.append(Check("determinism", same, "bit for bit", 0.0 if same else None, 0.0 if same else None,
                            None, detail))
    return checks, measures


def _twin_grads(pair: Pair, named, cts: list, wrt: tuple) -> tuple[str, list | None, str | None]:
    """The reference's gradients computed wholly in the working precision (its inputs, parameters
    and every value it computes, its own float32 statistics included), or None with the reason:
    float64 inputs (the twin is the float64 run), or a reference that cannot be run that way."""
    low = working_dtype(named)
    if low is None or low == "float64":
        return "", None, None
    try:
        return low, grads(pair.ref, named, pair.static, cts, wrt, twin=low), None
    except InputError:
        raise
    except Exception as e:
        return low, None, (f"the reference's gradient could not be computed wholly in {low} ({one_line(e, 200)}): "
                           "the gradients are held to the rule without its allowance")


def _wide_grads(pair: Pair, named, cts: list, wrt: tuple, low: str) -> list | None:
    """A JAX candidate's gradients with their 16-bit sums added in float32 (parity/wide_sums.py), for
    a bf16 or f16 case; None otherwise, or where it cannot be evaluated so (the rule then holds
    without that allowance)."""
    if pair.cand.kind != "jax" or low not in ("bfloat16", "float16"):
        return None
    try:
        return grads(pair.cand, named, pair.static, cts, wrt, wide_sums=True)
    except Exception:
        return None


def _run(pair: Pair, named, seed: int) -> tuple[list[Check], list[Measure], str | None, bool]:
    """(checks, measures, the error that ended the case, whether the reference raised it)."""
    try:
        checks, measures = check_case(pair, named, seed)
        return checks, measures, None, False
    except InputError:
        raise  # the two sides do not fit together: a bad argument, not a failed case
    except SideRaised as e:  # a side that raises is a failed case, named with its cause
        return [], [], str(e), e.by_reference
    except Exception as e:
        return [], [], one_line(e, 400), False


def _describe(named) -> str:
    return " ".join(f"{n}={a.dtype}[{','.join(map(str, a.shape))}]" for n, a in named)


def _fails(pair: Pair, named, seed) -> tuple[bool, list[Check], str | None]:
    try:
        checks, _, error, _ = _run(pair, named, seed)
    except InputError as e:  # a smaller size the reference does not take
        return True, [], str(e)
    return error is not None or not checks or not all(c.ok for c in checks), checks, error


def _named(specs, regime: str, seed: int) -> list[tuple[str, np.ndarray]]:
    return list(zip((s.name for s in specs), inp.make_args(specs, regime, seed)))


def shrink(pair: Pair, specs, regime: str, seed: int) -> Shrunk | None:
    """The smallest failing case reachable by halving every dimension (a spec only), then the
    `normal` regime at that size. None where no smaller case fails."""
    best, cur = None, specs
    for _ in range(_SHRINK_STEPS):
        sizes = inp.shrink_map(cur)
        if not sizes:
            break
        smaller = inp.resized(cur, sizes)
        bad, checks, error = _fails(pair, _named(smaller, regime, seed), seed)
        if not bad or error is not None:  # passes, or a side refuses the size: stop here
            break
        cur, best = smaller, (regime, smaller, checks)
    if regime != "normal" and best is not None:
        bad, checks, error = _fails(pair, _named(cur, "normal", seed), seed)
        if bad and error is None:
            best = ("normal", cur, checks)
    if best is None:
        return None
    reg, sp, checks = best
    first = next((c for c in checks if not c.ok), None)
    return Shrunk(regime=reg, inputs=" ".join(s.text() for s in sp), check=first.what if first else "",
                  detail=first.detail if first else None)


def _check_names(ref: Side, cand: Side, names: tuple[str, ...]) -> None:
    """Inputs named by a spec or a generator's dict go in by name, to both sides: each side whose
    parameters can be read must name every input (through `--bind` for the candidate) and get all
    its required ones; else a one-line InputError listing both functions' parameters. Never a
    silent binding by position."""
    for side in (ref, cand):
        if not side.params:
            continue  # a builtin or C function: its parameters cannot be read; in order
        params = param_names(side, names)
        missing = [n for n, p in zip(names, params) if p not in side.params]
        if missing:
            hint = f"; bind them with --bind {missing[0]}=PARAM" if side is cand else ""
            raise InputError(f"the inputs ({', '.join(names)}) do not match {side.label}'s parameters: the "
                             f"reference takes ({', '.join(ref.params) or '?'}), the candidate takes "
                             f"({', '.join(cand.params) or '?'}){hint}")
        unbound = [p for p in side.params[:side.required] if p not in params]
        if unbound:
            raise InputError(f"{side.label} needs ({', '.join(unbound)}), which no input names; the inputs are "
                             f"({', '.join(names)})")


def _from_generator(made, cand: Side) -> list[tuple[str, np.ndarray]]:
    if isinstance(made, dict):
        return [(k, np.asarray(v)) for k, v in made.items()]
    if not isinstance(made, (tuple, list)):
        made = (made,)
    names = cand.params if len(cand.params) >= len(made) else tuple(f"arg{i}" for i in range(len(made)))
    return [(names[i], np.asarray(v)) for i, v in enumerate(made)]


def validate_pair(ref: Side, cand: Side, *, specs=None, generator: Callable | None = None, regimes=("normal",),
                  static: dict | None = None, grad: bool = False, determinism: bool = True, seed: int | None = None,
                  shrink_failures: bool = True, config: NumericsConfig = DEFAULT_NUMERICS, inputs_text: str = "",
                  unordered: int | None = None, strict_ties: bool = False,
                  progress: Callable[[ValidateCase], None] | None = None) -> ValidateResult:
    """Every regime of the pair; `specs` (a parsed spec) or `generator(seed, regime)` gives the inputs."""
    seed = secrets.randbelow(2**31) if seed is None else seed
    static = dict(static or {})
    clear_compiled()
    pair = Pair(ref, cand, static, grad, determinism, config, unordered, strict_ties)
    if grad and ref.kind == "numpy":
        raise InputError(f"{ref.label}: a NumPy reference has no gradient; --grad needs a JAX or PyTorch reference")
    for n, p in cand.rename:
        if specs is not None and n not in {a.name for a in specs}:
            raise InputError(f"--bind {n}={p}: no input is named {n!r} (the inputs are "
                             f"{', '.join(a.name for a in specs)})")
        if cand.params and p not in cand.params:
            raise InputError(f"--bind {n}={p}: {cand.label} has no parameter {p!r} (it takes "
                             f"{', '.join(cand.params)})")
    if specs is not None:
        _check_names(ref, cand, tuple(a.name for a in specs))
    cases, skipped, notes, raised_by_ref = [], [], [], []
    for n, regime in enumerate(regimes):
        case_seed = (seed * 1000003 + n) % 2**31
        t0 = time.perf_counter()
        case_specs = None
        if generator is not None:
            made = generator(case_seed, regime)
            if made is None:
                skipped.append(regime)
                continue
            named = _from_generator(made, cand)
            if isinstance(made, dict):
                _check_names(ref, cand, tuple(k for k, _ in named))
        else:
            if regime == "odd_lengths" and not inp.shrink_map(specs, odd=True):
                skipped.append(regime)
                notes.append("odd_lengths skipped: no length dimension to shorten (a size above 8, a multiple of "
                             "8, that is no argument's last dimension)")
                continue
            case_specs = inp.resized(specs, inp.shrink_map(specs, odd=True)) if regime == "odd_lengths" else specs
            named = _named(specs, regime, case_seed)
        checks, measures, error, by_reference = _run(pair, named, case_seed)
        if error is not None:
            raised_by_ref.append(by_reference)
        case = ValidateCase(regime=regime, inputs=_describe(named), seed=case_seed, checks=tuple(checks),
                            measures=tuple(measures), error=error, seconds=round(time.perf_counter() - t0, 3))
        if not case.ok and shrink_failures and case_specs is not None:
            small = shrink(pair, case_specs, "normal" if regime == "odd_lengths" else regime, case_seed)
            if small is not None:
                case = replace(case, shrunk=small)
        cases.append(case)
        if progress:
            progress(case)
    if cases and len(raised_by_ref) == len(cases) and all(raised_by_ref):
        # the reference takes none of these inputs: the spec does not fit it, no case was judged
        raise InputError(cases[0].error + (f" (and in every other regime: {', '.join(c.regime for c in cases[1:])})"
                                           if len(cases) > 1 else ""))
    passed = sum(c.ok for c in cases)
    return ValidateResult(
        schema=SCHEMA, reference=ref.label, candidate=cand.label, kinds={"reference": ref.kind, "candidate": cand.kind},
        seed=seed, inputs=inputs_text, static={k: repr(v) for k, v in static.items()}, regimes=tuple(regimes),
        skipped=tuple(skipped), grad=grad, determinism=determinism,
        rule={"k": config.k, "floor_eps": config.floor_eps}, cases=tuple(cases),
        ok=bool(cases) and passed == len(cases), passed=passed, failed=len(cases) - passed, notes=tuple(notes))
