"""qwen3_moe, subtly wrong: Mixtral's routing, the top-4 softmax weights used as they are, without
Qwen3's norm_topk_prob renormalisation over the chosen experts."""
import jax
import jax.numpy as jnp

TOP_K = 4


def qwen3_moe(hidden, gate_w, w_gate, w_up, w_down):
    logits = jnp.dot(hidden, gate_w.T, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    p = jax.nn.softmax(logits, axis=-1)
    _, experts = jax.lax.top_k(logits, TOP_K)
    weights = jnp.sum(jax.nn.one_hot(experts, gate_w.shape[0]) * jnp.take_along_axis(p, experts, 1)[..., None], 1)
    g = jnp.einsum("td,edf->etf", hidden, w_gate, preferred_element_type=jnp.float32)
    u = jnp.einsum("td,edf->etf", hidden, w_up, preferred_element_type=jnp.float32)
    h = (jax.nn.silu(g) * u).astype(hidden.dtype)
    y = jnp.einsum("etf,efd->etd", h, w_down, preferred_element_type=jnp.float32)
    return jnp.einsum("te,etd->td", weights, y).astype(hidden.dtype)
