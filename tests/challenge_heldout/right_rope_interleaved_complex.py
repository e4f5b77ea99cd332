"""rope_interleaved, right: Meta's Llama reference form of the interleaved rotation, lanes (2i, 2i + 1)
read as one complex number times e^(i * angle) (torch.view_as_complex there), not the ground truth's
de-interleave around the rotate-half kernel."""
import jax.numpy as jnp


def rope_interleaved(q, k, positions):
    d = q.shape[-1]
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = positions.astype(jnp.float32)[..., None, None] * freqs  # [B, S, 1, D/2]
    rot = jnp.exp(1j * angles.astype(jnp.complex64))

    def apply(x):
        xc = x.astype(jnp.float32).reshape(*x.shape[:-1], d // 2, 2)
        z = (xc[..., 0] + 1j * xc[..., 1]) * rot
        return jnp.stack([z.real, z.imag], axis=-1).reshape(x.shape).astype(x.dtype)

    return apply(q), apply(k)
