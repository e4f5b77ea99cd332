"""`fused_moe` against tokamax's routed MoE path at the same shape and target, in one run.

tokamax (DeepMind's kernel library, `pip install tokamax`, jax >= 0.11) ships no fused MoE, but its
grouped matmul `tokamax.ragged_dot` has a TPU kernel ("mosaic_tpu_v2", GMM v2) that fuses the
gate/up SwiGLU (`fuse_gateup_activation="silu"`, over [E, D, 2F] weights: gate | up). The peer is
the MoE a tokamax user writes: fused_moe's own routing and sort, then tokamax's gate/up with the
SwiGLU fused, its down, and the same combine. The bench reuses `tpudiag kernels bench`: the rows are
ours, XLA's dense dispatch and the tokamax route (in the "JAX kernel" column).

    python bench/moe_vs_tokamax.py --target v6e [--out DIR]

Runs where tokamax is installed (the MaxText venv here: jax 0.12.0.1, libtpu 0.0.50.1); prints
the bench table and writes the run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


def spec():
    import jax
    import jax.numpy as jnp
    import tokamax

    from tpudiag.kernels import fused_moe as fm
    from tpudiag.kernels.spec import BenchSetup

    k = fm.PROD["top_k"]

    def tokamax_moe(x, router_w, w_gate_up, w_down):
        t, d = x.shape
        weights, experts = fm.route(x, router_w, top_k=k)
        order, group_sizes, _ = fm.sort_pairs(experts, router_w.shape[1])
        h = tokamax.ragged_dot(x[order // k], w_gate_up, group_sizes, preferred_element_type=x.dtype,
                               implementation="mosaic_tpu_v2", fuse_gateup_activation="silu")
        y = tokamax.ragged_dot(h, w_down, group_sizes, preferred_element_type=x.dtype, implementation="mosaic_tpu_v2")
        per_pair = y[fm.inverse_permutation(order)].reshape(t, k, d).astype(jnp.float32)
        return jnp.einsum("tk,tkd->td", weights, per_pair).astype(x.dtype)

    def bench(blocks=None):
        own = fm.bench(blocks)
        x, r, wg, _, wd = own.args
        gate_up = jax.ShapeDtypeStruct((wg.shape[0], wg.shape[1], 2 * wg.shape[2]), wg.dtype)
        return dataclasses.replace(own, jax_kernel=tokamax_moe, variant_args={"jax": (x, r, gate_up, wd)},
                                   jax_name=f"tokamax {tokamax.__version__} ragged_dot mosaic_tpu_v2, "
                                   "gate/up SwiGLU fused")

    return dataclasses.replace(fm.SPEC, name="fused_moe_vs_tokamax", bench=bench)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="v6e")
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout", type=float, default=400.0)
    args = parser.parse_args()
    try:
        import tokamax  # noqa: F401
    except ImportError:
        print("moe_vs_tokamax: tokamax is not installed in this environment (pip install tokamax; jax >= 0.11)",
              file=sys.stderr)
        return 2
    from sweep_common import bench_specs

    return bench_specs("moe_vs_tokamax", [spec()], args.target, args.out, args.timeout)

if __name__ == "__main__":
    sys.exit(main())
