"""The figures `tpudiag kernels bench` reports, from the compile report of each kernel's variants.

Reads `results.compile` models (a `ModuleReport` per compiled variant and the report's
`CompileTarget`); returns the `KernelBench` model (tpudiag.kernels-bench/1, docs/kernels.md). No
I/O, no jax, and no figure of its own: an op's cycles are its compile-report time
(`OpEstimate.estimated_s`, the largest of the TPU compiler's static estimate, the HBM floor, the
compute floor and, for a collective, the modelled ICI time; analyze/compile/report.py) at the
chip's clock, and `bound_by` says which one it was.

The floors matter for kernels: TPU-NOTES says the static model is 2-4x optimistic about HBM and
estimates kernels that issue their own DMAs below their traffic (a Pallas kernel's bytes are its
own `pl.CostEstimate`), and the compute floor catches Pallas kernels whose work hides behind
data-dependent branches the static model does not follow. An op the static profile did not
estimate (it aborted, timed out, or gave 0) is counted in `ops_floor_only`, so the reader knows how
much of the figure is a floor.
"""

from __future__ import annotations

from tpudiag.config import KERNEL_GOALS, KernelGoals
from tpudiag.results.compile import CompileTarget, ModuleReport, OpEstimate
from dataclasses import replace

from tpudiag.results.kernels import (BENCH_SCHEMA, VARIANTS, ChipTime, KernelBench, KernelRow, VariantFigures,
                                     uncounted_variants)

# `OpEstimate.bound_by` -> what the bench calls the figure that set an op's time.
_HOW = {"static_cycles": "static", "hbm": "hbm_floor", "compute": "compute_floor", "ici": "ici"}


def op_corrected_cycles(op: OpEstimate, clock_hz: float) -> tuple[float, str]:
    """(cycles, how) for one op of a compile report: its estimated time in cycles; how is "static",
    "hbm_floor", "compute_floor" (or "ici"), or "roofline" where the compiler gave no estimate (0
    from the static profile on an op that moves bytes means "not estimated": seen on XLA's
    dequantize+matmul fusions with libtpu 0.0.42)."""
    return op.estimated_s * clock_hz, (_HOW[op.bound_by] if op.estimated_cycles else "roofline")


def op_floor_cycles(op: OpEstimate, target: CompileTarget) -> float:
    """One op's roofline floor in cycles: the larger of its HBM bytes at HBM bandwidth (the bytes in
    HBM, `hbm_bytes`, where the report tells VMEM apart) and its FLOPs at the bf16 peak (an int8
    matmul's too: above what the chip's int8 peak allows, which matters only where it is
    compute-bound)."""
    hbm = op.hbm_bytes if op.hbm_bytes is not None else op.bytes_accessed
    return max(hbm / target.hbm_bytes_per_s, op.flops / target.peak_bf16_flops_per_s) * target.clock_hz


def variant_figures(variant: str, module: ModuleReport | None, target: CompileTarget,
                    error: str | None = None) -> VariantFigures:
    """Figures for one compiled variant from its compile-report module."""
    if module is None or module.status != "ok":
        err = error or (module.error if module is not None else None) or "not compiled"
        return VariantFigures(variant, "failed", err, None, None, 0, 0, 0, 0, 0, 0,
                              module.static_profile if module else None, module.artifacts if module else None)
    static_sum, corrected, floor, floor_only, hbm_bound, compute_bound, any_static = 0, 0.0, 0.0, 0, 0, 0, False
    for op in module.ops:
        cycles, how = op_corrected_cycles(op, target.clock_hz)
        corrected += cycles
        floor += op_floor_cycles(op, target)
        if op.estimated_cycles:
            any_static = True
            static_sum += op.estimated_cycles
        floor_only += how == "roofline"
        hbm_bound += how == "hbm_floor"
        compute_bound += how == "compute_floor"
    return VariantFigures(
        variant, "ok", None, static_sum if any_static else None, round(corrected), len(module.ops),
        floor_only, hbm_bound, compute_bound, sum(o.bytes_accessed for o in module.ops),
        sum(o.flops for o in module.ops), module.static_profile, module.artifacts, round(floor))


def _ratio(a: int | None, b: int | None) -> float | None:
    return None if not a or not b else round(a / b, 4)


def kernel_row(name: str, shape: str, blocks: str | None, jax_name: str | None, figures: dict[str, VariantFigures],
               goals: KernelGoals = KERNEL_GOALS) -> KernelRow:
    """One `kernels` row of the bench document."""
    k, x, j = (figures.get(v) for v in VARIANTS)
    kc = k.corrected_cycles if k else None
    xc = x.corrected_cycles if x else None
    ratio = _ratio(kc, xc)
    uncounted = uncounted_variants(figures)
    floors = [f.floor_cycles for name, f in figures.items()
              if f.status == "ok" and f.floor_cycles and name not in uncounted]
    floor = min(floors) if floors else None
    vs_floor = _ratio(kc, floor)
    jax = {}
    if j is not None:
        jratio = _ratio(kc, j.corrected_cycles)
        jax = dict(jax_name=jax_name, jax_cycles=j.corrected_cycles, ratio_vs_jax=jratio, goal_vs_jax=goals.vs_jax,
                   meets_jax_goal=None if jratio is None else jratio <= goals.vs_jax)
    return KernelRow(name=name, shape=shape, blocks=blocks, kernel_cycles=kc, xla_cycles=xc, ratio_vs_xla=ratio,
                     goal_vs_xla=goals.vs_xla,
                     meets_xla_goal=None if ratio is None else (ratio <= goals.vs_xla
                                                                or (vs_floor is not None and vs_floor <= goals.vs_floor)),
                     variants=dict(figures), status="ok" if all(f.status == "ok" for f in figures.values()) else "failed",
                     floor_cycles=floor, kernel_vs_floor=vs_floor, xla_vs_floor=_ratio(xc, floor),
                     goal_vs_floor=goals.vs_floor if floor else None, **jax)


def chip_time(row: dict) -> ChipTime:
    """A variant's row from capture/chip_bench.py as the model."""
    return ChipTime(row["variant"], "ok" if row.get("status") == "ok" else "failed", row.get("error"),
                    int(row.get("calls", 0)), row.get("buffers"), row.get("min_us"), row.get("median_us"),
                    row.get("wall_us"), row.get("first_call_s"))


def with_chip(row: KernelRow, times: dict[str, ChipTime], clock_hz: float, static_profile: bool = True,
              goals: KernelGoals = KERNEL_GOALS) -> KernelRow:
    """`row` with its variants' on-chip times and the verdicts they give: the fastest call of each
    variant against the others, the static floor at the chip's clock and "% of floor" (100 x floor
    / our fastest call), and (with the static profile) the static estimate over our median call."""
    ok = {v: t for v, t in times.items() if t.status == "ok" and t.min_us}
    ours = ok.get("kernel")

    def over(other: str) -> float | None:
        return round(ours.min_us / ok[other].min_us, 4) if ours and other in ok else None

    floor_us = row.floor_cycles / clock_hz * 1e6 if row.floor_cycles else None
    pct = round(100 * floor_us / ours.min_us, 1) if floor_us and ours else None
    static_us = row.kernel_cycles / clock_hz * 1e6 if row.kernel_cycles and static_profile else None
    vs_jax = over("jax")
    failed = any(t.status != "ok" for t in times.values())
    return replace(row, chip=dict(times), chip_ratio_vs_xla=over("xla"), chip_ratio_vs_jax=vs_jax,
                   floor_us=None if floor_us is None else round(floor_us, 2), pct_of_floor=pct,
                   goal_pct_of_floor=100 * goals.chip_of_floor if pct is not None else None,
                   static_over_chip=round(static_us / ours.median_us, 3) if static_us and ours else None,
                   meets_floor_goal=None if pct is None else pct >= 100 * goals.chip_of_floor,
                   meets_jax_goal_on_chip=None if vs_jax is None else vs_jax <= goals.vs_jax,
                   status="failed" if failed else row.status)


def bench_document(target_doc: dict, rows: list[KernelRow], static_profile: bool,
                   device: str | None = None) -> KernelBench:
    failed = tuple(r.name for r in rows if r.status != "ok")
    return KernelBench(schema=BENCH_SCHEMA, target=target_doc, static_profile=static_profile,
                       metric="corrected_cycles: per op max(static estimated cycles, HBM floor), summed"
                       + ("; on the chip: device time per call from the trace (module span), min and median"
                          if device else ""),
                       status="ok" if rows and not failed else ("partial" if len(failed) < len(rows) else "failed"),
                       failed=failed, goals_missed=tuple(r.name for r in rows if r.missed_goal), kernels=tuple(rows),
                       timing="chip" if device else None, device=device)
