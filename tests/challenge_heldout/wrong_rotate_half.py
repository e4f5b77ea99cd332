"""rope_interleaved, subtly wrong: the rotate-half convention (Llama's, GPT-NeoX's: lane i pairs with
lane i + D/2) where the task asks for interleaved pairs (lane 2i with 2i + 1); angles, dtypes and
everything else right."""
import jax.numpy as jnp


def rope_interleaved(q, k, positions):
    d = q.shape[-1]
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = positions.astype(jnp.float32)[..., None, None] * freqs
    cos, sin = jnp.cos(ang), jnp.sin(ang)

    def apply(x):
        x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)

    return apply(q), apply(k)
