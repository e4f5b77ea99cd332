"""Block sweep for the RoPE (Q and K in one pass) kernel at its production shape (B1 S8192 H32 KVH8 D128 bf16).

Its `SPEC.block_candidates` go through `tpudiag kernels tune` (sweep_common.tune_blocks, the forward only). It AOT-compiles the kernel for v5e on this CPU machine with the TPU compiler's
static cycle profile, then the plain-JAX version (`SPEC.bench().xla`) once, and prints per compiled module the
corrected cycles as `tpudiag kernels bench` computes them (sweep_common.measure: the sum over ops of max(static
estimated_cycles, HBM floor, compute floor)), where a Pallas call's bytes come from its pl.CostEstimate. It also
prints the Pallas calls' own static estimates, to show how far below the HBM floor they sit. The default blocks are
then compiled for the other targets (v6e). JAX ships no Pallas RoPE, so there is no third column. Never asserts. The
plain-JAX version's static profile can time out (its f32 copies and concatenates); it then counts HBM floors.

--mode step also compiles a training step: the rotated q and k (which feed attention) and the gradients for
random bf16 cotangents passed in as arguments, via jax.vjp (the backward is the same kernel with sin negated).

    python bench/sweep_rope.py [--targets v5e v6e] [--mode fwd|step|both] [--static-timeout 240]
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

    from tpudiag.kernels import rope

    def step(f):
        # The rotated q and k are returned (attention reads them) along with d(q) and d(k).
        def g(q, k, positions, ct, ct2):
            (qr, kr), vjp = jax.vjp(lambda q, k: f(q, k, positions), q, k)
            dq, dk = vjp((ct, ct2))
            return qr, kr, dq, dk
        g.__name__ = f"step_{getattr(f, '__name__', 'fn')}"
        return g

    def step_args(args):
        return args + tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args[:2])  # bf16 cotangents

    return run_modes(a, "sweep_rope-", rope, step, step_args,
                     f"rope (B, S, H, KVH, D) = {rope.PRODUCTION} bf16; default {rope.DEFAULT_BLOCKS.describe()}")


if __name__ == "__main__":
    sys.exit(main())
