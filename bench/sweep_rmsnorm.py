"""Block sweep for the fused residual RMSNorm kernel at its production shape ([8192, 4096] bf16).

Its `SPEC.block_candidates` go through `tpudiag kernels tune` (sweep_common.tune_blocks, the forward only). It AOT-compiles the kernel for v5e on this CPU machine with the TPU compiler's
static cycle profile, then the plain-JAX version (`SPEC.bench().xla`) once, and prints per compiled module the
corrected cycles as `tpudiag kernels bench` computes them (sweep_common.measure: the sum over ops of max(static
estimated_cycles, HBM floor, compute floor)), where a Pallas call's bytes come from its pl.CostEstimate. It also
prints the Pallas calls' own static estimates, to show how far below the HBM floor they sit. The default blocks are
then compiled for the other targets (v6e). JAX ships no Pallas RMSNorm, so there is no third column. Never asserts.

--mode step also compiles a training step: the forward outputs (which feed the next layer) and the gradients for
random bf16 cotangents passed in as arguments, via jax.vjp.

    python bench/sweep_rmsnorm.py [--targets v5e v6e] [--mode fwd|step|both] [--static-timeout 240]
                                  [--default-only] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

from sweep_common import add_mode_args, run_modes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mode_args(ap)
    a = ap.parse_args(argv)

    import jax

    from tpudiag.kernels import rmsnorm

    def step(f):
        # The forward outputs are returned (the next layer reads them) along with d(x) and d(weight);
        # d(residual) equals d(x) (h = x + residual), and returning one buffer twice would make XLA copy it.
        def g(x, residual, weight, ct, ct2):
            (normed, h), vjp = jax.vjp(f, x, residual, weight)
            dx, _, dw = vjp((ct, ct2))
            return normed, h, dx, dw
        g.__name__ = f"step_{getattr(f, '__name__', 'fn')}"
        return g

    def step_args(args):
        return args + (jax.ShapeDtypeStruct(args[0].shape, args[0].dtype),) * 2  # bf16 cotangents

    return run_modes(a, "sweep_rmsnorm-", rmsnorm, step, step_args,
                     f"rmsnorm {rmsnorm.PRODUCTION} bf16; default {rmsnorm.DEFAULT_BLOCKS.describe()}")


if __name__ == "__main__":
    sys.exit(main())
