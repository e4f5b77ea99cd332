"""Planted: raises on import."""
import a_module_that_does_not_exist  # noqa: F401


def rmsnorm_residual(x, residual, weight):
    return x
