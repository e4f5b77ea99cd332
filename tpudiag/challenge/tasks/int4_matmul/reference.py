"""The int4_matmul task's reference: tpudiag.kernels.int4_matmul.reference (and its `dequantize`), as
written there (dequantize per group in f32, a HIGHEST-precision matmul, cast back), with the int4
weights given as int8 values in [-8, 7] (input specs have no int4 dtype). A solution may not import
or call it."""

import jax
import jax.numpy as jnp


def _dequantize(w, scales, dtype):
    k, n = w.shape
    groups = scales.shape[0]
    wd = w.astype(dtype).reshape(groups, k // groups, n) * scales.astype(dtype)[:, None, :]
    return wd.reshape(k, n)


def int4_matmul(x, w, scales):
    ct = jnp.promote_types(x.dtype, jnp.float32)
    return jnp.dot(x.astype(ct), _dequantize(w, scales, ct), precision=jax.lax.Precision.HIGHEST).astype(x.dtype)
