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
                       "devices": target.model_devices, "mesh": mesh, "out_dir": str(out_dir)})


def _lower_in_worker(path: Path, func: str, argv: list[str], target, mesh, out_dir: Path) -> str | None:
    """Run the worker into `out_dir`. None when it lowered the step; the one-line error when FUNC or
    jax failed (the caller keeps the log in the run); an `InputError` when the file or FUNC is not
    what estimate needs (`estimate_worker.Refused`)."""
    from tpudiag.capture import workers
    from tpudiag.capture.tpu_compile import tpu_compiler_env

    spec = out_dir / "spec.json"
    spec.write_text(_spec(path, func, argv, target, mesh, out_dir))
    env = tpu_compiler_env(dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu",
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


def _step_hlo(report, run: Path):
    """The step's optimized HLO, parsed once for the passes below; None when it did not compile."""
    from tpudiag.parse.hlo import read_hlo_file

    m = report.modules[0] if report.modules else None
    if m is None or not m.ok or not m.ops:
        return None
    return read_hlo_file(Path(run) / rundir.MODULES_DIR / Path(m.artifacts).name / rundir.MODULE_HLO)


def step_passes(report, hlo, run: Path, target, limits, calibration, *, probes: bool, cost_model: bool,
                progress=None, max_probes: int | None = None) -> list:
    """The passes over the step's compile report, in the order they run (`analyze/compile/passes.py`:
    each `(report, hlo) -> (report, finding)`): HBM time from HBM bytes only, then at the tiles' laid-out
    bytes; Pallas kernels by their body's MXU work; with `probes`, kernels gated by tables and
    compute-bound matmuls timed by probes compiled alone (`estimate_probes.py`, the only passes that
    compile); with `cost_model`, the other matmuls by the compiler's convolution cost model; grouped
    matmuls over the tiles they visit; the chip's `calibration`; last, the host transfers, whose
    finding is their `HostTime` (the compute beside a transfer is what hides it, so every pass that
    changes op times runs first). docs/estimate.md describes each."""
    from tpudiag.analyze.compile.calibrated import calibrate_ops
    from tpudiag.analyze.compile.estimate_passes import (cost_model_matmuls, grouped_matmul_tiles, hbm_outside_vmem,
                                                         host_offload, tiled_hbm)
    from tpudiag.analyze.compile.kernel_passes import kernel_bodies, kernel_works
    from tpudiag.api.estimate_probes import kernel_tables, probe_kernels, probe_matmuls

    works = kernel_works(report, hlo, kernel_tables(report, run))
    probed: set[str] = set()  # the ops a matmul probe timed: the cost model leaves them to it

    def matmul_probes(report, hlo):
        report, note, timed = probe_matmuls(report, hlo, run, target, limits, progress, max_probes)
        probed.update(timed)
        return report, note

    passes = [hbm_outside_vmem, tiled_hbm, lambda report, hlo: kernel_bodies(report, works)]
    if probes:
        passes += [lambda report, hlo: probe_kernels(report, hlo, works, run, target, limits, progress),
                   matmul_probes]
    if cost_model:
        passes.append(lambda report, hlo: cost_model_matmuls(report, hlo, frozenset(probed)))
    passes.append(grouped_matmul_tiles)
    if calibration is not None:
        from importlib.metadata import version

        running = version("jax")
        passes.append(lambda report, hlo: calibrate_ops(report, hlo, calibration, target.chip, running))
    passes.append(lambda report, hlo: host_offload(report, hlo, target))
    return passes


def _copies(report, hlo):
    """The step's asynchronous copies within the chip, timed against the compute in their windows
    (`async_copies.copy_time`), after every pass has set the op times."""
    from tpudiag.analyze.compile.async_copies import copy_time
    from tpudiag.analyze.hlo.loops import loop_runs

    m = report.modules[0]
    collectives = {c.name for c in m.collectives}
    return copy_time(hlo, loop_runs(hlo).runs, [(o.name, o.computation, o.estimated_s, o.runs, o.bound_by, o.opcode)
                                                for o in m.ops if o.name not in collectives])


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
             matmul_probes: bool = True, cost_model: bool | None = None, calibration=None,
             max_probes: int | None = None):
    """Estimate one step of `entry` (FILE.py:FUNC) on `target_text`. Returns (run dir, EstimateReport).
    `compile_timeout_s`: CPU seconds the step's compile may take (a 32-layer 8B step for 256 chips
    takes minutes on a 2-core machine). `matmul_probes`: time the step's compute-bound matmuls by the
    compiler: without the static profile, each distinct one alone with it (`estimate_probes.probe_matmuls`);
    `cost_model` (default: as `matmul_probes`): those no probe times, by the cycles its convolution
    cost model recorded in the step's HLO (`estimate_passes.cost_model_matmuls`, no compile); at most
    `max_probes` probes (default `estimate_probes.PROBES_MAX`), the largest share of the step first. `calibration`: a
    calibration file, None for the table tpudiag ships for the target's chip (none: the data sheet),
    or False for the data sheet's figures alone."""
    from dataclasses import replace

    from tpudiag.analyze.compile.estimate import build_estimate
    from tpudiag.analyze.compile.passes import run_passes
    from tpudiag.api.compile import write_compile_report
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
            hlo, host, copies = _step_hlo(report, run), None, None
            if hlo is not None:
                probes = matmul_probes and not static_profile and target.chip.name in PROBED_CHIPS
                passes = step_passes(report, hlo, run, target, limits or Limits(), cal, probes=probes,
                                     cost_model=matmul_probes if cost_model is None else cost_model,
                                     progress=progress, max_probes=max_probes)
                report, findings = run_passes(report, hlo, passes)
                host = findings[-1]  # the last pass's: the host transfers' HostTime, or None
                copies = _copies(report, hlo)
            report = write_compile_report(report, rd)
            est = build_estimate(report, lowered, program=program, argv=list(argv),
                                 libtpu_init_args=libtpu_args,
                                 artifacts={"run_dir": str(run), "estimate": rundir.ESTIMATE_REPORT,
                                            "compile_report": rundir.REPORT,
                                            "lowered": f"{rundir.ESTIMATE_DIR}/step.mlir"},
                                 peak_buffers=_peak_buffers(run), host=host, copies=copies)
            rd.write_text(rundir.ESTIMATE_REPORT, render(est, "json"))
            rd.write_text(rundir.ESTIMATE_MD, render(est, "md"))
            rd.finish(est.status == "ok", reason=est.reason)
    return run, est
