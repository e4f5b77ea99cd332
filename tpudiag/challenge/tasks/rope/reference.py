"""The rope task's reference: tpudiag.kernels.rope.reference with integer positions, as written
there (float32 math, cast back). A solution may not import or call it."""

import jax.numpy as jnp
import numpy as np


def _rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def rope(q, k, positions):
    ct = jnp.promote_types(q.dtype, jnp.float32)
    d = q.shape[-1]
    inv_freq = jnp.asarray(1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d)), ct)
    ang = positions.astype(ct)[..., None] * inv_freq
    ang = jnp.concatenate([ang, ang], axis=-1)
    cos, sin = jnp.cos(ang)[..., None, :], jnp.sin(ang)[..., None, :]

    def apply(x):
        xf = x.astype(ct)
        return (xf * cos + _rotate_half(xf) * sin).astype(x.dtype)

    return apply(q), apply(k)
