"""Block sweep for the large-vocabulary cross-entropy kernel at its production shape (N2048 x V131072 bf16).

For each of `SPEC.block_candidates` it AOT-compiles the forward kernel for the first target (v5e) on this
CPU machine with the TPU compiler's static cycle profile, then the plain-JAX version once, and prints per
compiled module the corrected cycles exactly as `tpudiag kernels bench` computes them
(tpudiag.analyze.kernel_bench.variant_figures: per op max(static estimated cycles, HBM floor), where a
Pallas call's bytes come from its pl.CostEstimate; an op with no static estimate counts at its roofline
floor). With --grad it also compiles the loss plus its gradient (forward + backward kernels against
jax.vjp of the plain version). The default blocks (or --blocks I: candidate I) are then compiled for the
other targets. JAX ships no Pallas cross-entropy, so there is no third column. Never asserts.

    python bench/sweep_cross_entropy.py [--targets v5e v6e] [--grad] [--only-default]
                                        [--static-timeout 240] [--out /tmp/sweep_cross_entropy]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def corrected(fn, args, target, out, static_timeout_s):
    """VariantFigures of fn compiled for target (the bench's own arithmetic)."""
    import tpudiag
    from tpudiag.analyze.kernel_bench import variant_figures
    from tpudiag.capture.tpu_compile import Limits

    # Longer than the CLI's 60 s static-profile limit: on a shared 2-core machine a kernel's profile
    # can take over a minute, and a dropped profile leaves only the HBM floor.
    r = tpudiag.compile(fn, *args, target=target, out=out, static_profile=True, jobs=1,
                        limits=Limits(static_timeout_s=static_timeout_s))
    doc = r.report.to_dict()
    return variant_figures("x", doc["modules"][0], doc["target"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["v5e", "v6e"])
    ap.add_argument("--grad", action="store_true", help="also sweep loss + gradient (forward + backward)")
    ap.add_argument("--only-default", action="store_true", help="skip the sweep: default blocks only")
    ap.add_argument("--static-timeout", type=float, default=240.0)
    ap.add_argument("--out", default="/tmp/sweep_cross_entropy")
    a = ap.parse_args(argv)

    from tpudiag.kernels import cross_entropy as ce

    rows = []

    def measure(target, label, fn, args):
        t0 = time.perf_counter()
        out = f"{a.out}/{target}-{len(rows)}"
        shutil.rmtree(out, ignore_errors=True)
        f = corrected(fn, args, target, out, a.static_timeout)
        note = "" if f.status == "ok" else f" FAILED: {f.error}"
        if f.ops_floor_only:
            note += f" ({f.ops_floor_only} ops at their roofline floor; static profile: {str(f.static_profile)[:60]})"
        rows.append((target, label, f.corrected_cycles, f.bytes_accessed, note))
        print(f"{target:4} {label:70} {f.corrected_cycles or 0:12,} cycles {f.bytes_accessed / 1e6:8.1f} MB "
              f"{time.perf_counter() - t0:5.0f} s{note}", flush=True)
        return f.corrected_cycles

    setups = [("fwd", ce.bench)] + ([("fwd+bwd", ce.grad_bench)] if a.grad else [])
    first, others = a.targets[0], a.targets[1:]
    for mode, make in setups:
        base = make()
        xla = measure(first, f"{mode} xla (plain JAX)", base.xla, base.args)
        candidates = () if a.only_default else ce.SPEC.block_candidates
        for bs in candidates:
            s = make(bs)
            k = measure(first, f"{mode} kernel {s.blocks}", s.kernel, s.args)
            if k and xla:
                print(f"     ratio kernel/xla = {k / xla:.3f}", flush=True)
        if a.only_default:
            k = measure(first, f"{mode} kernel {base.blocks} (default)", base.kernel, base.args)
            if k and xla:
                print(f"     ratio kernel/xla = {k / xla:.3f}", flush=True)
        for target in others:
            x2 = measure(target, f"{mode} xla (plain JAX)", base.xla, base.args)
            k2 = measure(target, f"{mode} kernel {base.blocks} (default)", base.kernel, base.args)
            if k2 and x2:
                print(f"     ratio kernel/xla = {k2 / x2:.3f}", flush=True)

    print(f"\n{'target':7} {'what':70} {'corrected cycles':>16} {'MB':>8}")
    for target, label, cyc, nbytes, note in rows:
        print(f"{target:7} {label:70} {cyc or 0:16,} {nbytes / 1e6:8.1f}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
