"""Planted: the right math times 1.01 (breaks correctness)."""
import jax
import jax.numpy as jnp


def rmsnorm_residual(x, residual, weight):
    h = x + residual
    inv = jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
    return h * inv * weight * 1.01, h
