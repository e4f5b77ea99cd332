"""The rmsnorm_residual task's reference: tpudiag.kernels.rmsnorm.reference, as written there (plain
JAX: the add in the storage dtype, float32 statistics). A solution may not import or call it."""

import jax
import jax.numpy as jnp


def rmsnorm_residual(x, residual, weight):
    h = x + residual
    hf = h.astype(jnp.promote_types(h.dtype, jnp.float32))
    inv = jax.lax.rsqrt(jnp.mean(hf * hf, axis=-1, keepdims=True) + 1e-6)
    return (hf * inv * weight.astype(hf.dtype)).astype(x.dtype), h
