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

What cannot be re-evaluated (a primitive that insists on its dtype, a Pallas kernel) raises
`Unsupported`; the caller then runs the function under x64 as written and says so.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

_LOW = ("bfloat16", "float16", "float32")
_CONTROL = ("while", "cond", "scan")
_DTYPE_PARAMS = ("new_dtype", "preferred_element_type", "dtype")


class Unsupported(Exception):
    """The function holds something that cannot be evaluated in float64."""


def _low(dtype) -> bool:
    return str(np.dtype(dtype)) in _LOW if dtype is not None else False


def _up(x):
    import jax.numpy as jnp

    dt = getattr(x, "dtype", None)
    if dt is not None and _low(dt):
        return jnp.asarray(x, jnp.float64)
    return x


def _up_params(params: dict) -> dict:
    import jax.numpy as jnp

    out = dict(params)
    for k in _DTYPE_PARAMS:
        v = out.get(k)
        if v is not None:
            try:
                if _low(v):
                    out[k] = jnp.dtype(jnp.float64)
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


def _retrace(closed, avals):
    """`closed` evaluated in float64, as a new ClosedJaxpr over float64 `avals`."""
    import jax

    args = [jax.ShapeDtypeStruct(a.shape, np.float64 if _low(a.dtype) else a.dtype) for a in avals]
    return jax.make_jaxpr(lambda *xs: evaluate(closed.jaxpr, closed.consts, *xs))(*args)


def evaluate(jaxpr, consts, *args):
    """Evaluate `jaxpr` with every low-precision float made float64."""
    from jax.extend import core

    env = {}

    def read(v):
        if isinstance(v, core.Literal):
            return _up(np.asarray(v.val)) if hasattr(v.val, "dtype") or isinstance(v.val, float) else v.val
        return env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = _up(c)
    for v, a in zip(jaxpr.invars, args):
        env[v] = _up(a)
    for eqn in jaxpr.eqns:
        vals = [_up(read(v)) for v in eqn.invars]
        name = eqn.primitive.name
        params = dict(eqn.params)
        subs = {k: c for k, v in params.items() if (c := _closed(v)) is not None}
        if name == "reduce_precision":
            outs = vals[:1]
        elif name in _CONTROL:
            outs = _control(eqn, name, params, vals)
        elif subs:
            if "pallas" in name:
                raise Unsupported(f"{name}: a kernel runs in its own dtypes")
            # A call (jit, a custom JVP/VJP rule, remat): its body, inlined. The custom rule is
            # dropped; float64 gradients come from differentiating the body.
            body = next((subs[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in subs), next(iter(subs.values())))
            n_in = len(body.jaxpr.invars)
            outs = evaluate(body.jaxpr, body.consts, *vals[len(vals) - n_in:])
        else:
            try:
                out = eqn.primitive.bind(*vals, **_up_params(params))
            except Exception as e:
                raise Unsupported(f"{name}: {str(e).splitlines()[0][:200]}") from e
            outs = out if eqn.primitive.multiple_results else [out]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _control(eqn, name: str, params: dict, vals: list):
    """while / cond / scan with their bodies traced again in float64."""
    from jax.core import ShapedArray

    avals = [ShapedArray(np.shape(v), v.dtype) for v in vals]
    p = dict(params)
    if name == "while":
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        carry = avals[nc + nb:]
        p["cond_jaxpr"] = _retrace(p["cond_jaxpr"], avals[:nc] + carry)
        p["body_jaxpr"] = _retrace(p["body_jaxpr"], avals[nc:nc + nb] + carry)
    elif name == "cond":
        p["branches"] = tuple(_retrace(b, avals[1:]) for b in p["branches"])
    else:  # scan: the body sees one slice of each scanned input
        if "num_consts" not in p:  # jax >= 0.11 describes scan's operands by a flat tree instead
            raise Unsupported("scan: re-evaluated in float64 with jax 0.10's scan parameters only")
        nc, ncarry = p["num_consts"], p["num_carry"]
        xs = [ShapedArray(a.shape[1:], a.dtype) for a in avals[nc + ncarry:]]
        p["jaxpr"] = _retrace(p["jaxpr"], avals[:nc + ncarry] + xs)
        if "linear" in p:
            p["linear"] = tuple(p["linear"])
    try:
        out = eqn.primitive.bind(*vals, **p)
    except Exception as e:
        raise Unsupported(f"{name}: {str(e).splitlines()[0][:200]}") from e
    return out if eqn.primitive.multiple_results else [out]


def in_float64(fn: Callable, kwargs: dict) -> Callable:
    """`fn` (called with positional float64 arrays, `kwargs` static) evaluated in float64 throughout.
    Must be called under `jax.enable_x64()`."""
    import jax

    def run(*args):
        closed, shape = jax.make_jaxpr(lambda *a: fn(*a, **kwargs), return_shape=True)(*args)
        flat = evaluate(closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), flat)

    return run
