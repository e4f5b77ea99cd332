"""Block sweep for tpudiag's int8 weight-only matmul against what XLA does with the same math.

For each M (decode 64 and prefill 2048 by default; K 4096, N 14336, x bf16, w int8, scales f32) and
each block size in SPEC.block_candidates (or --blocks), it AOT-compiles the kernel for the target on
this CPU machine, then the plain-JAX version `x @ (w.astype(bf16) * scales.astype(bf16))` once per M.
Per op, corrected cycles = max(static estimated_cycles, HBM floor), or for an op the static profile
did not estimate the larger of its HBM and compute floors (tpudiag.analyze.kernel_bench.
op_corrected_cycles, the figure `tpudiag kernels bench` reports); the module's figure is their sum.
The kernel's bytes come from its pl.CostEstimate, which counts the re-reads its blocking causes.
There is no JAX int8 Pallas kernel to compare with. Prints a table; asserts nothing.

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 python bench/sweep_int8_matmul.py [--target v5e] [--m 64,2048]
        [--blocks 512x512x1024,512x1024x1024] [--out DIR] [--no-xla] [--timeout 60]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def corrected_cycles(fn, args, target: str, out: str, timeout_s: float) -> tuple[float | None, str]:
    """(sum over ops of the corrected cycles, a note on what bound them)."""
    import tpudiag
    from tpudiag.analyze.kernel_bench import op_corrected_cycles
    from tpudiag.capture.tpu_compile import Limits

    r = tpudiag.compile(fn, *args, target=target, out=out, static_profile=True, jobs=1,
                        limits=Limits(static_timeout_s=timeout_s))
    doc = r.report.to_dict()
    t = doc["target"]
    total, hows, notes = 0.0, {}, []
    for m in doc["modules"]:
        if m["status"] != "ok":
            return None, f"module {m['status']}"
        if m["static_profile"] != "ok":
            notes.append(f"static profile: {str(m['static_profile'])[:50]}")
        for o in m["ops"]:
            cyc, how = op_corrected_cycles(o, t["clock_hz"], t["hbm_bytes_per_s"], t["peak_bf16_flops_per_s"])
            total += cyc
            hows[how] = hows.get(how, 0) + 1
            if o["opcode"] == "custom-call" or cyc > 0.05 * total:
                notes.append(f"{o['name']}: static {o['estimated_cycles']} -> {cyc:.0f} ({how})")
    notes.append("ops by bound: " + ", ".join(f"{k} {v}" for k, v in sorted(hows.items())))
    return total, "; ".join(notes)


def main():
    import jax

    from tpudiag.kernels import int8_matmul as im

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--m", default="64,2048")
    ap.add_argument("--blocks", default=None, help="MxNxK block sizes, comma-separated")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-xla", action="store_true")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="static-profile time limit per compile; big prefill tiles need ~100-200 s here")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="sweep-int8-")
    if a.blocks:
        blocks = [im.BlockSizes(*map(int, b.split("x"))) for b in a.blocks.split(",")]
    else:
        blocks = list(im.SPEC.block_candidates)
    print(f"int8_matmul sweep, target {a.target}, jax {jax.__version__}")
    rows = []
    for m in (int(v) for v in a.m.split(",")):
        setup = im.bench(m=m)
        print(f"shape {setup.shape}")

        def measure(label, fn, tag):
            t0 = time.perf_counter()
            cyc, note = corrected_cycles(fn, setup.args, a.target, f"{out}/{tag}", a.timeout)
            rows.append((m, label, cyc))
            print(f"  {label:<48} {cyc if cyc is None else round(cyc):>10}  ({time.perf_counter() - t0:.1f}s) "
                  f"{note}", flush=True)

        for bs in blocks:
            measure(f"tpudiag {bs}", im.bench(bs, m=m).kernel,
                    f"m{m}-kernel-{bs.block_m}x{bs.block_n}x{bs.block_k}")
        if not a.no_xla:
            measure("xla x @ (w.astype(bf16) * scales.astype(bf16))", setup.xla, f"m{m}-xla")

    print(f"\n{'M':>5} {'variant':<48} {'cycles':>10} {'vs xla':>7}")
    for m, lbl, c in rows:
        xla = next((cc for mm, ll, cc in rows if mm == m and ll.startswith("xla")), None)
        r = f"{c / xla:.3f}" if c and xla else "-"
        print(f"{m:>5} {lbl:<48} {c if c is None else round(c):>10} {r:>7}")
    print(f"run directories under {out}")


if __name__ == "__main__":
    main()
