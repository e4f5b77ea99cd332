"""Block sweep for tpudiag's paged attention kernel against XLA and JAX's own paged attention kernel.

Its `pages_per_block` candidates (SPEC.block_candidates) go through `tpudiag kernels tune` (sweep_common.tune_blocks). It AOT-compiles the kernel at the production
shape (B32 H32 KVH8 D128, page 16, context 2048, bf16, full lengths) for the target on this CPU
machine, then the plain-JAX version once and JAX's kernel at each `pages_per_compute_block` in
JAX_PPCB. Per op of the compiled module, corrected cycles = max(static estimated_cycles,
bytes_accessed / HBM bytes/s * clock), or for an op the static profile did not estimate the
larger of its HBM and compute floors (tpudiag.analyze.compile.kernel_bench.op_corrected_cycles, the same
figure `tpudiag kernels bench` reports); the module's figure is their sum. A Pallas custom call's
bytes come from its pl.CostEstimate (JAX's kernel declares none: XLA then counts its operands).
Prints a table; asserts nothing. One compile at a time (shared 2-core machine).

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 python bench/sweep_paged_attention.py [--target v5e] [--out DIR]
        [--blocks 4,8] [--jax-ppcb 8,16] [--no-xla]
"""

from __future__ import annotations

import argparse

from sweep_common import Sweep, bound_note, print_table, rounded, run_root, tune_blocks

JAX_PPCB = (4, 8, 16, 32)


def main():
    import jax

    from tpudiag.kernels import paged_attention as pa

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--out", default=None)
    ap.add_argument("--blocks", default=None, help="pages_per_block values (default: SPEC.block_candidates)")
    ap.add_argument("--jax-ppcb", default=",".join(map(str, JAX_PPCB)))
    ap.add_argument("--no-xla", action="store_true")
    a = ap.parse_args()
    out = run_root(a.out, "sweep-paged-")
    blocks = ([pa.BlockSizes(int(n)) for n in a.blocks.split(",")] if a.blocks
              else list(pa.SPEC.block_candidates))
    setup = pa.bench()
    print(f"paged_attention sweep, target {a.target}, shape {setup.shape}, jax {jax.__version__}")
    # tpudiag's default static-profile limit (60 s).
    sw = Sweep(out, line=lambda r: f"  {r['label']:<44} {rounded(r['corrected']):>10}  ({r['wall_s']:.1f}s) "
                                   f"{bound_note(r)}")

    def measure(label, fn, tag):
        sw(fn, setup.args, a.target, tag, label=label)

    if a.blocks:
        for bs in blocks:
            measure(f"tpudiag {bs}", pa.bench(bs).kernel, f"kernel-{bs.pages_per_block}")
    else:  # the kernel's candidates: `tpudiag kernels tune paged_attention`
        for r in tune_blocks("paged_attention", a.target, out / "tune"):
            sw.rows.append({"label": f"tpudiag {r['blocks']}", "corrected": r["corrected"]})
    if not a.no_xla:
        measure("xla (gather + masked softmax)", setup.xla, "xla")
    if a.jax_ppcb:
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as jpa

        for n in (int(x) for x in a.jax_ppcb.split(",")):
            def jk(q, k, v, lengths, table, n=n):
                return jpa(q, k, v, lengths, table, pages_per_compute_block=n)

            measure(f"jax paged_attention ppcb={n}", jk, f"jax-{n}")

    xla = next((r["corrected"] for r in sw.rows if r["label"].startswith("xla")), None)
    jax_best = min((r["corrected"] for r in sw.rows if r["label"].startswith("jax") and r["corrected"] is not None),
                   default=None)

    def vs(c, ref):
        return f"{c / ref:.3f}" if c and ref else "-"

    print()
    print_table("{label:<44} {corrected:>10.0f} {vs_xla:>7} {vs_jax:>11}",
                [dict(r, vs_xla=vs(r["corrected"], xla), vs_jax=vs(r["corrected"], jax_best)) for r in sw.rows],
                {"label": "variant", "corrected": "cycles", "vs_xla": "vs xla", "vs_jax": "vs jax best"})
    print(f"run directories under {out}")


if __name__ == "__main__":
    main()
