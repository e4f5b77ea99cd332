"""The int8_matmul task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.int8_matmul), in
interpret mode off a TPU."""

import jax

from tpudiag.kernels.int8_matmul import int8_matmul as _kernel


def int8_matmul(x, w, scales, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    return _kernel(x, w, scales, interpret=interpret)
