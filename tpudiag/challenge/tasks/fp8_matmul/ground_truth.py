"""The fp8_matmul task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.fp8_matmul, its
weight-only activations="bf16" mode), in interpret mode off a TPU, on the weights cast to
float8_e4m3fn (exact: integers in [-16, 16]), with 32 x 128 blocks so that the grid has several
steps in M and N at these small shapes.

Not the default activations="fp8" mode: there a row of x whose largest magnitude is near float32's
smallest normal (the `tiny` regime) gets a subnormal per-token scale, and the kernel, and the
module's reference run in float32 alike, return NaN for the row where the float64 run does not: the
fp8 mode's own definition fails there, so the grade could not hold a port to it.

At the graded shapes the blocks are small, so that the multi-block paths run; at production sizes
(the speed shapes) the kernel's tuned defaults."""

import jax
import jax.numpy as jnp

from tpudiag.kernels.fp8_matmul import BlockSizes
from tpudiag.kernels.fp8_matmul import fp8_matmul as _kernel

_BLOCKS = BlockSizes(block_m=32, block_n=128)


def fp8_matmul(x, w, w_scale, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    blocks = _BLOCKS if w.shape[0] <= 1024 else None  # small shapes: several blocks; large: the tuned defaults
    return _kernel(x, w.astype(jnp.float8_e4m3fn), w_scale, activations="bf16", block_sizes=blocks,
                   interpret=interpret)
