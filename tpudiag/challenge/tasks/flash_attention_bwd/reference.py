"""The flash_attention_bwd task's reference: Llama's attention, adapted to JAX from Hugging Face
transformers 4.57.6, src/transformers/models/llama/modeling_llama.py (Apache-2.0):
`eager_attention_forward` and `repeat_kv`, with the causal mask of `causal_mask_function` in
src/transformers/masking_utils.py. Its gradient is JAX's autodiff of this function.

Adapted: q, k, v come in already projected and rotated, [B, H, S, D] and [B, KVH, S, D]; scaling
head_dim^-0.5 (LlamaAttention.scaling); the scores are float32 from the matmul on (transformers
forms them in the activations' dtype and upcasts at the softmax); masked scores are -inf rather
than the dtype's minimum added; no dropout. The probabilities are cast back to the activations'
dtype before the matmul with v, as there. A solution may not import or call it."""

import jax
import jax.numpy as jnp


def flash_attention(q, k, v):
    b, h, s, d = q.shape
    groups = h // k.shape[1]
    acc = jnp.promote_types(q.dtype, jnp.float32)
    key_states = jnp.repeat(k, groups, axis=1)  # repeat_kv
    value_states = jnp.repeat(v, groups, axis=1)
    attn_weights = jnp.einsum("bhqd,bhkd->bhqk", q, key_states, preferred_element_type=acc) * d ** -0.5
    causal = jnp.arange(k.shape[2])[None, :] <= jnp.arange(s)[:, None]
    attn_weights = jnp.where(causal[None, None], attn_weights, -jnp.inf)
    attn_weights = jax.nn.softmax(attn_weights, axis=-1).astype(q.dtype)
    out = jnp.einsum("bhqk,bhkd->bhqd", attn_weights, value_states, preferred_element_type=acc)
    return out.astype(q.dtype)
