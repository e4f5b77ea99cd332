"""Block sweep for the fused residual RMSNorm kernel at its production shape ([8192, 4096] bf16).

For each of `SPEC.block_candidates` it AOT-compiles the kernel for v5e on this CPU machine with the TPU
compiler's static cycle profile, then the plain-JAX version (`SPEC.bench().xla`) once, and prints per compiled
module the corrected cycles: the sum over ops of max(static estimated_cycles, bytes_accessed / HBM bytes per
second * clock), where a Pallas call's bytes come from its pl.CostEstimate. It also prints the Pallas calls' own
static estimates, to show how far below the HBM floor they sit. The default blocks are then compiled for the other
targets (v6e). JAX ships no Pallas RMSNorm, so there is no third column. Never asserts.

--mode step also compiles a training step: the forward outputs (which feed the next layer) and the gradients for
random bf16 cotangents passed in as arguments, via jax.vjp.

    python bench/sweep_rmsnorm.py [--targets v5e v6e] [--mode fwd|step|both] [--static-timeout 240]
                                  [--default-only] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def corrected_cycles(fn, args, target, out, static_timeout_s):
    """{cycles, bytes, static_kernel, source} of fn compiled for target; cycles is nan if it did not compile."""
    import tpudiag
    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.targets import resolve_target

    # A longer static-profile limit than the CLI's 60 s: on a shared 2-core machine a module's profile can
    # take over a minute, and a dropped profile leaves only the HBM floor.
    r = tpudiag.compile(fn, *args, target=target, out=out, static_profile=True, jobs=1,
                        limits=Limits(static_timeout_s=static_timeout_s))
    chip = resolve_target(target).chip
    res = {"cycles": 0.0, "bytes": 0, "static_kernel": 0, "source": set()}
    for m in r.report.to_dict()["modules"]:
        if m["status"] != "ok":
            return {"cycles": float("nan"), "bytes": 0, "static_kernel": 0,
                    "source": f"module {m['status']}: {(m.get('error') or '')[:120]}"}
        for o in m["ops"]:
            floor = o["bytes_accessed"] / chip.hbm_bytes_per_s * chip.clock_hz
            res["cycles"] += max(o["estimated_cycles"] or 0, floor)
            res["bytes"] += o["bytes_accessed"]
            res["source"].add(o["cycles_source"] or "?")
            if o["opcode"] == "custom-call":
                res["static_kernel"] += o["estimated_cycles"] or 0
    res["source"] = "+".join(sorted(res["source"]))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["v5e", "v6e"])
    ap.add_argument("--mode", choices=("fwd", "step", "both"), default="fwd")
    ap.add_argument("--static-timeout", type=float, default=240.0)
    ap.add_argument("--default-only", action="store_true", help="compile only the default blocks (and XLA)")
    ap.add_argument("--out", default=None, help="run directories go here (default: a fresh temporary folder)")
    a = ap.parse_args(argv)
    out = a.out or tempfile.mkdtemp(prefix="sweep_rmsnorm-")

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

    rows = []

    def measure(target, mode, what, blocks, fn, args, tag):
        t0 = time.perf_counter()
        r = corrected_cycles(fn, args, target, f"{out}/{target}-{tag}", a.static_timeout)
        rows.append((target, mode, what, blocks, r))
        print(f"{target:4} {mode:4} {what:6} {blocks or '':38} {r['cycles']:12,.0f} cycles {r['bytes'] / 1e6:7.1f} MB"
              f"  kernel static {r['static_kernel']:10,}  [{r['source']}]  {time.perf_counter() - t0:.0f}s",
              flush=True)
        return r["cycles"]

    modes = []
    if a.mode in ("fwd", "both"):
        modes.append(("fwd", lambda f: f, lambda args: args))
    if a.mode in ("step", "both"):
        modes.append(("step", step, step_args))
    for mode, wrap, wargs in modes:
        for ti, target in enumerate(a.targets):
            base = rmsnorm.bench()
            measure(target, mode, "xla", "", wrap(base.xla), wargs(base.args), f"{mode}-xla")
            sweep = ti == 0 and not a.default_only
            candidates = rmsnorm.SPEC.block_candidates if sweep else (rmsnorm.DEFAULT_BLOCKS,)
            for i, bs in enumerate(candidates):
                setup = rmsnorm.bench(bs)
                measure(target, mode, "kernel", setup.blocks, wrap(setup.kernel), wargs(setup.args), f"{mode}-k{i}")

    print(f"\nrmsnorm {rmsnorm.PRODUCTION} bf16; default {rmsnorm.DEFAULT_BLOCKS.describe()}; runs in {out}")
    print("target mode   what    blocks                                 corrected cycles  kernel/xla     MB  "
          "kernel static  source")
    xla = {(t, m): r["cycles"] for t, m, w, _, r in rows if w == "xla"}
    for t, m, w, blocks, r in rows:
        ratio = r["cycles"] / xla[(t, m)] if xla.get((t, m)) else float("nan")
        print(f"{t:6} {m:6} {w:7} {blocks:38} {r['cycles']:16,.0f} {ratio:11.3f} {r['bytes'] / 1e6:7.1f} "
              f"{r['static_kernel']:14,}  {r['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
