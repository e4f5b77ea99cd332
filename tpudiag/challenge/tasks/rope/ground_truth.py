"""The rope task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.rope), in interpret mode
off a TPU."""

import jax

from tpudiag.kernels.rope import rope as _kernel


def rope(q, k, positions, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    return _kernel(q, k, positions, theta=10000.0, interpret=interpret)
