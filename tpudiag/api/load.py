"""`tpudiag report`: the report of whatever a path is (`runs.open_run` says what), re-built from its
artifacts without re-running or recompiling anything.

Reads a profile run (`profiling.analyze_run`), a compile run (`pipeline.analyze_compile_run`), an
estimate's `estimate.json` or a kernels bench, kernels tune or plan run's `report.json` (as
written), a `profile --processes N` job or a pod's traces (`distributed`), or a bare `.xplane.pb`;
returns its `ProfileReport`, `CompileReport`, `EstimateReport`, `DistributedReport`, `KernelBench`,
`KernelTune` or `Plan`. It does not render or write.
"""

from __future__ import annotations

import json

from tpudiag.api import runs
from tpudiag.errors import InputError


def load_report(target, align: str = "auto"):
    """A run directory (profile, `profile --processes N`, compile or estimate), an xprof log directory
    (several hosts' traces in one session: the cross-process report), or a `.xplane.pb` file.
    `target` is a path or the `RunHandle` a caller opened already."""
    from tpudiag.api.profiling import analyze_run, analyze_xplane
    from tpudiag.parse.xplane import locate_xplane

    run = runs.open_run(target)
    if run.kind == runs.JOB:
        from tpudiag.api.distributed import analyze_job

        return analyze_job(run.path, run.manifest, align=align)
    if run.kind == runs.ESTIMATE:
        from tpudiag.capture.rundir import ESTIMATE_REPORT
        from tpudiag.results.estimate import EstimateReport

        path = run.path / ESTIMATE_REPORT
        return EstimateReport.from_dict(json.loads(path.read_text()), str(path))
    if run.kind == runs.SEARCH:
        return _search_report(run.path)
    if run.kind == runs.COMPILE:
        from tpudiag.api.pipeline import analyze_compile_run

        return analyze_compile_run(run.path, run.manifest)
    if run.kind == runs.PROFILE:
        return analyze_run(run.path, manifest=run.manifest)
    if run.kind == runs.POD:
        from tpudiag.api.distributed import analyze_pod

        return analyze_pod(run.path, list(run.hosts), align=align)
    if run.kind == runs.DIR and not any(run.path.iterdir()):
        raise InputError(f"{run.path}: empty directory (expected a tpudiag run directory or an .xplane.pb)")
    if run.kind != runs.XPLANE:  # a log directory with one trace, or a file that is not one
        run = runs.open_run(locate_xplane(run.path))
    return analyze_run(run.run, run.path) if run.run is not None else analyze_xplane(run.path)


def _search_report(run):
    """A `kernels bench`, `kernels tune` or `plan` run's report.json, as written (its figures came from
    the compile reports and estimates beside it)."""
    from tpudiag.capture.rundir import REPORT
    from tpudiag.errors import ParseError
    from tpudiag.results.kernels import KernelBench
    from tpudiag.results.plan import Plan
    from tpudiag.results.tune import KernelTune

    path = run / REPORT
    if not path.is_file():
        raise InputError(f"{run}: the run has no {REPORT} (it stopped before its report was written)")
    doc = json.loads(path.read_text())
    model = {m.SCHEMA: m for m in (KernelBench, KernelTune, Plan)}.get(doc.get("schema"))
    if model is None:
        raise ParseError(path, f"not a kernels bench, kernels tune or plan report (schema {doc.get('schema')!r})")
    return model.from_dict(doc, str(path))
