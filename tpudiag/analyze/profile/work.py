"""What a profile run executed, in figures that do not depend on the speed of the machine it ran on.

Input: the per-op frame of a run (`timeline.aggregate_ops`: program_id, op, occurrences), the
optimized HLO of the executed modules ({program_id: HloModule}) and the bytes XLA's buffer
assignment allocates for each ({program_id: bytes}). Output: each op's cost per execution
(`hlo_cost.module_costs`: FLOPs, transcendentals, bytes accessed) and a `Work` section: those
costs times how often each op ran, summed over the run, plus the largest module's allocation.

Two runs of the same program on a faster or a busier machine have the same `Work`; a program
that does more (a bigger matmul, an extra sort pass) has more. `roofline_s` folds FLOPs and bytes
into one figure for `compare` to gate on: each execution costs the larger of its FLOPs at the
reference chip's bf16 peak and its bytes at the reference chip's HBM bandwidth (v5e: 197 TFLOP/s,
819 GB/s), so a compute-bound and a memory-bound change both move it. It is a yardstick, not a
time the program takes anywhere (`profile --target` estimates that). No I/O.
"""

from __future__ import annotations


import pandas as pd

from tpudiag.analyze.hlo.cost import Cost, module_costs
from tpudiag.targets import CHIPS
from tpudiag.results.profile import OpWork, Work

REFERENCE_CHIP = "v5e"


def _roofline_s(cost: Cost) -> float:
    chip = CHIPS[REFERENCE_CHIP]
    return max(cost.flops / chip.peak_bf16_flops_per_s, cost.bytes_accessed / chip.hbm_bytes_per_s)


def op_costs(ops: pd.DataFrame, modules: dict) -> dict[tuple[int, str], Cost]:
    """{(program_id, op): cost of one execution} for the ops whose module and instruction are known."""
    out: dict[tuple[int, str], Cost] = {}
    per_module: dict[int, dict[str, Cost]] = {}
    for pid, op in zip(ops["program_id"], ops["op"]):
        pid = int(pid)
        if pid not in modules:
            continue
        if pid not in per_module:
            per_module[pid] = module_costs(modules[pid])
        cost = per_module[pid].get(op)
        if cost is not None:
            out[(pid, op)] = cost
    return out


def executed_work(timeline: pd.DataFrame, steps: int, costs: dict[tuple[int, str], Cost],
                  allocated: dict[int, int]) -> Work | None:
    """The run's `Work` from its op instances (`timeline.build_timeline`: program_id, module, op, step),
    or None when no op could be costed (no HLO dump: a bare trace)."""
    if not costs or timeline.empty:
        return None
    sel = timeline[timeline["step"] >= 0] if steps else timeline
    per, div = ("step", steps) if steps else ("run", 1)
    setup: tuple[str, ...] = ()
    if steps:
        # Async dispatch lets a setup computation (the input draw) run on into the first step; a
        # module seen in half the steps or fewer is not part of the step.
        seen = sel.groupby("program_id")["step"].nunique()
        keep = {int(p) for p, n in seen.items() if n * 2 > steps}
        setup = tuple(sorted({str(m) for p, m in zip(sel["program_id"], sel["module"]) if int(p) not in keep}))
        sel = sel[sel["program_id"].isin(keep)]
    counts = sel.groupby(["program_id", "module", "op"], sort=False).size()
    flops = trans = nbytes = execs = roofline = 0.0
    uncosted = 0
    rows = []
    for (pid, module, op), n in counts.items():
        execs += n
        cost = costs.get((int(pid), op))
        if cost is None:
            uncosted += 1
            continue
        one = _roofline_s(cost)
        flops += n * cost.flops
        trans += n * cost.transcendentals
        nbytes += n * cost.bytes_accessed
        roofline += n * one
        rows.append(OpWork(module=str(module), name=str(op), executions=_r(n / div), flops=_r(n * cost.flops / div),
                           bytes_accessed=_r(n * cost.bytes_accessed / div), roofline_s=_r(n * one / div)))
    executed = {int(p) for p in sel["program_id"]}
    peaks = [b for pid, b in allocated.items() if pid in executed]
    rows.sort(key=lambda r: (-r.roofline_s, r.module, r.name))
    return Work(per=per, steps=int(steps), flops=_r(flops / div), transcendentals=_r(trans / div),
                bytes_accessed=_r(nbytes / div), op_executions=_r(execs / div), roofline_s=_r(roofline / div),
                reference_chip=REFERENCE_CHIP, peak_allocation_bytes=max(peaks) if peaks else None,
                uncosted_ops=uncosted, setup_modules=setup, ops=tuple(rows))


def _r(x: float) -> float:
    """Whole numbers stay whole (FLOPs of one step); fractions keep 15 significant digits."""
    return float(x) if float(x).is_integer() else float(f"{x:.15g}")
