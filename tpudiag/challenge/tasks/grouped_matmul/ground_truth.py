"""The grouped_matmul task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.grouped_matmul),
in interpret mode off a TPU, with 64-row tiles, 32-row compute slices and 128 x 128 K/N blocks so
that a few hundred rows make several tiles and tiles span group boundaries.

At the graded shapes the blocks are small, so that the multi-block paths run; at production sizes
(the speed shapes) the kernel's tuned defaults."""

import jax

from tpudiag.kernels.grouped_matmul import BlockSizes
from tpudiag.kernels.grouped_matmul import grouped_matmul as _kernel

_BLOCKS = BlockSizes(block_m=64, block_k=128, block_n=128, compute_m=32)


def grouped_matmul(lhs, rhs, group_sizes, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    blocks = _BLOCKS if lhs.shape[0] <= 512 else None  # small shapes: several blocks; large: the tuned defaults
    return _kernel(lhs, rhs, group_sizes, block_sizes=blocks, interpret=interpret)
