"""The figures `tpudiag kernels bench` reports, from compile reports of each kernel's variants.

Per op of a compiled module, corrected cycles = max(the TPU compiler's static estimate, HBM floor,
compute floor). The HBM floor is bytes_accessed / HBM bandwidth x clock (a Pallas kernel's bytes are
its own `pl.CostEstimate`; XLA ops' bytes come from hlo_cost): TPU-NOTES says the static model is
2-4x optimistic about HBM and estimates kernels that issue their own DMAs below their traffic. The
compute floor (FLOPs at the bf16 peak) catches Pallas kernels whose work hides behind data-dependent
branches the static model does not follow. An op the static profile did not estimate (it aborted,
timed out, or gave 0) gets the larger of its two floors and is counted in `ops_floor_only`, so the
reader knows how much of the figure is a floor.

Pure functions over compile-report documents, returning the `KernelBench` model
(tpudiag.kernels-bench/1, docs/kernels.md): no I/O, no jax.
"""

from __future__ import annotations


from tpudiag.config import KERNEL_GOALS, KernelGoals
from tpudiag.results.kernels import BENCH_SCHEMA, VARIANTS, VariantFigures, KernelRow, KernelBench


def op_corrected_cycles(op: dict, clock_hz: float, hbm_bytes_per_s: float, peak_flops_per_s: float) -> tuple[float, str]:
    """(cycles, how) for one compile-report op row: the largest of its static estimate, its HBM floor
    and its compute floor; how is "static", "hbm_floor", "compute_floor", or "roofline" where the
    compiler gave no estimate."""
    hbm = op["bytes_accessed"] / hbm_bytes_per_s * clock_hz
    # The compute floor (FLOPs at the bf16 MXU peak) matters for Pallas kernels whose work sits
    # behind data-dependent branches (pl.when on scalar-prefetched values): the static model does
    # not follow them. Measured: the grouped matmul is estimated at 41k cycles on v5e against a
    # 1.0M-cycle compute floor, while a plain gridded Pallas matmul is estimated at 1.16x its floor.
    compute = op["flops"] / peak_flops_per_s * clock_hz
    # 0 from the static profile on an op that moves bytes or does work means "not estimated"
    # (seen on XLA's dequantize+matmul fusions with libtpu 0.0.42), so it gets the full roofline.
    if not op.get("estimated_cycles"):
        return max(hbm, compute), "roofline"
    static = float(op["estimated_cycles"])
    cycles = max(static, hbm, compute)
    return cycles, ("static" if cycles == static else ("hbm_floor" if cycles == hbm else "compute_floor"))


def variant_figures(variant: str, module_doc: dict | None, target_doc: dict, error: str | None = None) -> VariantFigures:
    """Figures for one compiled variant from its compile-report module document."""
    if module_doc is None or module_doc.get("status") != "ok":
        err = error or (module_doc or {}).get("error") or "not compiled"
        return VariantFigures(variant, "failed", err, None, None, 0, 0, 0, 0, 0, 0,
                              (module_doc or {}).get("static_profile"), (module_doc or {}).get("artifacts"))
    clock, hbm, peak = target_doc["clock_hz"], target_doc["hbm_bytes_per_s"], target_doc["peak_bf16_flops_per_s"]
    static_sum, corrected, floor_only, hbm_bound, compute_bound, any_static = 0, 0.0, 0, 0, 0, False
    for op in module_doc["ops"]:
        cycles, how = op_corrected_cycles(op, clock, hbm, peak)
        corrected += cycles
        if op.get("estimated_cycles"):
            any_static = True
            static_sum += int(op["estimated_cycles"])
        floor_only += how == "roofline"
        hbm_bound += how == "hbm_floor"
        compute_bound += how == "compute_floor"
    return VariantFigures(
        variant, "ok", None, static_sum if any_static else None, round(corrected), len(module_doc["ops"]),
        floor_only, hbm_bound, compute_bound, sum(int(o["bytes_accessed"]) for o in module_doc["ops"]),
        sum(int(o["flops"]) for o in module_doc["ops"]), module_doc.get("static_profile"),
        module_doc.get("artifacts"))


def _ratio(a: int | None, b: int | None) -> float | None:
    return None if not a or not b else round(a / b, 4)


def kernel_row(name: str, shape: str, blocks: str | None, jax_name: str | None, figures: dict[str, VariantFigures],
               goals: KernelGoals = KERNEL_GOALS) -> KernelRow:
    """One `kernels` row of the bench document."""
    k, x, j = (figures.get(v) for v in VARIANTS)
    kc = k.corrected_cycles if k else None
    xc = x.corrected_cycles if x else None
    ratio = _ratio(kc, xc)
    jax = {}
    if j is not None:
        jratio = _ratio(kc, j.corrected_cycles)
        jax = dict(jax_name=jax_name, jax_cycles=j.corrected_cycles, ratio_vs_jax=jratio, goal_vs_jax=goals.vs_jax,
                   meets_jax_goal=None if jratio is None else jratio <= goals.vs_jax)
    return KernelRow(name=name, shape=shape, blocks=blocks, kernel_cycles=kc, xla_cycles=xc, ratio_vs_xla=ratio,
                     goal_vs_xla=goals.vs_xla, meets_xla_goal=None if ratio is None else ratio <= goals.vs_xla,
                     variants=dict(figures), status="ok" if all(f.status == "ok" for f in figures.values()) else "failed",
                     **jax)


def bench_document(target_doc: dict, rows: list[KernelRow], static_profile: bool) -> KernelBench:
    failed = tuple(r.name for r in rows if r.status != "ok")
    return KernelBench(schema=BENCH_SCHEMA, target=target_doc, static_profile=static_profile,
                       metric="corrected_cycles: per op max(static estimated cycles, HBM floor), summed",
                       status="ok" if rows and not failed else ("partial" if len(failed) < len(rows) else "failed"),
                       failed=failed, goals_missed=tuple(r.name for r in rows if r.missed_goal), kernels=tuple(rows))
