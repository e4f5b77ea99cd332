"""Block sweep for the top-k / top-p sampling kernel at its production shape (B64 x V131072 f32,
k=64, p=0.9, temperature=0.8).

Its `SPEC.block_candidates` go through `tpudiag kernels tune` (sweep_common.tune_blocks, the forward only). It AOT-compiles the kernel for the first target (v5e) on this CPU
machine with the TPU compiler's static cycle profile, then the plain-JAX version (lax.top_k, softmax,
cumsum, pick) once, and prints per compiled module the corrected cycles exactly as `tpudiag kernels bench`
computes them (sweep_common.measure: per op max(static estimated cycles, HBM floor, compute
floor), where a Pallas call's bytes come from its pl.CostEstimate; an op with no static estimate counts
at its roofline floor, and the line says so). TPU-NOTES: the static profile of lax.top_k / sort may
balloon past the worker's memory limit or time out; then the plain version is only its HBM floor, which
flatters it (the sort's compute is not counted). With --top-p-only it also compiles the top-p-alone
variant (k=None), whose plain version sorts the whole row. The default blocks are then compiled for the
other targets. JAX ships no Pallas sampling kernel, so there is no third column. Never asserts.

    python bench/sweep_sampling.py [--targets v5e v6e] [--only-default] [--top-p-only]
                                   [--static-timeout 240] [--out /tmp/sweep_sampling]
"""

from __future__ import annotations

import argparse
import functools
import sys

from sweep_common import LabelledSweep, add_sweep_args, print_ratio, tune_blocks

WIDTH = 52  # of the label column


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sweep_args(ap, out="/tmp/sweep_sampling", out_help=None)
    ap.add_argument("--only-default", action="store_true", help="skip the sweep: default blocks only")
    ap.add_argument("--top-p-only", action="store_true", help="also the k=None variant at the default blocks")
    a = ap.parse_args(argv)

    from tpudiag.kernels import sampling as sm

    sw = LabelledSweep(a.out, WIDTH, a.static_timeout)
    measure = sw.measure


    base = sm.bench()
    first, others = a.targets[0], a.targets[1:]
    xla = measure(first, "xla (lax.top_k, softmax, cumsum)", base.xla, base.args)
    for r in () if a.only_default else tune_blocks("sampling", first, sw.out / f"{first}-tune", a.static_timeout):
        print(f"kernel {r['blocks']}{' (default)' if r['chosen'] else ''}", flush=True)  # `kernels tune sampling`
        print_ratio(r["corrected"], xla)
    if a.only_default:
        print_ratio(measure(first, f"kernel {base.blocks} (default)", base.kernel, base.args), xla)
    for target in others:
        x2 = measure(target, "xla (lax.top_k, softmax, cumsum)", base.xla, base.args)
        print_ratio(measure(target, f"kernel {base.blocks} (default)", base.kernel, base.args), x2)
    if a.top_p_only:
        p, t = sm.PROD["p"], sm.PROD["temperature"]
        for target in a.targets:
            x3 = measure(target, "top-p only: xla (full sort)", functools.partial(sm.xla_sample, p=p, temperature=t),
                         base.args)
            print_ratio(measure(target, f"top-p only: kernel {base.blocks}",
                                functools.partial(sm.sample, p=p, temperature=t), base.args), x3)

    sw.print_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
