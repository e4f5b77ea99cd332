"""Planted: the int8 matmul accumulated in bfloat16 where the task is float32 (breaks correctness)."""
import jax.numpy as jnp


def int8_matmul(x, w, scales):
    wd = (w.astype(jnp.float32) * scales[None, :]).astype(jnp.bfloat16)
    return jnp.dot(x.astype(jnp.bfloat16), wd, preferred_element_type=jnp.bfloat16).astype(x.dtype)
