"""The sampling task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.sampling.sample), in
interpret mode off a TPU, at k = 50, p = 0.9, temperature = 0.8, with blocks of 8 rows and 8
candidates per lane (the verify cases' blocks): a batch of 13 float32 rows takes two grid steps.

At the graded shapes the blocks are small, so that the multi-block paths run; at production sizes
(the speed shapes) the kernel's tuned defaults."""

import jax
import jax.numpy as jnp

from tpudiag.kernels.sampling import BlockSizes
from tpudiag.kernels.sampling import sample as _kernel

_BLOCKS = BlockSizes(block_rows=8, lane_candidates=8)


def sampling(logits, u24, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    blocks = _BLOCKS if logits.shape[1] <= 4096 else None  # small shapes: several blocks; large: the tuned defaults
    u = u24.astype(jnp.float32) * (2.0 ** -24)  # exact: 24-bit integers
    return _kernel(logits, u, k=50, p=0.9, temperature=0.8, block_sizes=blocks,
                   interpret=interpret)
