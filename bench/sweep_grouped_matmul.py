"""Block-size sweep for the grouped matmul kernel (tpudiag/kernels/grouped_matmul.py).

Its `SPEC.block_candidates` go through `tpudiag kernels tune` (sweep_common.tune_blocks) on the first target. It AOT-compiles the kernel at the production shape
(`SPEC.tuned_for`) for v5e with the static LLO profile, then, once each, the two plain-JAX versions
(`jax.lax.ragged_dot`, the spec's `xla`; and the dense "every expert on every row, masked" version)
and JAX's megablox `gmm` at a few tilings. One compile at a time (each in tpudiag's worker process).
Then the chosen blocks (the spec's default), ragged_dot and megablox at its best tiling on v6e.

Two figures per compiled module, summed over its ops:
- corrected cycles: `tpudiag kernels bench`'s metric (analyze/compile/kernel_bench.py): per op
  max(static estimated_cycles, HBM floor), or max(HBM floor, compute floor) for an op the static
  profile did not estimate (it aborts on ragged_dot on v5e; the dense version outlasts its limit).
- roofline cycles: per op max(static, HBM floor, compute floor), the compute floor being
  FLOPs / peak x clock, for every op (tpudiag's `estimated_s`). This matters for Pallas kernels:
  the static profile of a gridded Pallas kernel comes out near one grid step's cycles (measured
  here: 41k cycles for a kernel of ~1M cycles of MXU work), so the corrected figure of a kernel is
  in effect its HBM floor while XLA's ragged_dot, not estimated, gets its compute floor.
A Pallas custom call's bytes and FLOPs are its `pl.CostEstimate`. Prints one table; asserts nothing.

    python bench/sweep_grouped_matmul.py [--out DIR] [--targets v5e v6e] [--static-timeout 240]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sweep_common import add_sweep_args, measure, run_root, tune_blocks

import jax  # after sweep_common, which sets ALLOW_MULTIPLE_LIBTPU_LOAD
import jax.numpy as jnp

from tpudiag.kernels import grouped_matmul as G

# JAX's megablox gmm tilings (tm, tk, tn) to try. It keeps its f32 accumulator and output tile in
# VMEM under the default scoped limit (16 MiB on v5e) and sets no vmem_limit_bytes, so larger tiles
# fail to compile: (1024, 512, 1792), (1024, 256, 1792), (2048, 256, 1792) and (512, 1024, 1792)
# all end in CompileTimeScopedVmemOom on v5e (first run of this sweep).
MEGABLOX_TILINGS = ((512, 512, 1792), (1024, 512, 896), (1024, 1024, 896), (512, 1024, 896))


def megablox(tiling):
    def megablox_gmm(lhs, rhs, group_sizes):
        from jax.experimental.pallas.ops.tpu.megablox import gmm
        return gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, tiling=tiling)
    return megablox_gmm


def figures(fn, args, target: str, out: Path, static_timeout_s: float) -> dict:
    """sweep_common.measure's result with this sweep's own figures: roofline cycles (per op max(static,
    HBM floor, compute floor)), the largest custom call's (static, HBM floor, compute floor) and the
    modules' static-profile outcomes."""
    r = measure(fn, args, target, out, timeout_s=static_timeout_s)
    calls = [o for o in r["op_rows"] if o["opcode"] == "custom-call"]
    cc = max(calls, key=lambda o: o["compute"], default=None)
    ok = r["status"] == "ok"
    return dict(r, status=f"error: {r['error']}" if r["status"] == "error" else r["status"],
                profile=",".join(p.split(":")[0] for p in r["static_profiles"]),
                roofline=sum(max(o["static"] or 0, o["hbm"], o["compute"]) for o in r["op_rows"]) if ok else None,
                custom_call=(cc["static"], cc["hbm"], cc["compute"]) if cc else None)


def row(label: str, r: dict, ref: dict | None) -> str:
    def num(x):
        return f"{x:>12,.0f}" if x is not None else f"{'-':>12}"

    def ratio(key):
        if not ref or r.get(key) is None or not ref.get(key):
            return f"{'-':>6}"
        return f"{r[key] / ref[key]:>6.2f}"

    cc = r.get("custom_call")
    cc_text = (f"static {'-' if cc[0] is None else format(cc[0], ',.0f')} / hbm {cc[1]:,.0f} / "
               f"compute {cc[2]:,.0f}") if cc else ""
    return (f"{label:<58} {num(r.get('corrected'))} {ratio('corrected')} {num(r.get('roofline'))} "
            f"{ratio('roofline')}  {r['status']}/{r.get('profile', '')}  {cc_text}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sweep_args(ap, timeout_help="seconds for each static-profile attempt (the dense version needs > 60)",
                   out_help="keep the run directories here")
    ap.add_argument("--skip-dense", action="store_true", help="skip the dense masked version (slowest)")
    a = ap.parse_args()
    out = run_root(a.out, "sweep_grouped_matmul-")
    setup = G.bench()
    args = setup.args
    n = 0

    def go(fn, target):
        nonlocal n
        n += 1
        return figures(fn, args, target, out / f"{n:02d}-{target}", a.static_timeout)

    print(f"grouped_matmul sweep at {setup.shape}; jax {jax.__version__}; runs in {out}", flush=True)
    header = (f"{'':<58} {'corrected':>12} {'ratio':>6} {'roofline':>12} {'ratio':>6}  status/static profile"
              "  (largest custom call: static / HBM floor / compute floor)")
    for target in a.targets:
        first = target == a.targets[0]
        xla = go(G.ragged_dot_xla, target)
        lines = [row("xla: jax.lax.ragged_dot", xla, xla)]
        if first and not a.skip_dense:
            lines.append(row("dense masked (every expert on every row)", go(G.dense_masked_xla, target), xla))
        best_mb, best_mb_tiling = None, None
        for tiling in MEGABLOX_TILINGS if first else (G.MEGABLOX_TILING,):
            r = go(megablox(tiling), target)
            lines.append(row(f"jax megablox gmm tiling={tiling}", r, xla))
            if r["corrected"] is not None and (best_mb is None or r["corrected"] < best_mb["corrected"]):
                best_mb, best_mb_tiling = r, tiling
        if first:  # the kernel's candidates: `tpudiag kernels tune grouped_matmul`
            for t in tune_blocks("grouped_matmul", target, out / f"tune-{target}", a.static_timeout):
                r = {"corrected": t["corrected"], "roofline": None, "status": t["status"], "profile": "tune"}
                lines.append(row(f"kernel {t['blocks']}{' *' if t['chosen'] else ''}", r, xla))
                if best_mb:
                    lines.append(row(f"  vs megablox {best_mb_tiling}", r, best_mb))
        for blocks in () if first else (G.BlockSizes(),):
            r = go(G.bench(blocks).kernel, target)
            mark = " *" if blocks == G.BlockSizes() else ""
            lines.append(row(f"kernel {blocks.text()}{mark}", r, xla))
            if best_mb:
                lines.append(row(f"  vs megablox {best_mb_tiling}", r, best_mb))
        print(f"\n{target}  (ratios vs ragged_dot unless marked 'vs megablox'; * = default blocks)")
        print(header)
        print("\n".join(lines), flush=True)
    print(f"\nruns kept in {out}")


if __name__ == "__main__":
    sys.exit(main())
