"""The rope_interleaved task's ground truth, in JAX: no bundled kernel has the interleaved layout
(tpudiag.kernels.rope rotates halves), and feeding it de-interleaved lanes costs two lane-strided
copies that take longer than the rotation (the TPU static profile at the speed shapes: 413k cycles
against XLA's 274k for the reference). The pair swap here is two lane rotations and a parity
select, x[2i] <- -x[2i + 1] and x[2i + 1] <- x[2i], no strided slice or gather, so the whole
rotation is one elementwise fusion that reads q and k once and writes them once. Angles in float32
from the positions; the result cast back to the inputs' dtype."""

import jax.numpy as jnp
from jax import lax


def _swap_pairs(x):
    even = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1) % 2 == 0
    return jnp.where(even, -jnp.roll(x, -1, axis=-1), jnp.roll(x, 1, axis=-1))


def rope_interleaved(q, k, positions, interpret=None):
    del interpret  # plain JAX: nothing to interpret
    d = q.shape[-1]
    lane_pair = (jnp.arange(d) // 2).astype(jnp.float32)  # lanes 2i and 2i + 1 share angle i
    inv_freq = 10000.0 ** (-2.0 * lane_pair / d)
    ang = positions.astype(jnp.float32)[..., None, None] * inv_freq  # [B, S, 1, D]
    cos, sin = jnp.cos(ang), jnp.sin(ang)

    def apply(x):
        xf = x.astype(jnp.float32)
        return (xf * cos + _swap_pairs(xf) * sin).astype(x.dtype)

    return apply(q), apply(k)
