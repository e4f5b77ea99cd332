"""`tpudiag estimate`'s passes over the step's Pallas kernels, the parts that compile nothing: the
values of a kernel's table operands followed back to the step's constants, the MXU work a kernel
with no cost estimate of its own does (read from its body over the grid steps its tables run), and
the compiler's cycles for a kernel's grid steps applied to its op once its step probes are compiled
(`api/estimate_probes.probe_kernels`). docs/estimate.md describes both; the body is read by
`analyze/compile/kernel_body.py`.

Pure: takes the compile report, the step's parsed HLO and the tables the caller read from the run
(`kernel_tables.json`); returns (the report, a finding or None). No I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from tpudiag.analyze.compile.passes import at_cycles, noted
from tpudiag.analyze.hlo.vocabulary import COPIES

_SHAPE = re.compile(r"^(\w+)\[([\d,]*)\](?:\{([\d,]*))?")


def same_order(a: str, b: str) -> bool:
    """Whether two shapes hold their values in the same row-major order (a bitcast between them
    keeps a table's flat values as they are): the same dims, and the same layout where given."""
    ma, mb = _SHAPE.match(a or ""), _SHAPE.match(b or "")
    if not ma or not mb or ma.group(2) != mb.group(2):
        return False
    return (ma.group(3) or "") == (mb.group(3) or "") or not ma.group(3) or not mb.group(3)


def loop_invariant(hlo, loop, k: int) -> bool:
    """Whether a while loop's body hands element `k` of its tuple on unchanged."""
    body = hlo.computations.get(loop.body or "")
    root = body.root if body is not None else None
    carried = hlo.operand(root, k) if root is not None and root.opcode == "tuple" else None
    while carried is not None and carried.opcode == "copy":
        carried = hlo.operand(carried, 0)
    return (carried is not None and carried.opcode == "get-tuple-element" and carried.index == k
            and hlo.operand(carried, 0) is not None and hlo.operand(carried, 0).opcode == "parameter")


def table_source(hlo, instr) -> str | None:
    """The constant a kernel's operand is, followed back through copies (a prefetch into VMEM is
    copy-start/copy-done), bitcasts, tuples and the loop-invariant elements of a while loop (a
    scanned layer's kernel reads its tables through the loop's tuple); None where it is not one."""
    pending: list[int] = []  # tuple elements still to take, innermost last
    for _ in range(64):
        if instr is None:
            return None
        source = hlo.operand(instr, 0) if instr.operands else None
        if instr.opcode in COPIES and source is not None:
            instr = source
        elif instr.opcode == "bitcast" and source is not None and same_order(instr.shape, source.shape):
            instr = source
        elif instr.opcode == "get-tuple-element" and instr.index is not None:
            pending.append(instr.index)
            instr = hlo.operand(instr, 0)
        elif instr.opcode == "tuple" and pending:
            instr = hlo.operand(instr, pending.pop())
        elif instr.opcode == "parameter" and pending:  # inside a loop's body: the loop's init, if unchanged
            loops = [c for c, key in hlo.callers.get(instr.computation, []) if key == "body" and c.opcode == "while"]
            if len(loops) != 1 or not loop_invariant(hlo, loops[0], pending[-1]):
                return None
            instr = hlo.operand(loops[0], 0)
        elif instr.opcode == "while" and pending:  # a loop's result: its init, if the body leaves it as is
            if not loop_invariant(hlo, instr, pending[-1]):
                return None
            instr = hlo.operand(instr, 0)
        elif instr.opcode == "constant" and not pending:
            return instr.name
        else:
            return None
    return None


def constant_values(hlo, name: str | None) -> list[int] | None:
    """The values of an integer constant the optimized HLO prints whole (a scalar, a short table);
    None where it elides them or is not one."""
    instr = hlo.instruction(name) if name else None
    m = re.match(r"([su](?:8|16|32|64)|pred)\[([\d,]*)\]", instr.shape) if instr is not None else None
    if not m or "..." in instr.literal:
        return None
    values = [int(v) for v in re.findall(r"-?\d+", instr.literal.replace("true", "1").replace("false", "0"))]
    return values if len(values) == math.prod(int(d) for d in m.group(2).split(",") if d) else None


def kernel_works(report, hlo, tables: dict) -> dict:
    """{op name: (its instruction, its KernelWork, whether the kernel gives a cost estimate of its own)}
    for the step's ops of Pallas kernels whose body has matmuls (`analyze/compile/kernel_body.py`); the
    values of their operands that are constants of the step (the tables, a grid size) from `tables`
    ({constant name: its values}, the module's `kernel_tables.json` as the caller read it) or the
    HLO's own text."""
    from tpudiag.analyze.compile.kernel_body import kernel_body, kernel_work
    from tpudiag.analyze.hlo.cost import has_cost_estimate

    out, memo = {}, {}
    for o in report.modules[0].ops:
        instr = hlo.instruction(o.name, o.computation) if o.opcode == "custom-call" else None
        if instr is None or instr.custom_call_target != "tpu_custom_call":
            continue
        body = kernel_body(instr.backend_config)
        if body is None:
            continue
        values = []
        for k in range(len(instr.operands)):
            source = table_source(hlo, hlo.operand(instr, k))
            values.append(tables.get(source or "") or constant_values(hlo, source))
        key = (body, tuple(tuple(v) if v else None for v in values))
        if key not in memo:
            memo[key] = kernel_work(body, values)
        if memo[key] is not None and memo[key].flops > 0:
            out[o.name] = (instr, memo[key], has_cost_estimate(instr))
    return out


def kernel_bodies(report, works: dict):
    """(the report with each Pallas kernel that gives no cost estimate of its own timed by the MXU
    work of its body over the grid steps that run it, a finding or None). Such a kernel's op counts
    0 FLOPs (JAX's splash attention gives none); `works` is `kernel_works`. An op takes the longer of
    that at the MXU peak and its time so far."""
    works = {n: w for n, (_, w, estimated) in works.items() if not estimated}
    if not works:
        return report, None
    m = report.modules[0]
    t = report.target
    ops, added, unresolved = [], 0.0, 0
    for o in m.ops:
        if o.name not in works:
            ops.append(o)
            continue
        work = works[o.name]
        unresolved += work.guarded and not work.resolved
        s = work.flops / t.peak_bf16_flops_per_s
        steps = "every grid step" if not work.guarded else (
            "the grid steps its tables run" if work.resolved else "every grid step (its tables not evaluated)")
        if s > o.estimated_s:
            added += (s - o.estimated_s) * o.runs
            o = replace(o, flops=work.flops, estimated_s=round(s, 12), bound_by="compute",
                        limit=f"MXU, {work.flops / 1e9:.3g} GFLOP in its body's matmuls over {steps}")
        else:
            o = replace(o, flops=work.flops)
        ops.append(o)
    return noted(report, ops, (
        f"{len(works)} Pallas kernel op(s) with no cost estimate of their own: MXU work read from the kernel's "
        f"body over the grid steps that run it, at the MXU peak (+{added:.4g} s per step; softmax and other "
        "vector work not counted)"
        + (f"; {unresolved} whose grid steps depend on tables that could not be evaluated (values not known, "
           "or too many steps): every step counted" if unresolved else "")))


def kernel_key(hlo, instr) -> tuple:
    """What makes two kernel ops one probe: the body, the operand shapes and the result shape."""
    shapes = tuple(hlo.operand(instr, k).shape if hlo.operand(instr, k) else "" for k in range(len(instr.operands)))
    return (instr.backend_config.get("custom_call_config", {}).get("body"), shapes, instr.shape)


def first_line(text: str | None, limit: int = 300) -> str:
    """The gist of a compiler's message: its first line that says something, cut to `limit`."""
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    line = re.sub(r"[FEWI]\d{4} [\d:.]+\s+\d+ \S+\] ", "", lines[0]) if lines else "no reason given"  # glog's prefix
    return line if len(line) <= limit else line[:limit - 3] + "..."


def kernels_to_probe(works: dict) -> dict:
    """{op name: (instruction, KernelWork)} of the kernels (`kernel_works`) whose every matmul branch
    reads a table (`KernelWork.table_gated`: not one gated on grid ids alone), their steps evaluated
    from their tables: the ones `api/estimate_probes.probe_kernels` compiles step probes for."""
    return {n: (i, w) for n, (i, w, _) in works.items() if w.resolved and w.signatures and w.table_gated}


@dataclass
class KernelProbes:
    """What compiling the kernel step probes found (`api/estimate_probes.probe_kernels` fills it)."""

    works: dict  # {op name: (instruction, KernelWork)}: `kernels_to_probe`
    cores: int  # the TensorCores a megacore device splits a kernel's `parallel` grid steps over
    step_cycles: dict = field(default_factory=dict)  # {(kernel_key, kind of step): one step's cycles, or None}
    names: dict = field(default_factory=dict)  # {kernel_key: its probes' name}
    status: dict = field(default_factory=dict)  # {op name: "short" | "skipped"}: not probed
    reasons: dict = field(default_factory=dict)  # {probe: why it gave no cycles}


def probed_kernels(report, hlo, probes: KernelProbes, *, budget_s: float, most_kinds: int):
    """(the report with the step's Pallas kernels whose matmuls their tables gate timed by the
    compiler's cycles for their grid steps, a finding or None), once their step probes are compiled.
    Each op takes one step's cycles of each kind times the steps of that kind (over the TensorCores
    of a megacore device, where the kernel has parallel grid steps for each) where longer than its
    time so far; an op whose probes gave no cycles keeps its time. `budget_s` and `most_kinds` are
    the probes' limits, named in the finding."""
    from tpudiag.analyze.compile.kernel_body import STEP_PROBE

    m = report.modules[0]
    clock = report.target.clock_hz
    flops_per_cycle = report.target.peak_bf16_flops_per_s / clock
    ops, added, slower, ratios, timed_keys = [], 0.0, 0, [], set()
    cores, step_cycles, names, reasons = probes.cores, probes.step_cycles, probes.names, probes.reasons
    status = dict(probes.status)
    for o in m.ops:
        instr, work = probes.works.get(o.name, (None, None))
        if instr is None or o.name in status:
            ops.append(o)
            continue
        key = kernel_key(hlo, instr)
        per_kind = [step_cycles.get((key, sig)) for sig, _ in work.signatures]
        if None in per_kind:
            status[o.name] = "failed"
            ops.append(o)
            continue
        split = cores if cores > 1 and work.parallel >= cores else 1
        cycles = sum(c * count for c, (_, count) in zip(per_kind, work.signatures)) / split
        timed_keys.add(key)
        ratios.append(cycles / (work.flops / flops_per_cycle))
        kind = f"{len(work.signatures)} kinds of grid step" if len(work.signatures) > 1 else "one grid step"
        new = at_cycles(o, round(cycles), clock, "kernel_probe",
                        f"compiler cycles for {kind}, alone ({names[key]}), x {work.active:,} active steps"
                        + (f" over {split} TensorCores" if split > 1 else ""))
        if new is not o:
            added += (new.estimated_s - o.estimated_s) * o.runs
            slower += 1
        ops.append(new)
    failed, short, skipped = (sum(1 for v in status.values() if v == want) for want in ("failed", "short", "skipped"))
    if not ratios and not failed and not skipped and not short:
        return report, None
    distinct = len(timed_keys)
    kinds = sum(1 for (k, _), c in step_cycles.items() if k in timed_keys and c is not None)
    if ratios:
        head = (f"{len(ratios)} Pallas kernel op(s) ({distinct} distinct, {kinds} kind(s) of grid step) timed by "
                "the TPU compiler's static cycles for their grid steps, each kernel compiled alone with the branches "
                f"on its tables set (estimate/kernel_probes/): {min(ratios):.3g}x-{max(ratios):.3g}x their matmuls "
                f"at the MXU peak, {slower} slower than before, +{added:.4g} s per step")
    else:
        head = "no Pallas kernel op timed by the TPU compiler's cycles for its grid steps (estimate/kernel_probes/)"
    first = next(iter(reasons.items()), None)
    return noted(report, ops, (
        head
        + (f"; {failed} kernel op(s) whose probes gave no cycles" + (f" ({first[0]}: {first[1]})" if first else "")
           if failed else "")
        + (f"; {short} kernel op(s) not probed (a grid's last axis of {STEP_PROBE[1]} steps or fewer, more than "
           f"{most_kinds} kinds of step, or a body not rewritten)" if short else "")
        + (f"; {skipped} kernel op(s) not probed: the probes' {budget_s:.0f} s were spent"
           if skipped else "")
        + ("; those keep their time" if failed or short or skipped else "")))
