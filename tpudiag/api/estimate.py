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
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpudiag.api.estimate_kernels import _kernel_bodies, _kernel_works, _probe_kernels
from tpudiag.api.estimate_ops import _at_cycles, _compile_alone, _probe_setup, _with_step
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
                       "devices": target.model_devices, "mesh": mesh, "out_dir": str(out_dir)})


def _lower_in_worker(path: Path, func: str, argv: list[str], target, mesh, out_dir: Path) -> str | None:
    """Run the worker into `out_dir`. None when it lowered the step; the one-line error when FUNC or
    jax failed (the caller keeps the log in the run); an `InputError` when the file or FUNC is not
    what estimate needs (`estimate_worker.Refused`)."""
    from tpudiag.capture import workers
    from tpudiag.capture.tpu_compile import quiet_libtpu

    spec = out_dir / "spec.json"
    spec.write_text(_spec(path, func, argv, target, mesh, out_dir))
    env = quiet_libtpu(dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu",
                            TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1")))
    with open(out_dir / "lower.log", "wb") as log:
        code = workers.run([sys.executable, "-m", "tpudiag.capture.estimate_worker", str(spec)], env=env,
                           stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
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
# Seconds all matmul probes of a step may take (wall); each probe's static profile is cut at
# PROBE_STATIC_S CPU seconds (estimate_ops.py).
PROBE_BUDGET_S = 300.0


def _step_hlo(report, run: Path):
    """The step's optimized HLO, parsed once for the passes below; None when it did not compile."""
    from tpudiag.parse.hlo import read_hlo_file

    m = report.modules[0] if report.modules else None
    if m is None or not m.ok or not m.ops:
        return None
    return read_hlo_file(Path(run) / rundir.MODULES_DIR / Path(m.artifacts).name / rundir.MODULE_HLO)


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
    return _noted(report, ops, changed and (
        f"{changed} op(s) read or write buffers XLA placed in VMEM: their HBM time counts HBM bytes only "
        f"(-{saved:.4g} s per step)"))


def _noted(report, ops, note):
    """(the report with its step's ops replaced and `note` added to its findings, the note), or
    (the report as it was, None) where there is no note."""
    from dataclasses import replace

    if not note:
        return report, None
    m = report.modules[0]
    return _with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, note))), note


def _tiled_hbm(report, hlo):
    """(the report with each HBM-bound op's HBM time scaled by its layout padding, a finding or None):
    bytes as the TPU lays them out in tiles (`memory_space.hbm_padding`), not as the shape counts
    them. On a v5e a rotary fusion over bf16[4,2048,16,32] took 4.7x its logical bytes at HBM
    bandwidth (tpudiag report fixtures/tpu-v5e/llama_train)."""
    from dataclasses import replace

    from tpudiag.analyze.compile.estimate import ASYNC_COPIES
    from tpudiag.analyze.compile.memory_space import hbm_padding

    ops, added, changed = [], 0.0, 0
    for o in report.modules[0].ops:
        instr = hlo.instruction(o.name, o.computation) if o.bound_by == "hbm" and not o.modelled else None
        pad = hbm_padding(hlo, instr) if instr is not None and o.opcode not in ASYNC_COPIES else 1.0
        if pad > 1.0:
            added += o.estimated_s * (pad - 1) * o.runs
            changed += 1
            o = replace(o, estimated_s=round(o.estimated_s * pad, 12), limit=f"{o.limit} x{pad:.2f} tile padding")
        ops.append(o)
    return _noted(report, ops, changed and (
        f"{changed} HBM-bound op(s) move arrays whose TPU layout pads their minor dims to the tile (8 x 128): "
        f"timed at their laid-out bytes (+{added:.4g} s per step)"))


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
             matmul_probes: bool = True, cost_model: bool | None = None, calibration=None):
    """Estimate one step of `entry` (FILE.py:FUNC) on `target_text`. Returns (run dir, EstimateReport).
    `compile_timeout_s`: wall seconds the step's compile may take (a 32-layer 8B step for 256 chips
    takes minutes on a 2-core machine). `matmul_probes`: time the step's compute-bound matmuls by the
    compiler: without the static profile, each distinct one alone with it (`_probe_matmuls`);
    `cost_model` (default: as `matmul_probes`): those no probe times, by the cycles its convolution
    cost model recorded in the step's HLO (`_cost_model_matmuls`, no compile). `calibration`: a
    calibration file, None for the table tpudiag ships for the target's chip (none: the data sheet),
    or False for the data sheet's figures alone."""
    from dataclasses import replace

    from tpudiag.analyze.compile.calibrated import calibrate_ops
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
    if axes and size != target.model_devices:
        shown = ",".join(f"{a}={n}" for a, n in axes)
        where = "one chip has" if target.single_chip else f"{target.topology} has"
        raise InputError(f"--mesh {shown} has {size} devices; {where} {target.model_devices}: the axes "
                         "must multiply to the slice's device count")
    require_libtpu()
    from tpudiag.api.calibrate import load_calibration

    cal = None if calibration is False else load_calibration(calibration, target.chip.name)
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(
        Path(f"maxtext_{model_name}.py") if model_name else path))
    libtpu_args = os.environ.get("LIBTPU_INIT_ARGS") or None
    program = entry if model_name else f"{path}:{func}"
    source = {"input": program, "kind": "estimate", "argv": list(argv), "mesh": mesh,
              "libtpu_init_args": libtpu_args,
              "calibration": None if cal is None else f"{cal.chip} {cal.date} ({calibration or 'shipped'})"}
    if progress:
        progress(f"lowering {program} for " + (f"one chip of {target.topology} ({target.model_devices} device)"
                                               if target.single_chip else
                                               f"{target.topology} ({target.devices} devices)"))
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
                report, _ = _tiled_hbm(report, hlo)
                works = _kernel_works(report, hlo, run)
                report, _ = _kernel_bodies(report, works)
                probed = frozenset()
                if matmul_probes and not static_profile and target.chip.name in PROBED_CHIPS:
                    report, _ = _probe_kernels(report, hlo, works, run, target, limits or Limits(), progress)
                    report, _, probed = _probe_matmuls(report, hlo, run, target, limits or Limits(), progress)
                if matmul_probes if cost_model is None else cost_model:
                    report, _ = _cost_model_matmuls(report, hlo, probed)
                report, _ = _grouped_matmul_tiles(report, hlo)
                if cal is not None:
                    report, _ = calibrate_ops(report, hlo, cal, target.chip)
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
