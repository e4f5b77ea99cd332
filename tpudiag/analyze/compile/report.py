"""Assembles the `tpudiag.compile/1` document: per-op TPU time estimates and per-module totals.

Input, per compiled module: the optimized HLO (parse.hlo), the TPU compiler's static cycle
profile and LLO bundle statistics (parse.llo frames, or None where the compiler gave none), the
worker's result (XLA's cost and memory analysis), and the target chip. Output: a frozen
`CompileReport` whose `to_dict()` is the JSON document (docs/compile-schema.md). No I/O.

An op's estimated time is the largest of: static cycles / clock, bytes accessed in HBM (less what
memory-space assignment keeps in VMEM, for a copy or an op with static cycles) / HBM bandwidth,
FLOPs / peak, and (collectives) modelled ICI time; `bound_by` names the largest. The static
model is 2-4x optimistic about HBM traffic (../shared/TPU-NOTES.md), hence the HBM floor.
Collectives get 0 cycles from the static profile: they are modelled from bytes, group size and
ICI bandwidth, and flagged `modelled`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from tpudiag.analyze.compile.collectives import async_collective_tails, collective_estimates
from tpudiag.analyze.compile.memory_space import vmem_bytes
from tpudiag.analyze.hlo.categories import index_module
from tpudiag.analyze.hlo.collectives import bus_factor, message_bytes
from tpudiag.analyze.hlo.cost import module_costs
from tpudiag.analyze.hlo.fusions import build_fusion_report, fusion_summary
from tpudiag.analyze.hlo.loops import loop_runs
from tpudiag.analyze.hlo.vocabulary import (BOOKKEEPING, COLLECTIVE_KINDS, COLLECTIVE_OP_WRAPPERS, COLLECTIVE_START,
                                            COPY_MOVES, IDS, SEND_RECV_START, collective_kind)
from tpudiag.parse.hlo import RUNS_CALLEES, HloModule, Instruction
from tpudiag.parse.sdy_mesh import DeviceMesh
from tpudiag.results.compile import (SCHEMA, CompileReport, CompileTarget, CompileTotals, MemoryOnlyTotals,
                                     ModuleReport, ModuleTotals, OpEstimate)
from tpudiag.targets import Target

# Instructions that move no data and take no time on their own (they alias their operands).
_FREE = BOOKKEEPING | IDS
# The per-slot utilization columns of the LLO frame, reported as `utilization.<slot>`.
_UTIL_PREFIX = "util_"
# libtpu's out-of-memory verdict: "... the total memory required for HLO temporaries (24.00G)
# exceeds available HBM (15.75G)."
_OOM = re.compile(r"RESOURCE_EXHAUSTED.*?\(([0-9.]+)G\).*?available HBM \(([0-9.]+)G\)")

# The `--timeout` the "rerun this module" hint suggests: the decoder block's main module needs about
# 95 s of CPU for its static profile on this 2-core machine (TPU-NOTES), more when the machine is busy.
_RERUN_TIMEOUT_S = 600
# "dropped: used more than 8 GiB": the memory limit it hit (the rerun hint doubles it).
_MEMORY_DROP = re.compile(r"used more than ([0-9.]+) GiB")


@dataclass(frozen=True)
class ModuleArtifacts:
    """What the capture and parse layers produced for one compiled module."""

    name: str
    status: str  # "ok" | "failed"
    error: str | None
    static_profile: str  # "ok" | "off" | "dropped: why" | "partial: N op(s) profiled, then why"
    result: dict  # the worker's result.json
    hlo: HloModule | None  # optimized HLO
    static: pd.DataFrame | None  # parse.llo.read_static_profiles
    llo: pd.DataFrame | None  # parse.llo.read_llo_dump
    artifacts_dir: str
    notes: tuple[str, ...] = ()  # what could not be read, said in the module's findings
    input_file: str | None = None  # the module as the worker compiled it (input.mlir or input.hlo.txt)
    mesh: DeviceMesh | None = None  # the program's mesh, from the input's sdy.mesh
    setup: bool = False  # compiled in the setup group (capture/tpu_compile.is_setup_module)
    # the bytes XLA's buffer assignment gives HBM (its memory report's default space): what the
    # compiler's own out-of-memory check compares with the device; None where no report was dumped
    hbm_allocated_bytes: int | None = None




def _is_async_tail(opcode: str) -> bool:
    """`X-done` / `async-update` close an async op whose `X-start` carries the work: counting both
    would count its bytes twice."""
    return opcode.endswith("-done") or opcode == "async-update"


def _group_size(instr: Instruction, default: int) -> int:
    """Devices per replica group (`Instruction.replica_groups`: the list, iota or mesh form);
    `default` (every device) where the instruction names no groups or an empty list."""
    groups = instr.replica_groups
    return groups.group_size if groups is not None and groups.group_size else default


def ici_bytes(module: HloModule, instr: Instruction, n: int) -> float:
    """Bytes one device sends over ICI for a bandwidth-optimal ring (docs/compile.md): the
    collective's message (`message_bytes`) times its ring factor (`bus_factor`): all-reduce
    2(n-1)/n x result, all-gather and all-to-all (n-1)/n x result, reduce-scatter (n-1)/n x input,
    permute / broadcast / send / recv the whole result. Nothing leaves a group of one device, and
    the -done half of an async pair moves nothing of its own."""
    op = instr.opcode
    if n <= 1 or not (op in SEND_RECV_START or op in COLLECTIVE_KINDS or op in COLLECTIVE_START):
        return 0.0
    if op in SEND_RECV_START:
        return float(instr.parsed_shape.bytes)
    kind = collective_kind(op)
    return bus_factor(kind, n) * message_bytes(module, instr)


def _op_ici_bytes(module: HloModule, instr: Instruction, devices: int) -> float:
    """A collective's ICI bytes; for a fusion or async wrapper, the collectives inside it."""
    if instr.opcode in COLLECTIVE_OP_WRAPPERS:
        return sum(ici_bytes(module, inner, _group_size(inner, devices))
                   for inner in module.walk(instr.called, into=COLLECTIVE_OP_WRAPPERS)
                   if inner.opcode not in COLLECTIVE_OP_WRAPPERS)
    return ici_bytes(module, instr, _group_size(instr, devices))


@dataclass(frozen=True)
class DeviceFigures:
    """The figures one compiled-for device gets: a chip's, divided among the devices it exposes
    (a v4 device is one TensorCore, half a chip; every other target has one device per chip)."""

    peak_flops_per_s: float
    hbm_bytes_per_s: float
    hbm_bytes: int
    clock_hz: float

    @classmethod
    def of(cls, target: Target) -> "DeviceFigures":
        chip, k = target.chip, max(1, target.chip.devices_per_chip)
        return cls(chip.peak_bf16_flops_per_s / k, chip.hbm_bytes_per_s / k, chip.hbm_bytes // k, chip.clock_hz)


def _ring_bytes_per_s(target: Target) -> float:
    """A bidirectional ring along one torus axis uses one link each way: total ICI / links."""
    return target.chip.ici_bytes_per_s / max(1, target.chip.ici_links)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def _limit_text(bound_by: str, row: dict, target: Target) -> str:
    """A few words: what bounds the op's estimated time, and the figure that makes it so (the
    bandwidths and peaks are in the report's `target`)."""
    if bound_by == "hbm":
        return f"HBM, {_size(row['bytes_accessed'])}"
    if bound_by == "compute":
        return f"MXU, {row['flops'] / 1e9:.3g} GFLOP"
    if bound_by == "ici":
        return f"ICI, {_size(row['ici_bytes'])}/device (model)"
    return "schedule"  # the static cycle estimate is above every roofline floor


def _op_rows(m: ModuleArtifacts, target: Target, costs: dict, runs: dict[str, int]) -> list[dict]:
    dev = DeviceFigures.of(target)
    info = index_module(m.hlo)
    static = {} if m.static is None else {r.op: r for r in m.static.itertuples()}
    llo = {} if m.llo is None else {r.program: r._asdict() for r in m.llo.itertuples()}
    devices = int(m.result.get("replicas", 1)) * int(m.result.get("partitions", 1))
    rows = []
    # libtpu's async collective fusion repeats one collective in its start, its continuation fusions
    # and its done: its bytes count once, at the start.
    tails = async_collective_tails(m.hlo)
    for comp in (m.hlo.computations[c] for c in m.hlo.executed_computations):
        for instr in comp.instructions:
            if (instr.opcode in _FREE or instr.name not in info or _is_async_tail(instr.opcode)
                    or instr.opcode in RUNS_CALLEES):
                continue
            oi, cost = info[instr.name], costs.get(instr.name)
            flops = int(cost.flops) if cost else 0
            nbytes = int(cost.bytes_accessed) if cost else 0
            st = static.get(instr.name)
            cycles = None if st is None else int(st.estimated_cycles)
            # "none": the static profile ran but has no entry for this op; "off": it did not run.
            cycles_source = "static_profile" if st is not None else (
                "none" if m.static_profile == "ok" or m.static_profile.startswith("partial") else "off")
            if st is not None and (getattr(st, "estimate_missing", False) or (cycles == 0 and oi.bound == "communication")):
                cycles, cycles_source = None, "not_estimated"  # 0 with a remote DMA means "not estimated", not free
            # The HBM floor counts the bytes in HBM where it can tell them apart: memory-space
            # assignment keeps some operands and results in VMEM (S(1): a cross-program prefetch of
            # the weights, a prefetch's destination), which XLA's bytes accessed include
            # (analyze/compile/memory_space.py). A copy's VMEM side never touches HBM; an op the
            # static profile estimated has its VMEM traffic in its cycles. An op with no static
            # estimate keeps every byte at HBM bandwidth: its VMEM reads are not free, and nothing
            # else would count them.
            hbm_bytes = nbytes
            if cycles is not None or instr.opcode in COPY_MOVES:
                hbm_bytes = max(0, nbytes - vmem_bytes(m.hlo, instr))
            candidates = {"hbm": hbm_bytes / dev.hbm_bytes_per_s, "compute": flops / dev.peak_flops_per_s}
            if cycles is not None:
                candidates["static_cycles"] = cycles / dev.clock_hz
            ici = 0.0
            if oi.bound == "communication":
                ici = 0.0 if instr.name in tails else _op_ici_bytes(m.hlo, instr, devices)
                if ici:
                    candidates["ici"] = ici / _ring_bytes_per_s(target)
            bound_by = max(candidates, key=candidates.get)
            lrow = llo.get(instr.name, {})
            util = {k[len(_UTIL_PREFIX):]: round(float(v), 4) for k, v in lrow.items()
                    if k.startswith(_UTIL_PREFIX) and v == v}
            row = {
                "name": instr.name, "computation": comp.name, "in_entry": comp.is_entry, "opcode": instr.opcode,
                "fusion_kind": instr.fusion_kind, "category": oi.category, "source": oi.source,
                "estimated_cycles": cycles, "cycles_source": cycles_source, "flops": flops,
                "bytes_accessed": nbytes, "ici_bytes": round(ici), "modelled": ici > 0,
                "estimated_s": round(candidates[bound_by], 12), "runs": runs.get(comp.name, 1), "bound_by": bound_by,
                "bundles": int(lrow["bundles"]) if lrow.get("bundles") == lrow.get("bundles") and "bundles" in lrow else None,
                "utilization": util or None,
                "spills": int(lrow.get("spill_stores", 0) + lrow.get("spill_loads", 0)) if lrow else None,
                "loops": int(lrow["loops"]) if "loops" in lrow else None,
                "loop_depth": int(lrow["max_loop_depth"]) if "max_loop_depth" in lrow else None,
                **({"hbm_bytes": hbm_bytes} if hbm_bytes != nbytes else {}),
            }
            row["limit"] = _limit_text(bound_by, dict(row, bytes_accessed=hbm_bytes), target)
            rows.append(row)
    rows.sort(key=lambda r: (-r["estimated_s"] * r["runs"], r["name"]))
    return rows


def _module_doc(m: ModuleArtifacts, target: Target) -> dict:
    base = {"name": m.name, "status": m.status, "error": m.error, "static_profile": m.static_profile,
            "artifacts": m.artifacts_dir, **({"setup": True} if m.setup else {})}
    if m.status != "ok" or m.hlo is None:
        oom = _OOM.search(m.error or "")
        if oom:  # the TPU compiler's own verdict: the program does not fit this chip's HBM
            need, have = float(oom.group(1)) * 2**30, float(oom.group(2)) * 2**30
            memory = {"peak_hbm_bytes": int(need), "hbm_capacity_bytes": int(have), "fits": False}
            finding = (f"needs {need / 2**30:.1f} GiB of HBM per device, a {target.chip.name} device has "
                       f"{have / 2**30:.2f} GiB usable (the TPU compiler's own figures)")
            return {**base, "ops": [], "totals": {"memory": memory}, "findings": [finding, *m.notes]}
        return {**base, "ops": [], "totals": None, "findings": list(m.notes)}
    costs = module_costs(m.hlo)  # once: the op rows and the fusion report both read it
    loops = loop_runs(m.hlo)  # once: the op rows' runs and the findings both read it
    ops = _op_rows(m, target, costs, loops.runs)
    mem = m.result.get("memory", {})
    # The compiler's own figure where it dumped one. The memory analysis's sum counts more than the
    # buffer assignment allocates (a step it compiled for 94.7 GiB usable sums to 99.5 GiB), so it is
    # the figure only where no memory report was dumped.
    peak, peak_source = m.hbm_allocated_bytes, "buffer_assignment"
    if peak is None:
        peak, peak_source = (mem.get("argument_bytes", 0) + mem.get("output_bytes", 0) - mem.get("alias_bytes", 0)
                             + mem.get("temp_bytes", 0) + mem.get("generated_code_bytes", 0)), "memory_analysis"
    cap = DeviceFigures.of(target).hbm_bytes
    fits = peak <= cap
    cost = m.result.get("cost", {})
    optimal = cost.get("optimal_seconds")
    totals = {
        "estimated_s": round(sum(o["estimated_s"] * o["runs"] for o in ops), 12),
        "estimated_cycles": sum((o["estimated_cycles"] or 0) * o["runs"] for o in ops),
        "ops_with_static_cycles": sum(o["cycles_source"] == "static_profile" for o in ops),
        "ops": len(ops),
        "flops": int(cost.get("flops", 0)),
        "bytes_accessed": int(cost.get("bytes accessed", 0)),
        # XLA reports a negative optimal_seconds when it has no model for the module.
        "xla_optimal_s": optimal if optimal is not None and optimal >= 0 else None,
        "compile_s": m.result.get("compile_s"),
        "devices": int(m.result.get("replicas", 1)) * int(m.result.get("partitions", 1)),
        "memory": {**mem, "peak_hbm_bytes": peak, "peak_source": peak_source, "hbm_capacity_bytes": cap,
                   "fits": fits},
    }
    findings = list(m.notes)
    if loops.trips:
        findings.append("while loops run " + ", ".join(f"{w} {t} times" for w, t in loops.trips.items())
                        + " per execution: their bodies' op times count that many times in the totals "
                          "(op rows give one run's time and `runs`)")
    if loops.unknown:
        findings.append(f"trip count unknown for {', '.join(loops.unknown)}: the loop body counts once in the totals")
    if not fits:
        findings.append(f"needs {peak / 2**30:.1f} GiB of HBM per device, a {target.chip.name} device has "
                        f"{cap / 2**30:.0f} GiB")
    if any(o["modelled"] for o in ops):
        findings.append("collective times are a model (bytes, group size, ICI bandwidth), not compiler estimates")
    if m.static_profile.startswith(("dropped", "partial")):
        # The input the worker compiled sits in the module directory: rerun it alone, with more room.
        mem = _MEMORY_DROP.search(m.static_profile)
        option = (f"--static-memory {2 * float(mem.group(1)):g}", "more memory") if mem else \
            (f"--timeout {_RERUN_TIMEOUT_S}", "a longer limit")
        rerun = (f". Rerun this module alone with {option[1]}: tpudiag compile --target {target.topology} "
                 f"{option[0]} {m.input_file}") if m.input_file else ""
        floors = ("the other ops' times are roofline floors" if m.static_profile.startswith("partial")
                  else "op times are roofline floors only")
        findings.append(f"static cycle profile {m.static_profile}; {floors}{rerun}")
    times = {o["name"]: o["estimated_s"] for o in ops}
    fusions = fusion_summary(build_fusion_report(m.hlo, times, "estimated", costs))
    collectives = collective_estimates(m.hlo, ops, target, m.mesh, m.result.get("device_coords"), totals["devices"])
    exposed = [c for c in collectives if c.is_async and c.exposed_s < c.estimated_s]
    if exposed:
        findings.append(f"{len(exposed)} of {len(collectives)} collectives are asynchronous with compute scheduled "
                        "between start and done: their exposed time is what that compute cannot hide")
    return {**base, "ops": ops, "totals": totals, "findings": findings, "fusions": fusions,
            "collectives": collectives}


def _module_report(doc: dict) -> ModuleReport:
    totals = doc["totals"]
    if totals is not None:
        totals = ModuleTotals(**totals) if "estimated_s" in totals else MemoryOnlyTotals(**totals)
    return ModuleReport(**{**doc, "ops": tuple(OpEstimate(**o) for o in doc["ops"]), "totals": totals,
                           "findings": tuple(doc["findings"]), "collectives": tuple(doc.get("collectives", ()))})


def build_compile_report(target: Target, modules: list[ModuleArtifacts], source: dict) -> CompileReport:
    """The compile report of `modules`, without suggestions (the pipeline adds the detectors'
    unpriced ones: `api.pipeline`)."""
    docs = [_module_doc(m, target) for m in modules]
    ok = [d for d in docs if d["status"] == "ok"]
    chip, dev = target.chip, DeviceFigures.of(target)
    report = CompileReport(
        schema=SCHEMA,
        status="ok" if len(ok) == len(docs) and docs else ("partial" if ok else "failed"),
        target=CompileTarget(chip=chip.name, topology=target.topology, chips=target.chips, devices=target.devices,
                             devices_per_chip=chip.devices_per_chip, clock_hz=dev.clock_hz,
                             peak_bf16_flops_per_s=dev.peak_flops_per_s, hbm_bytes_per_s=dev.hbm_bytes_per_s,
                             hbm_bytes=dev.hbm_bytes, ici_bytes_per_s=chip.ici_bytes_per_s,
                             ici_ring_bytes_per_s=_ring_bytes_per_s(target), note=target.note,
                             single_chip=True if getattr(target, "single_chip", False) else None),
        source=source,
        modules=tuple(_module_report(d) for d in docs),
        totals=CompileTotals(modules=len(docs), failed=len(docs) - len(ok),
                             estimated_s=round(sum(d["totals"]["estimated_s"] for d in ok), 12)),
    )
    return report
