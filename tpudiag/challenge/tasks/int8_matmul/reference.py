"""The int8_matmul task's reference: tpudiag.kernels.int8_matmul.reference, as written there
(dequantize in f32, a HIGHEST-precision matmul, cast back). A solution may not import or call it."""

import jax
import jax.numpy as jnp


def int8_matmul(x, w, scales):
    ct = jnp.promote_types(x.dtype, jnp.float32)
    wd = w.astype(ct) * scales.astype(ct)[None, :]
    return jnp.dot(x.astype(ct), wd, precision=jax.lax.Precision.HIGHEST).astype(x.dtype)
