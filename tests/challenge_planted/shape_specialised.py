"""Planted: hard-codes the public shape [8, 512] (breaks correctness at the hidden shapes only)."""
import jax
import jax.numpy as jnp


def rmsnorm_residual(x, residual, weight):
    h = (x + residual).reshape(8, 512)
    inv = jax.lax.rsqrt(jnp.sum(h * h, axis=-1, keepdims=True) / 512.0 + 1e-6)
    return (h * inv * weight[:512]).reshape(8, 512), h
