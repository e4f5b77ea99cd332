"""Block-size sweep for the grouped matmul kernel (tpudiag/kernels/grouped_matmul.py).

For each candidate in `SPEC.block_candidates` it AOT-compiles the kernel at the production shape
(`SPEC.tuned_for`) for v5e with the static LLO profile, then, once each, the two plain-JAX versions
(`jax.lax.ragged_dot`, the spec's `xla`; and the dense "every expert on every row, masked" version)
and JAX's megablox `gmm` at a few tilings. One compile at a time (each in tpudiag's worker process).
Then the chosen blocks (the spec's default), ragged_dot and megablox at its best tiling on v6e.

Two figures per compiled module, summed over its ops:
- corrected cycles: `tpudiag kernels bench`'s metric (analyze/kernel_bench.py): per op
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
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold libtpu's lock

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tpudiag  # noqa: E402
from tpudiag.analyze.kernel_bench import op_corrected_cycles  # noqa: E402
from tpudiag.capture.tpu_compile import Limits  # noqa: E402
from tpudiag.kernels import grouped_matmul as G  # noqa: E402

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


def measure(fn, args, target: str, out: Path, limits: Limits) -> dict:
    t0 = time.perf_counter()
    try:
        res = tpudiag.compile(fn, *args, target=target, out=out, static_profile=True, jobs=1, limits=limits)
    except Exception as e:  # a lowering error (e.g. block sizes the kernel refuses): report, go on
        text = (str(e).splitlines() or [""])[0]
        why = f"{type(e).__name__}: {text if len(text) <= 110 else '...' + text[-110:]}"
        return {"status": f"error: {why}", "corrected": None, "roofline": None}
    doc = res.report.to_dict()
    t = doc["target"]
    clock, bw, peak = t["clock_hz"], t["hbm_bytes_per_s"], t["peak_bf16_flops_per_s"]
    corrected = roofline = 0.0
    status, profile, kernel_cycles = [], [], None
    for m in doc["modules"]:
        status.append(m["status"])
        profile.append(m["static_profile"].split(":")[0])
        for o in m["ops"]:
            hbm, compute = o["bytes_accessed"] / bw * clock, o["flops"] / peak * clock
            static = o["estimated_cycles"]
            corrected += op_corrected_cycles(o, clock, bw, peak)[0]
            roofline += max(static or 0, hbm, compute)
            if o["opcode"] == "custom-call" and (kernel_cycles is None or compute > kernel_cycles[2]):
                kernel_cycles = (static, hbm, compute)
    ok = all(s == "ok" for s in status) and bool(status)
    return {"status": "ok" if ok else ",".join(status) or "no module", "profile": ",".join(profile),
            "corrected": corrected if ok else None, "roofline": roofline if ok else None,
            "custom_call": kernel_cycles, "wall_s": time.perf_counter() - t0}


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
    ap.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    ap.add_argument("--targets", nargs="+", default=["v5e", "v6e"])
    ap.add_argument("--static-timeout", type=float, default=240.0,
                    help="seconds for each static-profile attempt (the dense version needs > 60)")
    ap.add_argument("--skip-dense", action="store_true", help="skip the dense masked version (slowest)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="sweep_grouped_matmul-"))
    out.mkdir(parents=True, exist_ok=True)
    limits = Limits(static_timeout_s=a.static_timeout)
    setup = G.bench()
    args = setup.args
    n = 0

    def go(fn, target):
        nonlocal n
        n += 1
        return measure(fn, args, target, out / f"{n:02d}-{target}", limits)

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
        for blocks in G.BLOCK_CANDIDATES if first else (G.BlockSizes(),):
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
