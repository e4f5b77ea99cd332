"""A correct plain-JAX solution written independently of the reference (scores full marks)."""
import jax.numpy as jnp


def rmsnorm_residual(x, residual, weight):
    h = x + residual
    ms = jnp.mean(jnp.square(h), axis=-1, keepdims=True)
    return h / jnp.sqrt(ms + 1e-6) * weight, h
