"""The reference's float64 run, and the same run on inputs moved a little: where a discrete decision
is a tie (either answer right), and how far the reference's own error spreads between neighbouring
inputs (the yardstick for an ill-conditioned case). The parity harness (harness.py) asks; `pair` is
its `Pair`."""

from __future__ import annotations

import numpy as np

from tpudiag.analyze.numerics import EPS, normwise_error
from tpudiag.parity.sides import call, float64_call, grads, is_float, torch_call

# Ties: the reference's float64 run again on inputs moved by this many eps of each input's dtype
# (relative, random: the precision the reference works in), this many times, and with the classes
# in this many other orders; a discrete output that changes is a tie there, either answer right.
_TIE_EPS, _TIE_RUNS, _TIE_ORDERS = 2, 6, 3
# And with every sum moved by its own rounding bound, n x eps x sum|terms| (Higham's gamma_n for a
# recursive sum of n terms in any order; eps, not u = eps/2, covers u/(1-nu)), up, down, and every
# other sum the other way (a softmax's normalizer and the cumulative sum over it move apart):
# moving the inputs by a few eps does not move a sum of 32,000 near-equal probabilities by its
# accumulated error, and a top-p cut there rests on that error. The eps is float32's for 16-bit
# inputs: frameworks accumulate a sum of bf16 in float32 (PyTorch's CPU kernels; jnp.sum), and a port
# whose cumulative sum runs in bf16 keeps another nucleus (transformers' Flax top-p,
# docs/validate.md): a finding, not a tie.
_SUM_EPS_FLOOR = "float32"
# A failing case is judged again against the reference's error on this many inputs moved as for
# the ties (`nearby_errors`).
NEAR_RUNS = 3


def discrete(a: np.ndarray) -> bool:
    return a.dtype.kind in "biu"


def sorted_along(outs: list, dim: int | None) -> list:
    """`--unordered DIM`: every output sorted along DIM, each compared as a set (top-k indices in no
    set order, and the weights that come with them: tied experts carry equal weights)."""
    if dim is None:
        return outs
    return [np.sort(a, axis=dim) if a.ndim > dim >= -a.ndim else a for a in outs]


def _permuted_truth(pair, named, truth: list, rng) -> list:
    """The float64 run with the classes (the last axis of the floating inputs, where they share one)
    in another order, mapped back: a boolean output along that axis is moved back, an integer one
    (indices into it) renamed. Where that changes a decision, the reference broke a tie by position,
    which perturbing the values cannot show (probabilities that underflow to the same 0)."""
    lasts = {a.shape[-1] for _, a in named if is_float(a) and a.ndim}
    if len(lasts) != 1:
        return []
    n = lasts.pop()
    perm = rng.permutation(n)
    moved = [(name, a[..., perm] if a.ndim and a.shape[-1] == n else a) for name, a in named]
    again = float64_truth(pair, moved)[0]
    out = []
    for a, t in zip(again, truth):
        a = np.asarray(a)
        if not discrete(t) or a.shape != np.shape(t):
            out.append(None)
        elif a.dtype.kind == "b" and a.shape[-1] == n:
            back = np.empty_like(a)
            back[..., perm] = a
            out.append(back)
        elif a.dtype.kind in "iu" and a.size and a.min() >= 0 and a.max() < n:
            out.append(sorted_along([perm[a]], pair.unordered)[0])
        else:
            out.append(None)
    return out


def ambiguous(pair, named, truth: list, seed: int) -> list | None:
    """Per output, where the reference's own discrete decision is a tie (None for a float output):
    its float64 run changes when the floating inputs move by a few eps of their dtype, when its sums
    move by their own rounding bound, or when their classes come in another order."""
    if not any(discrete(t) for t in truth):
        return None
    out = [np.zeros(np.shape(t), bool) if discrete(t) else None for t in truth]
    floats = [k for k, (_, a) in enumerate(named) if is_float(a)]
    if not floats:
        return out
    rng = np.random.default_rng(seed + 104729)
    for _ in range(_TIE_RUNS):
        moved = [(n, np.asarray(a, np.float64) * (1 + _TIE_EPS * eps_of(a) * rng.standard_normal(a.shape))
                  if k in floats else a) for k, (n, a) in enumerate(named)]
        again = sorted_along(float64_truth(pair, moved)[0], pair.unordered)
        for j, (a, t) in enumerate(zip(again, truth)):
            if out[j] is not None and np.shape(a) == np.shape(t):
                out[j] |= np.asarray(a) != np.asarray(t)
    if pair.ref.kind in ("jax", "torch"):  # a NumPy reference's sums are not seen
        eps = min(EPS.get(working_dtype(named), EPS["float32"]), EPS[_SUM_EPS_FLOOR])
        for signs in ((1.0,), (-1.0,), (1.0, -1.0), (-1.0, 1.0)):
            again = sorted_along(float64_truth(pair, named, shift=tuple(eps * x for x in signs))[0], pair.unordered)
            for j, (a, t) in enumerate(zip(again, truth)):
                if out[j] is not None and np.shape(a) == np.shape(t):
                    out[j] |= np.asarray(a) != np.asarray(t)
    for _ in range(_TIE_ORDERS):
        for j, a in enumerate(_permuted_truth(pair, named, truth, rng)):
            if out[j] is not None and a is not None:
                out[j] |= a != np.asarray(truth[j])
    for j, a in enumerate(_equal_value_ties(named, truth)):
        if out[j] is not None and a is not None:
            out[j] |= a
    if pair.unordered is not None:  # a set: a tie anywhere in it moves every element after it
        out = [a if a is None or not a.ndim > pair.unordered >= -a.ndim else
               np.broadcast_to(np.any(a, axis=pair.unordered, keepdims=True), a.shape).copy() for a in out]
    return out


def _equal_value_ties(named, truth: list) -> list:
    """Ties in the inputs themselves, per row of the one floating input: a keep-mask of its shape
    that keeps some copies of a value and drops others, or top-k indices that took a value another
    (unselected) element also holds. A large tied group cut near its edge rarely moves under
    perturbation; this finds it directly."""
    xs = [np.asarray(a, np.float64) for _, a in named if is_float(a) and a.ndim]
    if len(xs) != 1:
        return []
    x = xs[0].reshape(-1, xs[0].shape[-1])
    out = []
    for t in truth:
        t = np.asarray(t)
        if t.dtype.kind == "b" and t.shape == xs[0].shape:
            d = t.reshape(x.shape)
            amb = np.zeros_like(d)
            for r in range(x.shape[0]):
                mixed = np.intersect1d(x[r][d[r]], x[r][~d[r]])
                if mixed.size:
                    amb[r] = np.isin(x[r], mixed)
            out.append(amb.reshape(t.shape))
        elif t.dtype.kind in "iu" and t.ndim == xs[0].ndim and t.shape[:-1] == xs[0].shape[:-1] and t.size \
                and t.min() >= 0 and t.max() < x.shape[1]:
            idx = t.reshape(x.shape[0], -1)
            amb = np.zeros(idx.shape, bool)
            for r in range(x.shape[0]):
                rest = np.delete(x[r], idx[r])
                amb[r] = np.isin(x[r][idx[r]], rest)
            out.append(amb.reshape(t.shape))
        else:
            out.append(None)
    return out


def eps_of(a: np.ndarray) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(a.dtype).eps) if is_float(a) else 0.0


def float64_truth(pair, named, shift: tuple = ()) -> tuple[list, str | None]:
    """The reference's float64 run, and what it says about itself; `shift`: with every sum moved by
    its rounding bound times these signed eps, in turn (a JAX or PyTorch reference)."""
    if pair.ref.kind == "jax":
        return float64_call(pair.ref, named, pair.static, shift)
    if pair.ref.kind == "torch":
        return torch_call(pair.ref, named, pair.static, f64=True, shift=shift)
    return call(pair.ref, named, pair.static, f64=True), None


def working_dtype(named) -> str | None:
    """The lowest-precision floating dtype among the inputs: the precision a port computes in."""
    floats = [str(a.dtype) for _, a in named if is_float(a)]
    return max(floats, key=lambda d: EPS.get(d, 0.0)) if floats else None


def nearby_errors(pair, named, seed: int, *, wrt: tuple | None = None, cotangents=None) -> list | None:
    """Per floating output (or, with `wrt`, per gradient), the reference's largest normwise error
    against float64 on `NEAR_RUNS` copies of the inputs moved by `_TIE_EPS` eps of their dtype (None
    for other outputs, or where the reference cannot run so). Ill-conditioned (attention over
    logits in the thousands; a softmax's gradient over near-equal probabilities), its error on one
    input is one draw from a spread of up to 100x between neighbours."""
    floats = [k for k, (_, a) in enumerate(named) if is_float(a)]
    if not floats:
        return None
    rng = np.random.default_rng(seed + 15485863)
    worst = None
    try:
        for _ in range(NEAR_RUNS):
            moved = [(n, (np.asarray(a, np.float64) * (1 + _TIE_EPS * eps_of(a) * rng.standard_normal(a.shape)))
                      .astype(a.dtype)) if k in floats else (n, a) for k, (n, a) in enumerate(named)]
            if wrt is None:
                again = sorted_along(call(pair.ref, moved, pair.static), pair.unordered)
                truth = sorted_along(float64_truth(pair, moved)[0], pair.unordered)
            else:
                again = grads(pair.ref, moved, pair.static, cotangents, wrt)
                truth = grads(pair.ref, moved, pair.static, cotangents, wrt, f64=True)
            if worst is None:
                worst = [0.0 if is_float(np.asarray(r)) else None for r in again]
            for j, (r, t) in enumerate(zip(again, truth)):
                if worst[j] is not None and np.shape(r) == np.shape(t):
                    err = normwise_error(r, t)
                    if np.isfinite(err):
                        worst[j] = max(worst[j], err)
    except Exception:
        return None
    return worst
