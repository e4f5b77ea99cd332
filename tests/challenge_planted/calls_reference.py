"""Planted: calls tpudiag's own reference (breaks integrity; every number is right)."""
from tpudiag.kernels import rmsnorm


def rmsnorm_residual(x, residual, weight):
    return rmsnorm.reference(x, residual, weight, eps=1e-6)
