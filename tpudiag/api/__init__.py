"""The Python entry points a notebook, a CI script or the command line calls: one per workflow.

    import tpudiag.api as td
    result = td.profile("train.py", ["--steps", "5"])      # runs it, writes the run directory
    report = td.load_report("tpudiag-runs/2026...-train")   # re-analyzes a run (or a bare .xplane.pb)
    report.to_dict()["breakdown"]

Each module wires capture -> parse -> analyze for one command and does the file I/O that
`analyze/` must not: `runs` (what a path given to a command is: `open_run`, the one dispatcher),
`load` (report), `profiling` (profile, profile --target), `distributed` (profile --processes, a
pod's traces), `pipeline` (the one compile pipeline: compiled modules -> CompileReport), `compile`
(compile, the Python-function compile, the TPU compile of a profile run), `hlo` (fusions,
hlo-diff), `compare`, `export`, `suggest`, `estimate`, `kernels` (kernels list/show/verify/bench),
`tune` (kernels tune, through the sweep engine), `plan`, `validate`. Every run directory they write goes
through `capture.rundir.RunDir`. Imports among
them go one way, with `runs` and `pipeline` at the bottom: no circle (tests/test_layering.py).
"""

import importlib

# name -> the submodule that defines it. Loaded on first use (PEP 562), so that `from tpudiag import
# api` is instant and `api.profile` starts the program before pandas and the analysis stack load.
_WHERE = {
    "load_for_compare": "compare", "compare_runs": "compare",
    "CompileResult": "compile", "compile_function": "compile", "compile_target": "compile",
    "shadow_compile_run": "compile",
    "analyze_compile_run": "pipeline", "compile_inputs": "pipeline", "compile_run_artifacts": "pipeline",
    "module_artifacts": "pipeline",
    "RunHandle": "runs", "open_run": "runs",
    "load_report": "load",
    "perfetto_export": "export",
    "LoadedModule": "hlo", "fusion_reports": "hlo", "fusions_list": "hlo", "hlo_diff": "hlo",
    "load_hlo_modules": "hlo", "write_diff_html": "hlo",
    "kernels_bench": "kernels", "kernels_list": "kernels", "kernel_card": "kernels", "kernels_verify": "kernels",
    "specs_named": "kernels",
    "kernels_tune": "tune",
    "plan": "plan",
    "ProfileResult": "profiling", "analyze_run": "profiling", "analyze_xplane": "profiling", "empty_trace": "profiling",
    "finish_capture": "profiling", "hlo_index": "profiling", "hlo_modules": "profiling", "html_report": "profiling",
    "profile": "profiling", "write_html": "profiling", "write_report": "profiling",
    "validate": "validate",
    "estimate": "estimate",
    "suggest_run": "suggest",
    "analyze_job": "distributed", "analyze_pod": "distributed", "profile_processes": "distributed",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'tpudiag.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tpudiag.api.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
