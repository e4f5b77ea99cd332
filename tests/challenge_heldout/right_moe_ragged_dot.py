"""qwen3_moe, right: routing in jnp, the (token, expert) pairs sorted by expert and the three expert
matmuls done by jax.lax.ragged_dot over the sorted rows, the combine by a scatter-add; not the
ground truth's Pallas grouped matmuls."""
import jax
import jax.numpy as jnp

TOP_K = 4


def qwen3_moe(hidden, gate_w, w_gate, w_up, w_down):
    t, e = hidden.shape[0], gate_w.shape[0]
    logits = jnp.dot(hidden, gate_w.T, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    _, experts = jax.lax.top_k(logits, TOP_K)
    p = jax.nn.softmax(logits, axis=-1)
    w = jnp.take_along_axis(p, experts, axis=1)
    w = w / w.sum(axis=1, keepdims=True)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    tokens = order // TOP_K
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    xs = hidden[tokens]
    g = jax.lax.ragged_dot(xs, w_gate, sizes, preferred_element_type=jnp.float32)
    u = jax.lax.ragged_dot(xs, w_up, sizes, preferred_element_type=jnp.float32)
    h = (jax.nn.silu(g) * u).astype(hidden.dtype)
    y = jax.lax.ragged_dot(h, w_down, sizes, preferred_element_type=jnp.float32)
    y = y * w.reshape(-1)[order][:, None]
    return jnp.zeros((t, hidden.shape[1]), jnp.float32).at[tokens].add(y).astype(hidden.dtype)
