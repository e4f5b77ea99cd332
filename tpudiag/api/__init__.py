"""The Python entry points a notebook, a CI script or the command line calls: one per workflow.

    import tpudiag.api as td
    result = td.profile("train.py", ["--steps", "5"])      # runs it, writes the run directory
    report = td.load_report("tpudiag-runs/2026...-train")   # re-analyzes a run (or a bare .xplane.pb)
    report.to_dict()["breakdown"]

Each module wires capture -> parse -> analyze for one command and does the file I/O that
`analyze/` must not: `profiling` (profile, profile --target, report), `compile` (compile, the
Python-function compile, the shadow compile of a profile run), `hlo` (fusions, hlo-diff),
`compare`, `export`, `kernels` (kernels bench). Every run directory they write goes through
`capture.rundir.RunDir`.
"""

import importlib

# name -> the submodule that defines it. Loaded on first use (PEP 562), so that `from tpudiag import
# api` is instant and `api.profile` starts the program before pandas and the analysis stack load.
_WHERE = {
    "load_for_compare": "compare", "compare_runs": "compare",
    "TPU_DIR": "compile", "CompileResult": "compile", "analyze_compile_run": "compile", "compile_run_artifacts": "compile", "compile_function": "compile",
    "compile_inputs": "compile", "compile_target": "compile", "module_artifacts": "compile",
    "shadow_compile_run": "compile",
    "perfetto_export": "export",
    "LoadedModule": "hlo", "fusion_reports": "hlo", "fusions_list": "hlo", "hlo_diff": "hlo",
    "load_hlo_modules": "hlo", "write_diff_html": "hlo",
    "kernels_bench": "kernels", "kernels_list": "kernels", "kernel_card": "kernels", "kernels_verify": "kernels",
    "specs_named": "kernels",
    "ProfileResult": "profiling", "analyze_run": "profiling", "analyze_xplane": "profiling", "empty_trace": "profiling",
    "finish_capture": "profiling", "hlo_index": "profiling", "hlo_modules": "profiling", "html_report": "profiling",
    "load_report": "profiling", "profile": "profiling", "write_html": "profiling", "write_report": "profiling",
    "validate": "validate",
    "estimate": "estimate",
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
