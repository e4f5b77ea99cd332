"""Planted: never returns."""
import time


def rmsnorm_residual(x, residual, weight):
    while True:
        time.sleep(1)
