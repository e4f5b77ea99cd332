"""Block sweep for the top-k / top-p sampling kernel at its production shape (B64 x V131072 f32,
k=64, p=0.9, temperature=0.8).

For each of `SPEC.block_candidates` it AOT-compiles the kernel for the first target (v5e) on this CPU
machine with the TPU compiler's static cycle profile, then the plain-JAX version (lax.top_k, softmax,
cumsum, pick) once, and prints per compiled module the corrected cycles exactly as `tpudiag kernels bench`
computes them (tpudiag.analyze.kernel_bench.variant_figures: per op max(static estimated cycles, HBM
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

    # Longer than the CLI's 60 s static-profile limit: on a shared 2-core machine a profile can take
    # over a minute, and a dropped profile leaves only the HBM floor.
    r = tpudiag.compile(fn, *args, target=target, out=out, static_profile=True, jobs=1,
                        limits=Limits(static_timeout_s=static_timeout_s))
    doc = r.report.to_dict()
    return variant_figures("x", doc["modules"][0], doc["target"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["v5e", "v6e"])
    ap.add_argument("--only-default", action="store_true", help="skip the sweep: default blocks only")
    ap.add_argument("--top-p-only", action="store_true", help="also the k=None variant at the default blocks")
    ap.add_argument("--static-timeout", type=float, default=240.0)
    ap.add_argument("--out", default="/tmp/sweep_sampling")
    a = ap.parse_args(argv)

    from tpudiag.kernels import sampling as sm

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
        print(f"{target:4} {label:52} {f.corrected_cycles or 0:12,} cycles {f.bytes_accessed / 1e6:8.1f} MB "
              f"{time.perf_counter() - t0:5.0f} s{note}", flush=True)
        return f.corrected_cycles

    def ratio(k, x):
        if k and x:
            print(f"     ratio kernel/xla = {k / x:.3f}", flush=True)

    base = sm.bench()
    first, others = a.targets[0], a.targets[1:]
    xla = measure(first, "xla (lax.top_k, softmax, cumsum)", base.xla, base.args)
    for bs in (() if a.only_default else sm.SPEC.block_candidates):
        s = sm.bench(bs)
        ratio(measure(first, f"kernel {s.blocks}", s.kernel, s.args), xla)
    if a.only_default:
        ratio(measure(first, f"kernel {base.blocks} (default)", base.kernel, base.args), xla)
    for target in others:
        x2 = measure(target, "xla (lax.top_k, softmax, cumsum)", base.xla, base.args)
        ratio(measure(target, f"kernel {base.blocks} (default)", base.kernel, base.args), x2)
    if a.top_p_only:
        p, t = sm.PROD["p"], sm.PROD["temperature"]
        for target in a.targets:
            x3 = measure(target, "top-p only: xla (full sort)", functools.partial(sm.xla_sample, p=p, temperature=t),
                         base.args)
            ratio(measure(target, f"top-p only: kernel {base.blocks}",
                          functools.partial(sm.sample, p=p, temperature=t), base.args), x3)

    print(f"\n{'target':7} {'what':52} {'corrected cycles':>16} {'MB':>8}")
    for target, label, cyc, nbytes, note in rows:
        print(f"{target:7} {label:52} {cyc or 0:16,} {nbytes / 1e6:8.1f}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
