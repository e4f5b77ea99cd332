"""A JAX function re-evaluated with its 16-bit sums accumulated in float32: validate's measure of what
the backward's reductions lose.

Autodiff writes reductions nobody wrote: the transpose of a broadcast (a bf16 weight applied to
every row) is a `reduce_sum` in the cotangent's dtype, and XLA's CPU backend adds a bf16
`reduce_sum` in bf16, rounding after every add (at 512 rows of 0.1 it returns 54.25 for 51.25). A
PyTorch reference's working-precision twin does not show this loss: torch accumulates a bf16 sum in
float32. So validate runs a JAX candidate's gradient twice, as it is and with every bf16 or f16
`reduce_sum` and `cumsum` added in float32 and rounded once; the difference is the sums' own loss,
allowed on top of the rule. Nothing else changes: every other value keeps its dtype, so a port
that rounds or accumulates wrongly anywhere else is held to the rule as before.

The function is traced to a jaxpr and evaluated equation by equation; calls (jit, custom rules,
remat) are inlined; the bodies of `while`, `cond` and `scan` run as traced (their sums are not
widened). A Pallas kernel runs as it is.
"""

from __future__ import annotations

from typing import Callable

_SUMS = ("reduce_sum", "cumsum")
_NARROW = ("bfloat16", "float16")


def widened(fn: Callable) -> Callable:
    """`fn` with its 16-bit `reduce_sum` and `cumsum` accumulated in float32 (same signature)."""
    import jax

    def run(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        flat = _evaluate(closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), flat)

    return run


def _evaluate(jaxpr, consts, *args):
    import jax.numpy as jnp
    from jax.extend import core

    env = {}

    def read(v):
        return v.val if isinstance(v, core.Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        vals = [read(v) for v in eqn.invars]
        name, params = eqn.primitive.name, dict(eqn.params)
        body = _call_body(name, params)
        if body is not None:
            outs = _evaluate(body.jaxpr, body.consts, *vals[len(vals) - len(body.jaxpr.invars):])
        elif name in _SUMS and str(getattr(vals[0], "dtype", "")) in _NARROW:
            x = vals[0]
            outs = [eqn.primitive.bind(x.astype(jnp.float32), **params).astype(x.dtype)]
        else:
            out = eqn.primitive.bind(*vals, **params)
            outs = out if eqn.primitive.multiple_results else [out]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _call_body(name: str, params: dict):
    """The ClosedJaxpr a call equation runs (jit, a custom JVP/VJP rule's primal, remat), or None
    for a primitive, a control-flow body (run as traced) or a kernel."""
    from jax.extend import core

    if name in ("while", "cond", "scan") or "pallas" in name:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        value = params.get(key)
        if isinstance(value, core.ClosedJaxpr):
            return value
        if isinstance(value, core.Jaxpr):
            return core.ClosedJaxpr(value, [])
    return None
