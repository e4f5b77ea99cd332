"""A JAX function re-evaluated with every floating value in float64: the yardstick of `validate`.

Enabling x64 and upcasting the inputs is not enough: model code casts explicitly
(`x.astype(jnp.float32)`, `preferred_element_type=jnp.float32`, a bf16 `astype` before a matmul),
so a reference run that way still rounds where it was written to. Here the function is traced to a
jaxpr and evaluated equation by equation with every bf16, f16 and f32 value, constant and
dtype parameter made float64: a `convert_element_type` to a float becomes one to float64, a
`reduce_precision` is dropped, calls (jit, custom JVP/VJP rules) are inlined, and the bodies of
`while`, `cond` and `scan` are traced again in float64 (`scan`, and `fori_loop` with a static trip
count, which JAX lowers to one: with jax 0.10 only; jax 0.11 changed scan's parameters, and such a
function runs under x64 as written, with a note). Integer and boolean values are left alone.

Constants keep the precision they were traced at: a Python `1.1` multiplied into an f32 array is
f32's 1.1 in the jaxpr.

The same evaluation with another target (`in_dtype(fn, kwargs, "bfloat16")`) is the reference's
working-precision twin: every floating value, its f32 statistics and accumulations included, in
the candidate's dtype, and its gradient differentiated there (validate's gradient allowance).

`shift` (signed multiples of eps, taken in turn by the sums in evaluation order) moves the result of
every sum by its own rounding bound: a `reduce_sum` by eps x n x sum|terms|, a `cumsum` by eps x n x
the whole axis' sum|terms| (n its length: the bound of any order of adding it, a port's that sums
the other way included). validate's tie analysis runs the float64 evaluation so: a decision that
changes there rests on a sum within its rounding error (a top-p cut over 32,000 near-equal
probabilities).

What cannot be re-evaluated (a primitive that insists on its dtype, a Pallas kernel) raises
`Unsupported`; the caller then runs the function under x64 as written and says so.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

_FLOATS = ("bfloat16", "float16", "float32", "float64")
_CONTROL = ("while", "cond", "scan")
_DTYPE_PARAMS = ("new_dtype", "preferred_element_type", "dtype")
_SUMS = ("reduce_sum", "cumsum")


class Unsupported(Exception):
    """The function holds something that cannot be evaluated in float64."""


def _other(dtype, to: str) -> bool:
    """A floating dtype to rewrite: any float but the target."""
    if dtype is None:
        return False
    name = str(np.dtype(dtype))
    return name in _FLOATS and name != to


def _up(x, to: str = "float64"):
    import jax.numpy as jnp

    dt = getattr(x, "dtype", None)
    if dt is not None and _other(dt, to):
        return jnp.asarray(x, jnp.dtype(to))
    return x


def _up_params(params: dict, to: str = "float64") -> dict:
    import jax.numpy as jnp

    out = dict(params)
    for k in _DTYPE_PARAMS:
        v = out.get(k)
        if v is not None:
            try:
                if _other(v, to):
                    out[k] = jnp.dtype(to)
            except TypeError:
                pass
    return out


def _closed(value):
    """The ClosedJaxpr (or Jaxpr, with no consts) a parameter holds, or None."""
    from jax.extend import core

    if isinstance(value, core.ClosedJaxpr):
        return value
    if isinstance(value, core.Jaxpr):
        return core.ClosedJaxpr(value, [])
    return None


class _Shifts:
    """The signed eps each sum takes, in turn."""

    def __init__(self, signs: tuple):
        self.signs, self.n = signs, 0

    def next(self) -> float:
        self.n += 1
        return self.signs[(self.n - 1) % len(self.signs)]


def _retrace(closed, avals, to: str, shift):
    """`closed` evaluated in `to`, as a new ClosedJaxpr over `avals` with their floats made `to`."""
    import jax

    args = [jax.ShapeDtypeStruct(a.shape, np.dtype(to) if _other(a.dtype, to) else a.dtype) for a in avals]
    return jax.make_jaxpr(lambda *xs: evaluate(closed.jaxpr, closed.consts, *xs, to=to, shift=shift))(*args)


def _shifted(eqn, params: dict, vals: list, out, shift: "_Shifts"):
    """A sum's result moved by its next signed eps x its rounding bound (the module's docstring)."""
    import jax.numpy as jnp

    x = vals[0]
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return out
    if eqn.primitive.name == "cumsum":
        axis = params["axis"]
        bound = x.shape[axis] * jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    else:
        bound = eqn.primitive.bind(jnp.ones_like(x), **params) * eqn.primitive.bind(jnp.abs(x), **params)
    return out + shift.next() * bound


def evaluate(jaxpr, consts, *args, to: str = "float64", shift: "_Shifts | None" = None):
    """Evaluate `jaxpr` with every floating value made `to` (float64: the yardstick), every sum's
    result moved by its rounding bound where `shift` is given."""
    from jax.extend import core

    env = {}

    def read(v):
        if isinstance(v, core.Literal):
            return _up(np.asarray(v.val), to) if hasattr(v.val, "dtype") or isinstance(v.val, float) else v.val
        return env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = _up(c, to)
    for v, a in zip(jaxpr.invars, args):
        env[v] = _up(a, to)
    for eqn in jaxpr.eqns:
        vals = [_up(read(v), to) for v in eqn.invars]
        name = eqn.primitive.name
        params = dict(eqn.params)
        subs = {k: c for k, v in params.items() if (c := _closed(v)) is not None}
        if name == "reduce_precision":
            outs = vals[:1]
        elif name in _CONTROL:
            outs = _control(eqn, name, params, vals, to, shift)
        elif subs:
            if "pallas" in name:
                raise Unsupported(f"{name}: a kernel runs in its own dtypes")
            # A call (jit, a custom JVP/VJP rule, remat): its body, inlined. The custom rule is
            # dropped; float64 gradients come from differentiating the body.
            body = next((subs[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in subs), next(iter(subs.values())))
            n_in = len(body.jaxpr.invars)
            outs = evaluate(body.jaxpr, body.consts, *vals[len(vals) - n_in:], to=to, shift=shift)
        else:
            try:
                out = eqn.primitive.bind(*vals, **_up_params(params, to))
            except Exception as e:
                raise Unsupported(f"{name}: {str(e).splitlines()[0][:200]}") from e
            if shift and name in _SUMS:
                out = _shifted(eqn, _up_params(params, to), vals, out, shift)
            outs = out if eqn.primitive.multiple_results else [out]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _control(eqn, name: str, params: dict, vals: list, to: str, shift):
    """while / cond / scan with their bodies traced again in `to`."""
    from jax.core import ShapedArray

    avals = [ShapedArray(np.shape(v), v.dtype) for v in vals]
    p = dict(params)
    if name == "while":
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        carry = avals[nc + nb:]
        p["cond_jaxpr"] = _retrace(p["cond_jaxpr"], avals[:nc] + carry, to, shift)
        p["body_jaxpr"] = _retrace(p["body_jaxpr"], avals[nc:nc + nb] + carry, to, shift)
    elif name == "cond":
        p["branches"] = tuple(_retrace(b, avals[1:], to, shift) for b in p["branches"])
    else:  # scan: the body sees one slice of each scanned input
        if "num_consts" not in p:  # jax >= 0.11 describes scan's operands by a flat tree instead
            raise Unsupported("scan: re-evaluated in float64 with jax 0.10's scan parameters only")
        nc, ncarry = p["num_consts"], p["num_carry"]
        xs = [ShapedArray(a.shape[1:], a.dtype) for a in avals[nc + ncarry:]]
        p["jaxpr"] = _retrace(p["jaxpr"], avals[:nc + ncarry] + xs, to, shift)
        if "linear" in p:
            p["linear"] = tuple(p["linear"])
    try:
        out = eqn.primitive.bind(*vals, **p)
    except Exception as e:
        raise Unsupported(f"{name}: {str(e).splitlines()[0][:200]}") from e
    return out if eqn.primitive.multiple_results else [out]


def in_float64(fn: Callable, kwargs: dict, shift: tuple = ()) -> Callable:
    """`fn` (called with positional float64 arrays, `kwargs` static) evaluated in float64 throughout,
    every sum moved by its rounding bound times the signed eps of `shift`, in turn. Must be called
    under `jax.enable_x64()`."""
    return in_dtype(fn, kwargs, "float64", shift)


def in_dtype(fn: Callable, kwargs: dict, to: str, shift: tuple = ()) -> Callable:
    """`fn` (called with positional arrays of `to`, `kwargs` static) evaluated with every floating
    value in `to` (float64: under `jax.enable_x64()`)."""
    import jax

    def run(*args):
        closed, shape = jax.make_jaxpr(lambda *a: fn(*a, **kwargs), return_shape=True)(*args)
        flat = evaluate(closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args), to=to,
                        shift=_Shifts(shift) if shift else None)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), flat)

    return run
