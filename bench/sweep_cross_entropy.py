"""Block sweep for the large-vocabulary cross-entropy kernel at its production shape (N2048 x V131072 bf16).

Its `SPEC.block_candidates` go through `tpudiag kernels tune` (sweep_common.tune_blocks, the forward only). It AOT-compiles the forward kernel for the first target (v5e) on this
CPU machine with the TPU compiler's static cycle profile, then the plain-JAX version once, and prints per
compiled module the corrected cycles exactly as `tpudiag kernels bench` computes them
(sweep_common.measure: per op max(static estimated cycles, HBM floor, compute floor), where a
Pallas call's bytes come from its pl.CostEstimate; an op with no static estimate counts at its roofline
floor). With --grad it also compiles the loss plus its gradient (forward + backward kernels against
jax.vjp of the plain version). The default blocks (or --blocks I: candidate I) are then compiled for the
other targets. JAX ships no Pallas cross-entropy, so there is no third column. Never asserts.

    python bench/sweep_cross_entropy.py [--targets v5e v6e] [--grad] [--only-default]
                                        [--static-timeout 240] [--out /tmp/sweep_cross_entropy]
"""

from __future__ import annotations

import argparse
import sys

from sweep_common import LabelledSweep, add_sweep_args, print_ratio, tune_blocks

WIDTH = 70  # of the label column


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sweep_args(ap, out="/tmp/sweep_cross_entropy", out_help=None)
    ap.add_argument("--grad", action="store_true", help="also sweep loss + gradient (forward + backward)")
    ap.add_argument("--only-default", action="store_true", help="skip the sweep: default blocks only")
    a = ap.parse_args(argv)

    from tpudiag.kernels import cross_entropy as ce

    sw = LabelledSweep(a.out, WIDTH, a.static_timeout)
    measure = sw.measure

    setups = [("fwd", ce.bench)] + ([("fwd+bwd", ce.grad_bench)] if a.grad else [])
    first, others = a.targets[0], a.targets[1:]
    for mode, make in setups:
        base = make()
        xla = measure(first, f"{mode} xla (plain JAX)", base.xla, base.args)
        if mode == "fwd" and not a.only_default:  # the forward's candidates: `tpudiag kernels tune cross_entropy`
            for r in tune_blocks("cross_entropy", first, sw.out / f"{first}-tune", a.static_timeout):
                print(f"{mode} kernel {r['blocks']}{' (default)' if r['chosen'] else ''}", flush=True)
                print_ratio(r["corrected"], xla)
        for bs in () if a.only_default or mode == "fwd" else ce.SPEC.block_candidates:
            s = make(bs)
            print_ratio(measure(first, f"{mode} kernel {s.blocks}", s.kernel, s.args), xla)
        if a.only_default:
            print_ratio(measure(first, f"{mode} kernel {base.blocks} (default)", base.kernel, base.args), xla)
        for target in others:
            x2 = measure(target, f"{mode} xla (plain JAX)", base.xla, base.args)
            print_ratio(measure(target, f"{mode} kernel {base.blocks} (default)", base.kernel, base.args), x2)

    sw.print_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
