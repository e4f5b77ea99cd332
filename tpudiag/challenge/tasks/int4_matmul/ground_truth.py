"""The int4_matmul task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.int4_matmul), in
interpret mode off a TPU, on the weights cast to jnp.int4 (exact: they lie in [-8, 7]), with
16 x 128 x 128 blocks so that the grid has several steps in M, N and K at these small shapes.

At the graded shapes the blocks are small, so that the multi-block paths run; at production sizes
(the speed shapes) the kernel's tuned defaults."""

import jax
import jax.numpy as jnp

from tpudiag.kernels.int4_matmul import BlockSizes
from tpudiag.kernels.int4_matmul import int4_matmul as _kernel

_BLOCKS = BlockSizes(block_m=16, block_n=128, block_k=128)


def int4_matmul(x, w, scales, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    blocks = _BLOCKS if w.shape[0] <= 1024 else None  # small shapes: several blocks; large: the tuned defaults
    return _kernel(x, w.astype(jnp.int4), scales, block_sizes=blocks, interpret=interpret)
