"""Planted, for the flash_attention task: grouped-query attention with every other detail right but
no causal mask, so each query also attends to the keys after it (breaks correctness)."""
import jax
import jax.numpy as jnp


def flash_attention(q, k, v):
    groups = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(q.dtype)
