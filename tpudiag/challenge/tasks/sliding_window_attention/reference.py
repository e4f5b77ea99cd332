"""The sliding_window_attention task's reference: Gemma 2's attention on a sliding-attention layer,
adapted to JAX from Hugging Face transformers 4.57.6: `eager_attention_forward` and `repeat_kv` in
src/transformers/models/gemma2/modeling_gemma2.py, and the mask of `causal_mask_function` plus
`sliding_window_overlay` in src/transformers/masking_utils.py (both Apache-2.0).

Adapted: q, k, v come in already projected and rotated, [B, H, S, D] and [B, KVH, S, D]; the
scaling is head_dim^-0.5 (Gemma 2 2B and 9B set query_pre_attn_scalar = head_dim = 256); the soft
cap is Gemma 2's attn_logit_softcapping, 50.0; the window is 100 positions (Gemma 2's is 4096,
shortened so that it binds at the graded lengths); the scores are float32 from the matmul on
(transformers forms them in the activations' dtype and upcasts at the softmax); masked scores are
-inf rather than the dtype's minimum added; no dropout. The probabilities are cast back to the
activations' dtype before the matmul with v, as there. A solution may not import or call it."""

import jax
import jax.numpy as jnp

SOFTCAP = 50.0
WINDOW = 100


def sliding_window_attention(q, k, v):
    b, h, s, d = q.shape
    groups = h // k.shape[1]
    acc = jnp.promote_types(q.dtype, jnp.float32)
    key_states = jnp.repeat(k, groups, axis=1)  # repeat_kv
    value_states = jnp.repeat(v, groups, axis=1)
    scaling = d ** -0.5
    attn_weights = jnp.einsum("bhqd,bhkd->bhqk", q, key_states, preferred_element_type=acc) * scaling
    attn_weights = attn_weights / SOFTCAP
    attn_weights = jnp.tanh(attn_weights)
    attn_weights = attn_weights * SOFTCAP
    q_idx = jnp.arange(s)[:, None]
    kv_idx = jnp.arange(k.shape[2])[None, :]
    visible = (kv_idx <= q_idx) & (kv_idx > q_idx - WINDOW)  # causal, and the sliding-window overlay
    attn_weights = jnp.where(visible[None, None], attn_weights, -jnp.inf)
    attn_weights = jax.nn.softmax(attn_weights, axis=-1).astype(q.dtype)
    out = jnp.einsum("bhqk,bhkd->bhqd", attn_weights, value_states, preferred_element_type=acc)
    return out.astype(q.dtype)
