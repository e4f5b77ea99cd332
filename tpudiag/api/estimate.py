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


def parse_entry(entry: str) -> tuple[Path, str]:
    """`FILE.py:FUNC` -> (file, function name), checked."""
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
    spec = out_dir / "spec.json"
    spec.write_text(_spec(path, func, argv, target, mesh, out_dir))
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"))
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
    return f"{path}:{func}: lowering failed (exit {code})"


def estimate(entry: str, target_text: str, argv=(), out=None, *, mesh: str | None = None,
             static_profile: bool = False, limits=None, compile_timeout_s: float = 1800.0, progress=None):
    """Estimate one step of `entry` (FILE.py:FUNC) on `target_text`. Returns (run dir, EstimateReport).
    `compile_timeout_s`: wall seconds the step's compile may take (a 32-layer 8B step for 256 chips
    takes minutes on a 2-core machine)."""
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
    size = 1
    for _, n in axes:
        size *= n
    if axes and size != target.devices:
        shown = ",".join(f"{a}={n}" for a, n in axes)
        raise InputError(f"--mesh {shown} has {size} devices; {target.topology} has {target.devices}: the axes "
                         "must multiply to the slice's device count")
    require_libtpu()
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(path))
    libtpu_args = os.environ.get("LIBTPU_INIT_ARGS") or None
    source = {"input": f"{path}:{func}", "kind": "estimate", "argv": list(argv), "mesh": mesh,
              "libtpu_init_args": libtpu_args}
    if progress:
        progress(f"lowering {path}:{func} for {target.topology} ({target.devices} devices)")
    with tempfile.TemporaryDirectory(prefix="tpudiag-estimate-") as tmp:
        failed = _lower_in_worker(path, func, list(argv), target, axes, Path(tmp))  # no run directory yet
        with RunDir(run, "compile", rundir.COMPILE_SUBDIRS + (rundir.ESTIMATE_DIR,), program=f"{path}:{func}",
                    argv=[f"{path}:{func}", *argv], target=target.to_dict(), static_profile=static_profile,
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
            limits = replace(limits or Limits(), compile_timeout_s=compile_timeout_s)
            step = ModuleInput(name="step", path=lowered_dir / "step.mlir", kind="mlir")
            report = compile_inputs([step], run, target, static_profile=static_profile, jobs=1, limits=limits,
                                    source=source)
            report = _write_compile_report(report, rd)
            est = build_estimate(report, lowered, program=f"{path}:{func}", argv=list(argv),
                                 libtpu_init_args=libtpu_args,
                                 artifacts={"run_dir": str(run), "estimate": rundir.ESTIMATE_REPORT,
                                            "compile_report": rundir.REPORT,
                                            "lowered": f"{rundir.ESTIMATE_DIR}/step.mlir"})
            rd.write_text(rundir.ESTIMATE_REPORT, render(est, "json"))
            rd.write_text(rundir.ESTIMATE_MD, render(est, "md"))
            rd.finish(est.status == "ok", reason=est.reason)
    return run, est
