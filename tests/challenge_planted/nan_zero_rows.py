"""Planted: the eps left out, so a row of zeros gives 0 * inf = NaN (breaks correctness)."""
import jax
import jax.numpy as jnp


def rmsnorm_residual(x, residual, weight):
    h = x + residual
    inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True))
    return h * inv * weight, h
