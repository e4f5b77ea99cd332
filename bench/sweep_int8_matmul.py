"""Block sweep for tpudiag's int8 weight-only matmul against what XLA does with the same math.

For each M (decode 64 and prefill 2048 by default; K 4096, N 14336, x bf16, w int8, scales f32) and
each block size in SPEC.block_candidates (at M 64 through `tpudiag kernels tune`, sweep_common.tune_blocks; or --blocks), it AOT-compiles the kernel for the target on
this CPU machine, then the plain-JAX version `x @ (w.astype(bf16) * scales.astype(bf16))` once per M.
Per op, corrected cycles = max(static estimated_cycles, HBM floor), or for an op the static profile
did not estimate the larger of its HBM and compute floors (tpudiag.analyze.compile.kernel_bench.
op_corrected_cycles, the figure `tpudiag kernels bench` reports); the module's figure is their sum.
The kernel's bytes come from its pl.CostEstimate, which counts the re-reads its blocking causes.
There is no JAX int8 Pallas kernel to compare with. Prints a table; asserts nothing.

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 python bench/sweep_int8_matmul.py [--target v5e] [--m 64,2048]
        [--blocks 512x512x1024,512x1024x1024] [--out DIR] [--no-xla] [--timeout 60]
"""

from __future__ import annotations

import argparse

from sweep_common import Sweep, bound_note, print_table, rounded, run_root, tune_blocks


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
    out = run_root(a.out, "sweep-int8-")
    if a.blocks:
        blocks = [im.BlockSizes(*map(int, b.split("x"))) for b in a.blocks.split(",")]
    else:
        blocks = list(im.SPEC.block_candidates)
    print(f"int8_matmul sweep, target {a.target}, jax {jax.__version__}")
    sw = Sweep(out, line=lambda r: f"  {r['label']:<48} {rounded(r['corrected']):>10}  ({r['wall_s']:.1f}s) "
                                   f"{bound_note(r, min_share=0.05)}", timeout_s=a.timeout)
    for m in (int(v) for v in a.m.split(",")):
        setup = im.bench(m=m)
        print(f"shape {setup.shape}")
        tuned = m == im.PROD["m_decode"] and not a.blocks  # the production shape: `tpudiag kernels tune int8_matmul`
        for r in tune_blocks("int8_matmul", a.target, out / "tune", a.timeout) if tuned else ():
            sw.rows.append({"m": m, "label": f"tpudiag {r['blocks']}", "corrected": r["corrected"]})
        for bs in () if tuned else blocks:
            sw(im.bench(bs, m=m).kernel, setup.args, a.target, f"m{m}-kernel-{bs.block_m}x{bs.block_n}x{bs.block_k}",
               m=m, label=f"tpudiag {bs}")
        if not a.no_xla:
            sw(setup.xla, setup.args, a.target, f"m{m}-xla", m=m,
               label="xla x @ (w.astype(bf16) * scales.astype(bf16))")

    print()
    xla = {r["m"]: r["corrected"] for r in sw.rows if r["label"].startswith("xla")}
    print_table("{m:>5} {label:<48} {corrected:>10.0f} {ratio:>7}",
                [dict(r, ratio=f"{r['corrected'] / xla[r['m']]:.3f}" if r["corrected"] and xla.get(r["m"]) else "-")
                 for r in sw.rows], {"m": "M", "label": "variant", "corrected": "cycles", "ratio": "vs xla"})
    print(f"run directories under {out}")


if __name__ == "__main__":
    main()
