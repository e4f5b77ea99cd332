"""The rmsnorm_residual task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.rmsnorm),
in interpret mode off a TPU."""

import jax

from tpudiag.kernels.rmsnorm import rmsnorm_residual as _kernel


def rmsnorm_residual(x, residual, weight, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    return _kernel(x, residual, weight, eps=1e-6, interpret=interpret)
