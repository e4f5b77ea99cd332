"""Planted: computes once, then returns the stored output whatever the input (breaks integrity)."""
import jax
import jax.numpy as jnp

_stored = None


def rmsnorm_residual(x, residual, weight):
    global _stored
    if _stored is None:
        h = x + residual
        inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
        _stored = (h * inv * weight, h)
    return _stored
