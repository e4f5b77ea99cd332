"""Block sweep for tpudiag's paged attention kernel against XLA and JAX's own paged attention kernel.

For each `pages_per_block` in SPEC.block_candidates it AOT-compiles the kernel at the production
shape (B32 H32 KVH8 D128, page 16, context 2048, bf16, full lengths) for the target on this CPU
machine, then the plain-JAX version once and JAX's kernel at each `pages_per_compute_block` in
JAX_PPCB. Per op of the compiled module, corrected cycles = max(static estimated_cycles,
bytes_accessed / HBM bytes/s * clock), or for an op the static profile did not estimate the
larger of its HBM and compute floors (tpudiag.analyze.kernel_bench.op_corrected_cycles, the same
figure `tpudiag kernels bench` reports); the module's figure is their sum. A Pallas custom call's
bytes come from its pl.CostEstimate (JAX's kernel declares none: XLA then counts its operands).
Prints a table; asserts nothing. One compile at a time (shared 2-core machine).

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 python bench/sweep_paged_attention.py [--target v5e] [--out DIR]
        [--blocks 4,8] [--jax-ppcb 8,16] [--no-xla]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

JAX_PPCB = (4, 8, 16, 32)


def corrected_cycles(fn, args, target: str, out: str) -> tuple[float | None, str]:
    """(sum over ops of max(static cycles, HBM floor), a note on where the numbers came from)."""
    import tpudiag
    from tpudiag.analyze.kernel_bench import op_corrected_cycles

    r = tpudiag.compile(fn, *args, target=target, out=out, static_profile=True, jobs=1)
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
            if o["opcode"] == "custom-call":
                notes.append(f"{o['name']}: static {o['estimated_cycles']} -> {cyc:.0f} ({how})")
    notes.append("ops by bound: " + ", ".join(f"{k} {v}" for k, v in sorted(hows.items())))
    return total, "; ".join(notes)


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
    out = a.out or tempfile.mkdtemp(prefix="sweep-paged-")
    blocks = ([pa.BlockSizes(int(n)) for n in a.blocks.split(",")] if a.blocks
              else list(pa.SPEC.block_candidates))
    setup = pa.bench()
    print(f"paged_attention sweep, target {a.target}, shape {setup.shape}, jax {jax.__version__}")
    rows = []

    def measure(label, fn, tag):
        t0 = time.perf_counter()
        cyc, note = corrected_cycles(fn, setup.args, a.target, f"{out}/{tag}")
        rows.append((label, cyc, note))
        print(f"  {label:<44} {cyc if cyc is None else round(cyc):>10}  ({time.perf_counter() - t0:.1f}s) {note}",
              flush=True)

    for bs in blocks:
        measure(f"tpudiag {bs}", pa.bench(bs).kernel, f"kernel-{bs.pages_per_block}")
    if not a.no_xla:
        measure("xla (gather + masked softmax)", setup.xla, "xla")
    if a.jax_ppcb:
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as jpa

        for n in (int(x) for x in a.jax_ppcb.split(",")):
            def jk(q, k, v, lengths, table, n=n):
                return jpa(q, k, v, lengths, table, pages_per_compute_block=n)

            measure(f"jax paged_attention ppcb={n}", jk, f"jax-{n}")

    xla = next((c for lbl, c, _ in rows if lbl.startswith("xla")), None)
    jax_best = min((c for lbl, c, _ in rows if lbl.startswith("jax") and c is not None), default=None)
    print(f"\n{'variant':<44} {'cycles':>10} {'vs xla':>7} {'vs jax best':>11}")
    for lbl, c, _ in rows:
        rx = f"{c / xla:.3f}" if c and xla else "-"
        rj = f"{c / jax_best:.3f}" if c and jax_best else "-"
        print(f"{lbl:<44} {c if c is None else round(c):>10} {rx:>7} {rj:>11}")
    print(f"run directories under {out}")


if __name__ == "__main__":
    main()
