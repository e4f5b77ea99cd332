"""sliding_window_attention, subtly wrong: the window keeps key j when i - j <= 100, one key more
than Gemma's i - j < 100 (transformers' kv_idx > q_idx - sliding_window); everything else right."""
import jax
import jax.numpy as jnp


def sliding_window_attention(q, k, v):
    groups = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])
    s = 50.0 * jnp.tanh(s / 50.0)
    i, j = jnp.arange(q.shape[2])[:, None], jnp.arange(k.shape[2])[None, :]
    s = jnp.where((j <= i) & (i - j <= 100), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v, preferred_element_type=jnp.float32).astype(q.dtype)
