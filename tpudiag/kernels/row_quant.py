"""What the 8-bit matmuls' kernels share about per-token (per-row) quantization: each row's scale, and
the scaled output a block writes. Used by `w8a8_matmul.quantizing_kernel` (and through it fp8_matmul's
fp8 mode) and by `quant_streamed`, the same kernel with x and the weight tiles copied by hand."""

from __future__ import annotations

import jax.numpy as jnp


def row_max(x):
    """Each row's largest magnitude in f32 [rows, 1]."""
    return jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1, keepdims=True)


# float32's smallest normal number: the least scale. amax / qmax below it is subnormal, which the
# TPU (and XLA:CPU) flush to 0, and x / 0 quantized a row near float32's smallest normals to inf.
_SCALE_FLOOR = float(jnp.finfo(jnp.float32).tiny)


def scales_of(amax, qmax: float):
    """The symmetric scales of rows whose largest magnitudes are `amax` [rows, 1]: amax / qmax, at
    least float32's smallest normal (such a row's quantized values then span less than the full
    range, and stay finite), and 1 for a row of zeros (its quantized values are 0 either way, so
    nothing divides by zero)."""
    return jnp.where(amax > 0, jnp.maximum(amax / qmax, _SCALE_FLOOR), 1.0)


def row_scales(x, qmax: float):
    """Each row's symmetric scale in f32 [rows, 1] (`scales_of` its `row_max`)."""
    return scales_of(row_max(x), qmax)


def scale_out(acc, sx, s_ref, o_ref):
    """Write an output block: the integer or f32 sums `acc` [bm, bn] times the rows' scales `sx` [bm, 1]
    and the weights' channel scales `s_ref` [1, bn], in the output's dtype."""
    o_ref[...] = (acc.astype(jnp.float32) * sx * s_ref[...]).astype(o_ref.dtype)
