"""The rope_interleaved task's reference: GPT-J's rotary embedding, adapted to JAX from Hugging Face
transformers 4.57.6, src/transformers/models/gptj/modeling_gptj.py (Apache-2.0):
`create_sinusoidal_positions`, `rotate_every_two` and `apply_rotary_pos_emb`.

Adapted: the angle table is computed at the given positions instead of gathered from a table of
`max_positions` rows; the whole head is rotated (GPT-J rotates the first `rotary_dim` lanes and
passes the rest through); the math is float32 and the result cast back to the input's dtype
(GPT-J casts the sin/cos table to the activations' dtype and rotates in it). Interleaved layout:
lane 2i pairs with lane 2i + 1, both turned by angle i. A solution may not import or call it."""

import jax.numpy as jnp
import numpy as np


def _rotate_every_two(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return jnp.stack((-x2, x1), axis=-1).reshape(x.shape)


def rope_interleaved(q, k, positions):
    ct = jnp.promote_types(q.dtype, jnp.float32)
    d = q.shape[-1]
    inv_freq = jnp.asarray(1.0 / (10000 ** (np.arange(0, d, 2, dtype=np.int64) / d)), ct)
    sinusoid = positions.astype(ct)[..., None] * inv_freq  # [B, S, D/2]
    sin = jnp.repeat(jnp.sin(sinusoid)[:, :, None, :], 2, axis=3)  # repeat_interleave: lanes 2i, 2i+1
    cos = jnp.repeat(jnp.cos(sinusoid)[:, :, None, :], 2, axis=3)

    def apply(x):
        xf = x.astype(ct)
        return (xf * cos + _rotate_every_two(xf) * sin).astype(x.dtype)

    return apply(q), apply(k)
