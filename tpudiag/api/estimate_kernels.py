"""`tpudiag estimate`'s passes over the step's Pallas kernels: the MXU work a kernel with no cost
estimate of its own does (read from its body over the grid steps its tables run), and the compiler's
cycles for the grid steps of a kernel whose matmuls its tables gate (kernel step probes). Both are
described in docs/estimate.md; the body is read by `analyze/compile/kernel_body.py`."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from tpudiag.api.estimate_ops import _at_cycles, _compile_alone, _probe_setup, _with_step
from tpudiag.capture import rundir


_COPIES = ("copy", "copy-start", "copy-done")  # the same values (a layout change is physical only)
_SHAPE = re.compile(r"^(\w+)\[([\d,]*)\](?:\{([\d,]*))?")


def _same_order(a: str, b: str) -> bool:
    """Whether two shapes hold their values in the same row-major order (a bitcast between them
    keeps a table's flat values as they are): the same dims, and the same layout where given."""
    ma, mb = _SHAPE.match(a or ""), _SHAPE.match(b or "")
    if not ma or not mb or ma.group(2) != mb.group(2):
        return False
    return (ma.group(3) or "") == (mb.group(3) or "") or not ma.group(3) or not mb.group(3)


def _loop_invariant(hlo, loop, k: int) -> bool:
    """Whether a while loop's body hands element `k` of its tuple on unchanged."""
    body = hlo.computations.get(loop.body or "")
    root = body.root if body is not None else None
    carried = hlo.operand(root, k) if root is not None and root.opcode == "tuple" else None
    while carried is not None and carried.opcode == "copy":
        carried = hlo.operand(carried, 0)
    return (carried is not None and carried.opcode == "get-tuple-element" and carried.index == k
            and hlo.operand(carried, 0) is not None and hlo.operand(carried, 0).opcode == "parameter")


def _table_source(hlo, instr) -> str | None:
    """The constant a kernel's operand is, followed back through copies (a prefetch into VMEM is
    copy-start/copy-done), bitcasts, tuples and the loop-invariant elements of a while loop (a
    scanned layer's kernel reads its tables through the loop's tuple); None where it is not one."""
    pending: list[int] = []  # tuple elements still to take, innermost last
    for _ in range(64):
        if instr is None:
            return None
        source = hlo.operand(instr, 0) if instr.operands else None
        if instr.opcode in _COPIES and source is not None:
            instr = source
        elif instr.opcode == "bitcast" and source is not None and _same_order(instr.shape, source.shape):
            instr = source
        elif instr.opcode == "get-tuple-element" and instr.index is not None:
            pending.append(instr.index)
            instr = hlo.operand(instr, 0)
        elif instr.opcode == "tuple" and pending:
            instr = hlo.operand(instr, pending.pop())
        elif instr.opcode == "parameter" and pending:  # inside a loop's body: the loop's init, if unchanged
            loops = [c for c, key in hlo.callers.get(instr.computation, []) if key == "body" and c.opcode == "while"]
            if len(loops) != 1 or not _loop_invariant(hlo, loops[0], pending[-1]):
                return None
            instr = hlo.operand(loops[0], 0)
        elif instr.opcode == "while" and pending:  # a loop's result: its init, if the body leaves it as is
            if not _loop_invariant(hlo, instr, pending[-1]):
                return None
            instr = hlo.operand(instr, 0)
        elif instr.opcode == "constant" and not pending:
            return instr.name
        else:
            return None
    return None


def _kernel_works(report, hlo, run: Path) -> dict:
    """{op name: (its instruction, its KernelWork, whether the kernel gives a cost estimate of its own)}
    for the step's ops of Pallas kernels whose body has matmuls (`analyze/compile/kernel_body.py`); the
    values of their operands that are constants of the step (the tables, a grid size) from the module's
    `kernel_tables.json` or the HLO's own text."""
    from tpudiag.analyze.compile.kernel_body import kernel_body, kernel_work
    from tpudiag.analyze.hlo.cost import has_cost_estimate

    m = report.modules[0]
    tables_file = Path(run) / rundir.MODULES_DIR / Path(m.artifacts).name / rundir.KERNEL_TABLES
    try:
        tables = json.loads(tables_file.read_text()) if tables_file.is_file() else {}
    except (OSError, ValueError):
        tables = {}
    tables = {k: v for k, v in tables.items() if isinstance(v, list) and all(type(x) is int for x in v)} \
        if isinstance(tables, dict) else {}
    out, memo = {}, {}
    for o in m.ops:
        instr = hlo.instruction(o.name, o.computation) if o.opcode == "custom-call" else None
        if instr is None or instr.custom_call_target != "tpu_custom_call":
            continue
        body = kernel_body(instr.backend_config)
        if body is None:
            continue
        values = []
        for k in range(len(instr.operands)):
            source = _table_source(hlo, hlo.operand(instr, k))
            values.append(tables.get(source or "") or _constant_values(hlo, source))
        key = (body, tuple(tuple(v) if v else None for v in values))
        if key not in memo:
            memo[key] = kernel_work(body, values)
        if memo[key] is not None and memo[key].flops > 0:
            out[o.name] = (instr, memo[key], has_cost_estimate(instr))
    return out


def _constant_values(hlo, name: str | None) -> list[int] | None:
    """The values of an integer constant the optimized HLO prints whole (a scalar, a short table);
    None where it elides them or is not one."""
    instr = hlo.instruction(name) if name else None
    m = re.match(r"([su](?:8|16|32|64)|pred)\[([\d,]*)\]", instr.shape) if instr is not None else None
    if not m or "..." in instr.literal:
        return None
    values = [int(v) for v in re.findall(r"-?\d+", instr.literal.replace("true", "1").replace("false", "0"))]
    return values if len(values) == math.prod(int(d) for d in m.group(2).split(",") if d) else None


def _kernel_bodies(report, works: dict):
    """(the report with each Pallas kernel that gives no cost estimate of its own timed by the MXU
    work of its body over the grid steps that run it, a finding or None). Such a kernel's op counts
    0 FLOPs (JAX's splash attention gives none); `works` is `_kernel_works`. An op takes the longer of
    that at the MXU peak and its time so far."""
    from dataclasses import replace

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
    note = (f"{len(works)} Pallas kernel op(s) with no cost estimate of their own: MXU work read from the kernel's "
            f"body over the grid steps that run it, at the MXU peak (+{added:.4g} s per step; softmax and other "
            "vector work not counted)"
            + (f"; {unresolved} whose grid steps depend on tables that could not be evaluated (values not known, "
               "or too many steps): every step counted" if unresolved else ""))
    return _with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note


def _kernel_key(hlo, instr) -> tuple:
    """What makes two kernel ops one probe: the body, the operand shapes and the result shape."""
    shapes = tuple(hlo.operand(instr, k).shape if hlo.operand(instr, k) else "" for k in range(len(instr.operands)))
    return (instr.backend_config.get("custom_call_config", {}).get("body"), shapes, instr.shape)


def _first_line(text: str | None, limit: int = 300) -> str:
    """The gist of a compiler's message: its first line that says something, cut to `limit`."""
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    line = re.sub(r"[FEWI]\d{4} [\d:.]+\s+\d+ \S+\] ", "", lines[0]) if lines else "no reason given"  # glog's prefix
    return line if len(line) <= limit else line[:limit - 3] + "..."


# Wall seconds all kernel step probes of a step may take, and the most kinds of grid step (the values
# of the branches on its tables) probed in one kernel.
KERNEL_PROBE_BUDGET_S = 600.0
KERNEL_PROBE_SIGNATURES = 4


def _probe_kernels(report, hlo, works: dict, run: Path, target, limits, progress=None):
    """(the report with the step's Pallas kernels whose matmuls their tables gate timed by the
    compiler's cycles for their grid steps, a finding or None). Such a kernel's own static profile does
    not follow its branches on table values (splash attention's block masks), and its own cost
    estimate, where it gives one, counts FLOPs. So each distinct kernel whose every matmul branch reads
    a table (`KernelWork.table_gated`: not one gated on grid ids alone), its steps evaluated from its
    tables, is compiled alone with the static profile into `RUN/estimate/kernel_probes/`, for each
    kind of step it runs (the values its table branches take, `KernelWork.signatures`): twice, its
    body rewritten by `kernel_body.step_probe` (the grid cut to STEP_PROBE steps along its last axis,
    the branches set to that kind's values). The difference is one such step's cycles; summed over the
    steps of each kind (over the TensorCores of a megacore device, where the kernel has parallel grid
    steps for each), it is the op's time where longer than its time so far. The budget is checked
    before each kind's pair of probes."""
    from dataclasses import replace

    from tpudiag.analyze.compile.kernel_body import STEP_PROBE, step_probe

    probed_works = {n: (i, w) for n, (i, w, _) in works.items() if w.resolved and w.signatures and w.table_gated}
    if not probed_works:
        return report, None
    m = report.modules[0]
    pdir, probe_limits = _probe_setup(run, "kernel_probes", limits)
    if progress:
        progress(f"timing {len(probed_works)} Pallas kernel op(s) by the compiler's cycles for their grid steps, "
                 f"each kernel alone (at most {KERNEL_PROBE_BUDGET_S:.0f} s)")
    clock = report.target.clock_hz
    flops_per_cycle = report.target.peak_bf16_flops_per_s / clock
    # a megacore device (v5p) splits a kernel's `parallel` grid axes over its TensorCores; a probe, its
    # other axes cut to 1, runs on one of them
    cores = max(1, target.chip.tensorcores_per_chip // target.chip.devices_per_chip)
    step_cycles, names, status, reasons = {}, {}, {}, {}  # (kernel, kind): one step's cycles; op: why not timed
    t0 = time.monotonic()
    for name, (instr, work) in probed_works.items():
        key = _kernel_key(hlo, instr)
        todo = [sig for sig, _ in work.signatures if (key, sig) not in step_cycles]
        if len(work.signatures) > KERNEL_PROBE_SIGNATURES:
            status[name] = "short"
            continue
        texts = {sig: [step_probe(instr.backend_config, list(key[1]), instr.shape, n, work, sig) for n in STEP_PROBE]
                 for sig in todo}
        if any(None in pair for pair in texts.values()):  # a last axis too short, or a body not rewritten
            status[name] = "short"
            continue
        pname = names.setdefault(key, f"kprobe{len(names):02d}")
        for sig, pair in texts.items():
            if time.monotonic() - t0 > KERNEL_PROBE_BUDGET_S:
                status[name] = "skipped"
                break
            tag = f"{pname}-kind{sum(1 for k, _ in step_cycles if k == key)}"
            cycles = []
            for n, text in zip(STEP_PROBE, pair):
                path = pdir / f"{tag}-{n}steps.mlir"
                path.write_text(text)
                pm = _compile_alone(path, f"{tag}-{n}steps", "mlir", pdir, target, probe_limits)
                got = [o.estimated_cycles for o in pm.ops
                       if o.opcode == "custom-call" and o.cycles_source == "static_profile" and o.estimated_cycles]
                if len(got) != 1:
                    why = pm.error if not pm.ok else pm.static_profile if pm.static_profile != "ok" else "no cycles"
                    reasons.setdefault(f"{tag}-{n}steps", _first_line(why))
                    break
                cycles.append(got[0])
            ok = len(cycles) == 2 and cycles[1] > cycles[0]
            if len(cycles) == 2 and not ok:
                reasons.setdefault(tag, f"{STEP_PROBE[1]} steps not slower than {STEP_PROBE[0]}")
            step_cycles[(key, sig)] = (cycles[1] - cycles[0]) / (STEP_PROBE[1] - STEP_PROBE[0]) if ok else None
            if not ok:
                break
    ops, added, slower, ratios, timed_keys = [], 0.0, 0, [], set()
    for o in m.ops:
        instr, work = probed_works.get(o.name, (None, None))
        if instr is None or o.name in status:
            ops.append(o)
            continue
        key = _kernel_key(hlo, instr)
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
        new = _at_cycles(o, round(cycles), clock, "kernel_probe",
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
    note = (head
            + (f"; {failed} kernel op(s) whose probes gave no cycles" + (f" ({first[0]}: {first[1]})" if first else "")
               if failed else "")
            + (f"; {short} kernel op(s) not probed (a grid's last axis of {STEP_PROBE[1]} steps or fewer, more than "
               f"{KERNEL_PROBE_SIGNATURES} kinds of step, or a body not rewritten)" if short else "")
            + (f"; {skipped} kernel op(s) not probed: the probes' {KERNEL_PROBE_BUDGET_S:.0f} s were spent"
               if skipped else "")
            + ("; those keep their time" if failed or short or skipped else ""))
    return _with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note
