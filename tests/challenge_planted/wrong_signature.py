"""Planted: takes (x, weight) where the task passes (x, residual, weight)."""


def rmsnorm_residual(x, weight):
    return x * weight
