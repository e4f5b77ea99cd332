"""Planted, for the rmsnorm_residual task: right, and slow on purpose: each row's mean of squares
taken by a float32 matmul against a [D, D] matrix of ones (D times the FLOPs of a sum, and at
HIGHEST precision the MXU takes six bf16 passes), where a reduction streams the rows once (loses
speed points only)."""
import jax
import jax.numpy as jnp


def rmsnorm_residual(x, residual, weight):
    h = x + residual
    hf = h.astype(jnp.float32)
    d = h.shape[-1]
    ones = jnp.ones((d, d), jnp.float32)  # every column of the product holds the row's sum
    ms = jnp.matmul(hf * hf, ones, precision=jax.lax.Precision.HIGHEST) / d
    return (hf / jnp.sqrt(ms + 1e-6) * weight.astype(jnp.float32)).astype(x.dtype), h
