"""The grouped_matmul task's reference: tpudiag.kernels.grouped_matmul.reference, as written there
(every expert applied to every row, each row keeping its own group's product: the dense masked
computation; f32 accumulation, float64 in float64). A solution may not import or call it."""

import jax
import jax.numpy as jnp


def grouped_matmul(lhs, rhs, group_sizes):
    m = lhs.shape[0]
    acc = jnp.float64 if lhs.dtype == jnp.float64 else jnp.float32
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    starts = ends - group_sizes.astype(jnp.int32)
    rows = jnp.arange(m)[:, None]
    member = (rows >= starts[None, :]) & (rows < ends[None, :])  # [M, E]
    out = jnp.zeros((m, rhs.shape[2]), acc)
    for e in range(rhs.shape[0]):
        prod = jnp.dot(lhs, rhs[e], precision=jax.lax.Precision.HIGHEST, preferred_element_type=acc)
        out = out + jnp.where(member[:, e:e + 1], prod, 0)
    return out.astype(lhs.dtype)
