"""`tpudiag estimate`'s passes over the step's ops that read its HLO and compile nothing: HBM time
from the bytes in HBM only and as the TPU lays them out in tiles, the compiler's convolution cost
model for matmuls no probe timed, a grouped matmul over the row tiles it visits, the matmul probes'
cycles applied to the ops they stand for, and the step's transfers to host memory. The order they
run in is `api/estimate.py`'s `step_passes`; docs/estimate.md describes each.

Pure: each takes the compile report and the step's parsed HLO (and what a probe measured, where it
applies one) and returns (the report, a finding or None). No I/O; compiling a probe is the caller's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from tpudiag.analyze.compile.passes import at_cycles, noted, with_step
from tpudiag.analyze.hlo.vocabulary import ASYNC_COPY


def hbm_outside_vmem(report, hlo):
    """(the report with each HBM-bound op's time taken from the bytes it moves in HBM only, a
    finding or None): bytes in VMEM (`analyze/compile/memory_space.py`) are left out, and the op
    takes the longer of that and its compute time."""
    from tpudiag.analyze.compile.memory_space import vmem_bytes

    m = report.modules[0]
    t = report.target
    ops, saved, changed = [], 0.0, 0
    for o in m.ops:
        instr = hlo.instruction(o.name, o.computation) if o.bound_by == "hbm" else None
        vmem = vmem_bytes(hlo, instr) if instr is not None else 0
        if vmem:
            hbm = max(0, o.bytes_accessed - vmem)
            s, bound = max((hbm / t.hbm_bytes_per_s, "hbm"), (o.flops / t.peak_bf16_flops_per_s, "compute"))
            if s < o.estimated_s:
                saved += (o.estimated_s - s) * o.runs
                changed += 1
                o = replace(o, estimated_s=round(s, 12), bound_by=bound,
                            limit=f"HBM, {hbm / 1e6:.3g} MB ({vmem / 1e6:.3g} MB in VMEM)" if bound == "hbm" else
                            f"MXU, {o.flops / 1e9:.3g} GFLOP")
        ops.append(o)
    return noted(report, ops, changed and (
        f"{changed} op(s) read or write buffers XLA placed in VMEM: their HBM time counts HBM bytes only "
        f"(-{saved:.4g} s per step)"))


def tiled_hbm(report, hlo):
    """(the report with each HBM-bound op's HBM time scaled by its layout padding, a finding or None):
    bytes as the TPU lays them out in tiles (`memory_space.hbm_padding`), not as the shape counts
    them. On a v5e a rotary fusion over bf16[4,2048,16,32] took 4.7x its logical bytes at HBM
    bandwidth (tpudiag report fixtures/tpu-v5e/llama_train)."""
    from tpudiag.analyze.compile.memory_space import hbm_padding

    ops, added, changed = [], 0.0, 0
    for o in report.modules[0].ops:
        instr = hlo.instruction(o.name, o.computation) if o.bound_by == "hbm" and not o.modelled else None
        pad = hbm_padding(hlo, instr) if instr is not None and o.opcode not in ASYNC_COPY else 1.0
        if pad > 1.0:
            added += o.estimated_s * (pad - 1) * o.runs
            changed += 1
            o = replace(o, estimated_s=round(o.estimated_s * pad, 12), limit=f"{o.limit} x{pad:.2f} tile padding")
        ops.append(o)
    return noted(report, ops, changed and (
        f"{changed} HBM-bound op(s) move arrays whose TPU layout pads their minor dims to the tile (8 x 128): "
        f"timed at their laid-out bytes (+{added:.4g} s per step)"))


class ProbeTime(NamedTuple):
    """What a probe says of one op: its cycles (scaled to the op from the probe's cut), the probe
    module's name, whether they are the probe's convolution cost model (the probe gave no static
    cycles), and then the step's own cost-model record for the op (None where it has none)."""

    cycles: int
    probe: str
    cost_model: bool = False
    step_cost_model: int | None = None

    def chosen(self) -> tuple[int, str]:
        """(cycles, their source). Static cycles stand. Of two cost-model records, the probe's and
        the step's, the lower: the cost model is never much under the static profile (0.90-1.85x
        it on 30 probes of published steps, docs/estimate.md), so the lower is the nearer."""
        if not self.cost_model:
            return self.cycles, self.probe
        if self.step_cost_model and self.step_cost_model < self.cycles:
            return self.step_cost_model, f"{self.probe}; the step's cost model, lower"
        return self.cycles, f"{self.probe}, its cost model"


def probed_matmuls(report, seconds: dict, probes: int, missing: int, skipped: int, budget_s: float,
                   by_cost_model: int = 0):
    """(the report with the step's compute-bound matmul fusions timed by their probes' cycles, the
    finding). `seconds`: {op name: `ProbeTime`} for each op a probe stands for; `probes` were
    selected, `missing` gave no cycles and `skipped` were not compiled within `budget_s` wall
    seconds (`api/estimate_probes.probe_matmuls` compiles them); `by_cost_model` of the timed ones
    gave no static cycles and are timed by a convolution cost model's record. An op takes its
    probe's time where that is longer than its roofline time."""
    m = report.modules[0]
    clock = report.target.clock_hz
    ops, added, slower = [], 0.0, 0
    for o in m.ops:
        got = seconds[o.name].chosen() if o.name in seconds else None
        new = at_cycles(o, got[0], clock, "matmul_probe", f"compiler cycles, alone ({got[1]})") if got else o
        if new is not o:
            added += (new.estimated_s - o.estimated_s) * o.runs
            slower += 1
        ops.append(new)
    timed = probes - missing - skipped
    note = (f"{len(seconds)} compute-bound matmul op(s) ({timed} distinct) timed by the TPU compiler's "
            f"static cycles, each compiled alone (estimate/probes/): {slower} slower than the MXU peak, +{added:.4g} s "
            f"per step" + (f"; {by_cost_model} of those probes gave no static cycles: their ops take the lower of "
                           f"the probe's and the step's convolution cost model" if by_cost_model else "")
            + (f"; {missing} probe(s) gave no cycles" if missing else "")
            + (f"; {skipped} not probed within {budget_s:.0f} s" if skipped else "")
            + ("; their ops take the compiler's convolution cost model where the step's HLO has it"
               if missing or skipped else ""))
    return noted(report, ops, note)


def cost_model_matmuls(report, hlo, probed=frozenset()):
    """(the report with each compute-bound matmul that no probe timed taken at the cycles the TPU
    compiler's convolution cost model recorded for it in the step's HLO, a finding or None). An op
    takes them where they are longer than its roofline time; ops a probe (`probed`: their names) or
    the step's static profile timed keep those cycles."""
    from tpudiag.analyze.compile.matmul_probe import cost_model_cycles

    m = report.modules[0]
    clock = report.target.clock_hz
    ops, added, slower, found = [], 0.0, 0, 0
    for o in m.ops:
        timed = o.name in probed or (o.cycles_source == "static_profile" and o.estimated_cycles)
        candidate = o.bound_by == "compute" and o.flops > 0 and not timed
        instr = hlo.instruction(o.name, o.computation) if candidate else None
        cycles = cost_model_cycles(hlo, instr) if instr is not None else None
        found += cycles is not None
        new = at_cycles(o, cycles, clock, "cost_model", "compiler cycles, its convolution cost model") if cycles else o
        if new is not o:
            added += (new.estimated_s - o.estimated_s) * o.runs
            slower += 1
        ops.append(new)
    if not found:
        return report, None
    return noted(report, ops, (
        f"{found} compute-bound matmul op(s) with no static cycles timed by the TPU compiler's convolution "
        f"cost model (the cycles of the tiling it chose, in the step's HLO): {slower} slower than the MXU peak, "
        f"+{added:.4g} s per step"))


def grouped_matmul_tiles(report, hlo):
    """(the report with each megablox-style grouped matmul timed over the row tiles it visits, a
    finding or None): its grid is sized at run time by the routing, and its own cost estimate
    counts the useful FLOPs only (`analyze/compile/grouped_matmul.py`: balanced routing). Where the
    kernel records its tiles, a gmm's bytes are what its pipeline moves, not its own estimate; an
    op the static profile timed keeps that time where it is longer."""
    from tpudiag.analyze.compile.grouped_matmul import tile_visits

    m = report.modules[0]
    t = report.target
    ops, delta, factors, rebytes = [], 0.0, [], 0
    for o in m.ops:
        instr = hlo.instruction(o.name, o.computation) if o.opcode == "custom-call" else None
        tv = tile_visits(hlo, instr) if instr is not None else None
        if tv is None or o.flops <= 0:
            ops.append(o)
            continue
        factors.append(tv.factor)
        work = o.flops * tv.factor
        visits = f"{tv.expected:.4g} row-tile visits of {tv.tile_rows} rows ({tv.row_tiles} tiles, {tv.groups} groups)"
        times = [(work / t.peak_bf16_flops_per_s, "compute")]
        if tv.hbm_bytes is None:
            times.append((o.estimated_s, o.bound_by))  # its own estimate's bytes, or the static profile's time
        else:
            rebytes += 1
            times.append((tv.hbm_bytes / t.hbm_bytes_per_s, "hbm"))
            if o.bound_by == "static_cycles":
                times.append((o.estimated_s, o.bound_by))
        s, bound = max(times)
        if bound == "compute":
            limit = f"MXU, {work / 1e9:.3g} GFLOP in {visits}"
        elif bound == "hbm" and tv.hbm_bytes is not None:
            limit = f"HBM, {tv.hbm_bytes / 1e9:.3g} GB in {visits}, tiles {'x'.join(map(str, tv.tiles))}"
        else:
            limit = o.limit
        moved = {} if tv.bytes_moved is None else {
            "bytes_accessed": tv.bytes_moved, "hbm_bytes": tv.hbm_bytes if tv.hbm_bytes != tv.bytes_moved else None}
        delta += (s - o.estimated_s) * o.runs
        ops.append(replace(o, estimated_s=round(s, 12), bound_by=bound, limit=limit, **moved))
    if not factors:
        return report, None
    return noted(report, ops, (
        f"{len(factors)} grouped matmul(s) on a grid sized by the routing: MXU work counted over the row "
        f"tiles they visit with balanced routing, {min(factors):.3g}x-{max(factors):.3g}x their useful FLOPs"
        + (f"; {rebytes} with the kernel's tiles in its metadata take the bytes its pipeline moves"
           if rebytes else "") + f" ({delta:+.4g} s per step)"))


def host_offload(report, hlo, target):
    """(the report with a finding on the step's transfers to and from host memory, their `HostTime`
    or None): activation offload, timed over the chip's host link where the chip table has one
    (`analyze/compile/host_transfers.py`). `target`: the `targets.Target` (its chips and devices).
    Run after every pass that changes op times: the compute between a transfer's start and done is
    what hides it."""
    from tpudiag.analyze.compile.host_transfers import host_time, host_transfers, offload_bytes
    from tpudiag.analyze.hlo.loops import loop_runs

    transfers = host_transfers(hlo, loop_runs(hlo).runs)
    if not transfers:
        return report, None
    m = report.modules[0]
    to_host, from_host = offload_bytes(transfers)
    moved = (f"{(to_host + from_host) / 1e9:.3g} GB per step per device move between HBM and host memory "
             f"({to_host / 1e9:.3g} GB out, {from_host / 1e9:.3g} GB back: activation offload)")
    link = target.chip.host_link_bytes_per_s
    if not link:
        note = f"{moved}; not timed, the chip table has no host-link bandwidth for {target.chip.name}"
        return with_step(report, replace(m, findings=(*m.findings, note))), None
    per_device = link * target.chips / target.devices
    collectives = {c.name for c in m.collectives}
    ops = [(o.name, o.computation, o.estimated_s, o.runs) for o in m.ops if o.name not in collectives]
    ht = host_time(hlo, transfers, ops, per_device)
    note = (f"{moved}: {ht.link_s:.4g} s on the host link at {per_device / 1e9:.3g} GB/s each way per device, "
            f"{ht.exposed_s:.4g} s of it exposed (the rest under the compute scheduled beside it)")
    return with_step(report, replace(m, findings=(*m.findings, note))), ht
