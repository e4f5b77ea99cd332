"""`tpudiag estimate FILE.py:FUNC --target v6e-256`: a whole step at scale, estimated without
running it. FUNC builds the step on the slice's mesh (a worker lowers it: `capture/estimate_worker.py`),
the lowered module is compiled like any `tpudiag compile` input, and the compile report becomes the
estimate (`analyze/compile/estimate.py`).

Writes a compile run directory plus `RUN/estimate/` (the lowered module, its log) and
`RUN/estimate.json`. Returns the `EstimateReport`. FUNC is looked up, called and lowered before the
run directory exists (the worker writes into a temporary directory, moved into the run after):
a FUNC that is missing, not callable as FUNC(argv, mesh) or returns the wrong thing is a one-line
error with nothing written; a FUNC that raises is a failed run with its log.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpudiag.capture import rundir
from tpudiag.capture.rundir import RunDir
from tpudiag.errors import InputError, ProgramFailed
from tpudiag.outputs import check_run_dir

_MESH_AXIS = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\d+)$")


MAXTEXT_PREFIX = "maxtext:"
_MAXTEXT_STEP = Path(__file__).resolve().parents[1] / "capture" / "maxtext_step.py"


def maxtext_model(entry: str) -> str | None:
    """`maxtext:MODEL` -> MODEL (MaxText's model config name); None for a FILE.py:FUNC entry."""
    if not str(entry).startswith(MAXTEXT_PREFIX):
        return None
    model = str(entry)[len(MAXTEXT_PREFIX):]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", model):
        raise InputError(f"{entry}: expected maxtext:MODEL, a model config MaxText ships (maxtext:llama3.1-8b)")
    return model


def parse_entry(entry: str) -> tuple[Path, str]:
    """`FILE.py:FUNC` -> (file, function name), checked. `maxtext:MODEL` -> the bundled adapter
    that builds MaxText's own step (`capture/maxtext_step.py`)."""
    if maxtext_model(entry) is not None:
        return _MAXTEXT_STEP, "step"
    file, sep, func = str(entry).rpartition(":")
    if not sep or not file or not func:
        raise InputError(f"{entry}: expected FILE.py:FUNC (the function that returns the step)")
    path = Path(file)
    if not path.is_file():
        raise InputError(f"{file}: no such file")
    if path.suffix != ".py":
        raise InputError(f"{file}: not a Python file (expected FILE.py:FUNC)")
    if not func.isidentifier():
        raise InputError(f"{entry}: {func!r} is not a function name")
    return path, func


def parse_mesh(text: str | None) -> list[tuple[str, int]]:
    """`fsdp=64,tensor=4` -> [("fsdp", 64), ("tensor", 4)]; None or "" -> [] (every device on fsdp)."""
    if not text:
        return []
    out = []
    for part in text.split(","):
        m = _MESH_AXIS.match(part.strip())
        if not m or int(m.group(2)) < 1:
            raise InputError(f"--mesh {text}: expected axis=size pairs separated by commas (fsdp=64,tensor=4)")
        if m.group(1) in (a for a, _ in out):
            raise InputError(f"--mesh {text}: axis {m.group(1)} given twice")
        out.append((m.group(1), int(m.group(2))))
    return out


def _spec(path: Path, func: str, argv: list[str], target, mesh, out_dir: Path) -> str:
    return json.dumps({"file": str(path.resolve()), "func": func, "argv": list(argv), "topology": target.topology,
                       "mesh": mesh, "out_dir": str(out_dir)})


def _lower_in_worker(path: Path, func: str, argv: list[str], target, mesh, out_dir: Path) -> str | None:
    """Run the worker into `out_dir`. None when it lowered the step; the one-line error when FUNC or
    jax failed (the caller keeps the log in the run); an `InputError` when the file or FUNC is not
    what estimate needs (`estimate_worker.Refused`)."""
    from tpudiag.capture.tpu_compile import quiet_libtpu

    spec = out_dir / "spec.json"
    spec.write_text(_spec(path, func, argv, target, mesh, out_dir))
    env = quiet_libtpu(dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu",
                            TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1")))
    with open(out_dir / "lower.log", "wb") as log:
        code = subprocess.run([sys.executable, "-m", "tpudiag.capture.estimate_worker", str(spec)], env=env,
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if code == 0:
        return None
    err = out_dir / "error.json"
    if err.is_file():
        doc = json.loads(err.read_text())
        if doc.get("kind") == "input":
            raise InputError(doc["error"])
        return doc["error"]
    # FUNC exited (an argparse error in the program's own arguments): its last words say why
    lines = [x.strip() for x in (out_dir / "lower.log").read_text(errors="replace").splitlines() if x.strip()]
    said = next((x for x in reversed(lines) if not x.startswith(("W0", "I0", "E0", "WARNING"))), "")
    return f"{path}:{func}: lowering failed (exit {code})" + (f": {said[:300]}" if said else "")


# Chips whose static cycle model was checked against the bf16 peak (a 4096^3 matmul, loops stepped
# through: 94-97% on v5e, v5p and v6e, 93% on TPU7x at its derived clock: targets.py); v4 has no
# static profile.
PROBED_CHIPS = ("v5e", "v5p", "v6e", "tpu7x")
PROBES_MAX = 16
# Seconds all probes of a step may take (wall), and CPU seconds one probe's static profile may take:
# a probe is one matmul, most profile in seconds; a few (a weight gradient as a windowed
# convolution) run for minutes, and those take the convolution cost model (`_cost_model_matmuls`).
PROBE_BUDGET_S = 300.0
PROBE_STATIC_S = 45.0


def _with_step(report, m):
    """`report` with its first module (the step) replaced by `m`, ops ranked by time x runs."""
    from dataclasses import replace

    m = replace(m, ops=tuple(sorted(m.ops, key=lambda o: (-o.total_s, o.name))))
    return replace(report, modules=(m, *report.modules[1:]))


def _step_hlo(report, run: Path):
    """The step's optimized HLO, parsed once for the passes below; None when it did not compile."""
    from tpudiag.parse.hlo import read_hlo_file

    m = report.modules[0] if report.modules else None
    if m is None or not m.ok or not m.ops:
        return None
    return read_hlo_file(Path(run) / rundir.MODULES_DIR / Path(m.artifacts).name / rundir.MODULE_HLO)


def _at_cycles(op, cycles: int, clock: float, source: str, limit: str):
    """`op` timed by the compiler's `cycles` where they are longer than its time; else `op` itself."""
    from dataclasses import replace

    if cycles / clock <= op.estimated_s:
        return op
    return replace(op, estimated_s=round(cycles / clock, 12), estimated_cycles=cycles, bound_by="static_cycles",
                   cycles_source=source, limit=limit)


def _probe_setup(run: Path, subdir: str, limits):
    """(the directory a pass's probes go in, created; their limits): the static profile stepped
    through, not fast-forwarded (fast-forwarding inflates a large matmul's cycles: tpu_compile.Limits),
    each within PROBE_STATIC_S CPU seconds, and no LLO bundle dump (only the static profile is read)."""
    from dataclasses import replace

    pdir = Path(run) / rundir.ESTIMATE_DIR / subdir
    pdir.mkdir(parents=True, exist_ok=True)
    return pdir, replace(limits, static_timeout_s=min(limits.static_timeout_s, PROBE_STATIC_S), scale_with_size=False,
                         fast_forward=False, llo_dump=False)


def _compile_alone(path: Path, name: str, kind: str, pdir: Path, target, limits):
    """One probe module compiled for `target` with the static profile: its `ModuleReport`."""
    from tpudiag.api.pipeline import compile_inputs
    from tpudiag.capture.tpu_compile import ModuleInput

    return compile_inputs([ModuleInput(name=name, path=path, kind=kind)], pdir, target, static_profile=True, jobs=1,
                          limits=limits, suggestions=False, group_setup=False, with_llo=False).modules[0]


def _probe_matmuls(report, hlo, run: Path, target, limits, progress=None):
    """(the report with the step's compute-bound matmul fusions timed by the compiler's static cycles
    of their probes, a finding or None, the names of the ops a probe timed). Each distinct matmul is
    compiled alone with the static profile (`analyze/compile/matmul_probe.py`) into
    `RUN/estimate/probes/`; an op takes its probe's time where that is longer than its roofline time."""
    from dataclasses import replace

    from tpudiag.analyze.compile.matmul_probe import select_probes

    m = report.modules[0]
    probes = select_probes(hlo, m.ops, PROBES_MAX)
    if not probes:
        return report, None, frozenset()
    pdir, probe_limits = _probe_setup(run, "probes", limits)
    if progress:
        progress(f"timing up to {len(probes)} distinct matmul(s) with the compiler's static profile, each alone "
                 f"(at most {PROBE_BUDGET_S:.0f} s)")
    clock = report.target.clock_hz
    seconds, missing, skipped = {}, 0, 0
    t0 = time.monotonic()
    for i, p in enumerate(probes):
        if time.monotonic() - t0 > PROBE_BUDGET_S:  # the rest: the convolution cost model
            skipped = len(probes) - i
            break
        path = pdir / f"probe{i:02d}-{p.key}.hlo.txt"
        path.write_text(p.text)
        pm = _compile_alone(path, f"probe{i:02d}", "hlo", pdir, target, probe_limits)
        cycles = max((o.estimated_cycles or 0 for o in pm.ops if o.flops > 0 and o.cycles_source == "static_profile"),
                     default=0)
        if not cycles:
            missing += 1
            continue
        for name in p.ops:
            seconds[name] = (round(cycles * p.scale), pm.name)
    ops, added, slower = [], 0.0, 0
    for o in m.ops:
        got = seconds.get(o.name)
        new = _at_cycles(o, got[0], clock, "matmul_probe", f"compiler cycles, alone ({got[1]})") if got else o
        if new is not o:
            added += (new.estimated_s - o.estimated_s) * o.runs
            slower += 1
        ops.append(new)
    timed = len(probes) - missing - skipped
    note = (f"{len(seconds)} compute-bound matmul op(s) ({timed} distinct) timed by the TPU compiler's "
            f"static cycles, each compiled alone (estimate/probes/): {slower} slower than the MXU peak, +{added:.4g} s "
            f"per step" + (f"; {missing} probe(s) gave no cycles" if missing else "")
            + (f"; {skipped} not probed within {PROBE_BUDGET_S:.0f} s" if skipped else "")
            + ("; their ops take the compiler's convolution cost model where the step's HLO has it"
               if missing or skipped else ""))
    return _with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note, frozenset(seconds)


def _cost_model_matmuls(report, hlo, probed=frozenset()):
    """(the report with each compute-bound matmul that no probe timed taken at the cycles the TPU
    compiler's convolution cost model recorded for it in the step's HLO, a finding or None). An op
    takes them where they are longer than its roofline time; ops a probe or the step's static profile
    timed keep those cycles."""
    from dataclasses import replace

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
        new = _at_cycles(o, cycles, clock, "cost_model", "compiler cycles, its convolution cost model") if cycles else o
        if new is not o:
            added += (new.estimated_s - o.estimated_s) * o.runs
            slower += 1
        ops.append(new)
    if not found:
        return report, None
    note = (f"{found} compute-bound matmul op(s) with no static cycles timed by the TPU compiler's convolution "
            f"cost model (the cycles of the tiling it chose, in the step's HLO): {slower} slower than the MXU peak, "
            f"+{added:.4g} s per step")
    return _with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note


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
    before each kernel's probes."""
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
        if texts and time.monotonic() - t0 > KERNEL_PROBE_BUDGET_S:
            status[name] = "skipped"
            continue
        pname = names.setdefault(key, f"kprobe{len(names):02d}")
        for sig, pair in texts.items():
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


def _hbm_outside_vmem(report, hlo):
    """(the report with each HBM-bound op's time taken from the bytes it moves in HBM only, a
    finding or None): bytes in VMEM (`analyze/compile/memory_space.py`) are left out, and the op
    takes the longer of that and its compute time."""
    from dataclasses import replace

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
    if not changed:
        return report, None
    note = (f"{changed} op(s) read or write buffers XLA placed in VMEM: their HBM time counts HBM bytes only "
            f"(-{saved:.4g} s per step)")
    return _with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note


def _grouped_matmul_tiles(report, hlo):
    """(the report with each megablox-style grouped matmul timed over the row tiles it visits, a
    finding or None): its grid is sized at run time by the routing, and its own cost estimate
    counts the useful FLOPs only (`analyze/compile/grouped_matmul.py`: balanced routing). Where the
    kernel records its tiles, a gmm's bytes are what its pipeline moves, not its own estimate; an
    op the static profile timed keeps that time where it is longer."""
    from dataclasses import replace

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
    note = (f"{len(factors)} grouped matmul(s) on a grid sized by the routing: MXU work counted over the row "
            f"tiles they visit with balanced routing, {min(factors):.3g}x-{max(factors):.3g}x their useful FLOPs"
            + (f"; {rebytes} with the kernel's tiles in its metadata take the bytes its pipeline moves"
               if rebytes else "") + f" ({delta:+.4g} s per step)")
    return _with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note


def _host_offload(report, hlo, target):
    """(the report with a finding on the step's transfers to and from host memory, their `HostTime`
    or None): activation offload, timed over the chip's host link where the chip table has one
    (`analyze/compile/host_transfers.py`). Run after every pass that changes op times: the compute
    between a transfer's start and done is what hides it."""
    from dataclasses import replace

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
        return _with_step(report, replace(m, findings=(*m.findings, note))), None
    per_device = link * target.chips / target.devices
    collectives = {c.name for c in m.collectives}
    ops = [(o.name, o.computation, o.estimated_s, o.runs) for o in m.ops if o.name not in collectives]
    ht = host_time(hlo, transfers, ops, per_device)
    note = (f"{moved}: {ht.link_s:.4g} s on the host link at {per_device / 1e9:.3g} GB/s each way per device, "
            f"{ht.exposed_s:.4g} s of it exposed (the rest under the compute scheduled beside it)")
    return _with_step(report, replace(m, findings=(*m.findings, note))), ht


def _peak_buffers(run: Path) -> list[dict]:
    """The step's largest buffers at its HBM peak; none when the compile left no live-range dump
    (a compile that failed before scheduling)."""
    from tpudiag.analyze.compile.peak_buffers import peak_buffers_of_run
    from tpudiag.errors import TpudiagError

    try:
        return peak_buffers_of_run(run)  # names as in XLA's dump, which the live ranges use
    except (TpudiagError, OSError):
        return []


def estimate(entry: str, target_text: str, argv=(), out=None, *, mesh: str | None = None,
             static_profile: bool = False, limits=None, compile_timeout_s: float = 1800.0, progress=None,
             matmul_probes: bool = True, cost_model: bool | None = None):
    """Estimate one step of `entry` (FILE.py:FUNC) on `target_text`. Returns (run dir, EstimateReport).
    `compile_timeout_s`: wall seconds the step's compile may take (a 32-layer 8B step for 256 chips
    takes minutes on a 2-core machine). `matmul_probes`: time the step's compute-bound matmuls by the
    compiler: without the static profile, each distinct one alone with it (`_probe_matmuls`);
    `cost_model` (default: as `matmul_probes`): those no probe times, by the cycles its convolution
    cost model recorded in the step's HLO (`_cost_model_matmuls`, no compile)."""
    from dataclasses import replace

    from tpudiag.analyze.compile.estimate import build_estimate
    from tpudiag.api.compile import _write_compile_report
    from tpudiag.api.pipeline import compile_inputs
    from tpudiag.capture.tpu_compile import Limits, ModuleInput
    from tpudiag.report.registry import render
    from tpudiag.targets import require_libtpu, resolve_target

    path, func = parse_entry(entry)
    target = resolve_target(target_text)
    axes = parse_mesh(mesh)
    model_name = maxtext_model(entry)
    if model_name is not None:
        from tpudiag.capture.maxtext_step import maxtext_topology, split_overrides

        if axes:
            raise InputError(f"--mesh: {entry} builds MaxText's own mesh from its settings; pass "
                             "ici_fsdp_parallelism=... (and the other ici_*/dcn_* keys) after --")
        if target.chip.name == "v4":  # MaxText compiles v4 as megacore (one device a chip); TPU7x as two a chip
            target = target.megacore()
        argv = [f"model_name={model_name}",
                f"compile_topology={maxtext_topology(target.chip.name, target.chips, target.chip.tensorcores_per_chip)}",
                *split_overrides(list(argv))]
    size = 1
    for _, n in axes:
        size *= n
    if axes and size != target.devices:
        shown = ",".join(f"{a}={n}" for a, n in axes)
        raise InputError(f"--mesh {shown} has {size} devices; {target.topology} has {target.devices}: the axes "
                         "must multiply to the slice's device count")
    require_libtpu()
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(
        Path(f"maxtext_{model_name}.py") if model_name else path))
    libtpu_args = os.environ.get("LIBTPU_INIT_ARGS") or None
    program = entry if model_name else f"{path}:{func}"
    source = {"input": program, "kind": "estimate", "argv": list(argv), "mesh": mesh,
              "libtpu_init_args": libtpu_args}
    if progress:
        progress(f"lowering {program} for {target.topology} ({target.devices} devices)")
    with tempfile.TemporaryDirectory(prefix="tpudiag-estimate-") as tmp:
        failed = _lower_in_worker(path, func, list(argv), target, axes, Path(tmp))  # no run directory yet
        with RunDir(run, "compile", rundir.COMPILE_SUBDIRS + (rundir.ESTIMATE_DIR,), program=program,
                    argv=[program, *argv], target=target.to_dict(), static_profile=static_profile,
                    source=source) as rd:
            lowered_dir = run / rundir.ESTIMATE_DIR
            for f in Path(tmp).iterdir():
                shutil.move(f, lowered_dir / f.name)
            (lowered_dir / "spec.json").write_text(_spec(path, func, list(argv), target, axes, lowered_dir))
            if failed:  # FUNC or jax raised: a failed run that keeps the worker's log
                raise ProgramFailed(f"{failed} (log: {lowered_dir / 'lower.log'})", 1)
            lowered = json.loads((lowered_dir / "lowered.json").read_text())
            if progress:
                progress(f"compiling the step for {target.topology}")
            # No LLO bundle dump: the estimate reads none of it, and a large step's is hundreds of MB.
            step_limits = replace(limits or Limits(), compile_timeout_s=compile_timeout_s, llo_dump=False)
            step = ModuleInput(name="step", path=lowered_dir / "step.mlir", kind="mlir")
            report = compile_inputs([step], run, target, static_profile=static_profile, jobs=1, limits=step_limits,
                                    source=source)
            hlo, host = _step_hlo(report, run), None
            if hlo is not None:
                report, _ = _hbm_outside_vmem(report, hlo)
                works = _kernel_works(report, hlo, run)
                report, _ = _kernel_bodies(report, works)
                probed = frozenset()
                if matmul_probes and not static_profile and target.chip.name in PROBED_CHIPS:
                    report, _ = _probe_kernels(report, hlo, works, run, target, limits or Limits(), progress)
                    report, _, probed = _probe_matmuls(report, hlo, run, target, limits or Limits(), progress)
                if matmul_probes if cost_model is None else cost_model:
                    report, _ = _cost_model_matmuls(report, hlo, probed)
                report, _ = _grouped_matmul_tiles(report, hlo)
                report, host = _host_offload(report, hlo, target)
            report = _write_compile_report(report, rd)
            est = build_estimate(report, lowered, program=program, argv=list(argv),
                                 libtpu_init_args=libtpu_args,
                                 artifacts={"run_dir": str(run), "estimate": rundir.ESTIMATE_REPORT,
                                            "compile_report": rundir.REPORT,
                                            "lowered": f"{rundir.ESTIMATE_DIR}/step.mlir"},
                                 peak_buffers=_peak_buffers(run), host=host)
            rd.write_text(rundir.ESTIMATE_REPORT, render(est, "json"))
            rd.write_text(rundir.ESTIMATE_MD, render(est, "md"))
            rd.finish(est.status == "ok", reason=est.reason)
    return run, est
