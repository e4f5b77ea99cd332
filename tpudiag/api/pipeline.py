"""The one compile pipeline: modules compiled for a TPU target (now, or by an earlier run) -> the
compile report. `compile`, `tpudiag.compile(fn)`, `profile --target`, `kernels bench`, `suggest`
and `estimate` all build their `CompileReport` here.

Reads what each compile worker left in its module directory (optimized HLO, static cycle profile,
LLO dump, the input's mesh); returns `ModuleArtifacts` and `CompileReport`s. It neither lowers
(that is `capture/lower.py`) nor creates or writes a run directory (the callers do, through
`RunDir`), nor renders.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tpudiag.capture import rundir
from tpudiag.errors import TpudiagError
from tpudiag.parse.hlo import find_memory_reports, find_optimized_modules, read_hbm_allocated_bytes, read_hlo_file


def module_artifacts(mc, with_llo: bool = True):
    """Parse what one compile worker left in its module directory (`ModuleCompile` -> `ModuleArtifacts`).
    `with_llo=False` skips the LLO bundle dump (slot utilization and bundle counts only; no op time
    depends on it), the slowest artifact to read."""
    from tpudiag.analyze.compile.report import ModuleArtifacts
    from tpudiag.parse import llo
    from tpudiag.parse.setup_modules import is_setup_module

    hlo = static = lframe = hbm = None
    notes = []
    if mc.status == "ok":
        # XLA's own dump keeps each custom call's backend config (a Pallas kernel's CostEstimate
        # lives there); the executable's to_string() drops it. Older runs have only the latter.
        dump = mc.dir / rundir.HLO_DIR
        dumped = find_optimized_modules(dump) if dump.is_dir() else {}
        hlo = read_hlo_file(next(iter(dumped.values())) if len(dumped) == 1 else mc.dir / rundir.MODULE_HLO)
        # The peak HBM the compiler itself checks against the device (its buffer assignment's
        # default memory space); the worker's memory analysis sums more than that.
        report = find_memory_reports(dump).get(next(iter(dumped))) if len(dumped) == 1 else None
        if report is not None:
            try:
                hbm = read_hbm_allocated_bytes(report)
            except TpudiagError as e:
                notes.append(f"XLA memory report unreadable, peak HBM from the memory analysis: {e}")
        # The compiler's side dumps enrich the report; one it wrote in a shape we do not read
        # costs that module its cycles or utilization, not the whole report.
        if (mc.dir / rundir.STATIC_PROFILE_DIR).is_dir():
            try:
                static = llo.read_static_profiles(mc.dir / rundir.STATIC_PROFILE_DIR)
            except TpudiagError as e:
                notes.append(f"static cycle profile unreadable, op times are roofline floors: {e}")
        if with_llo and (mc.dir / rundir.LLO_DIR).is_dir():
            try:
                lframe = llo.read_llo_dump(mc.dir / rundir.LLO_DIR)
            except TpudiagError as e:
                notes.append(f"LLO bundle dump unreadable, no slot utilization: {e}")
    inputs = sorted(mc.dir.glob("input.*")) if mc.dir.is_dir() else []
    mesh = None
    if inputs and inputs[0].suffix == ".mlir":
        from tpudiag.parse.sdy_mesh import read_mesh

        try:
            mesh = read_mesh(inputs[0].read_text())
        except (OSError, UnicodeDecodeError):  # bytecode, or unreadable: collectives lose their mesh axes
            mesh = None
    # Compiled in the setup group, or a setup module compiled on its own (`--each-module`, a run
    # from before the group): either way the reports give it one line, not a section.
    setup = mc.setup or (bool(inputs) and is_setup_module(inputs[0]))
    return ModuleArtifacts(name=mc.name, status=mc.status, error=mc.error, static_profile=mc.static_profile,
                           result=mc.result, hlo=hlo, static=static, llo=lframe, artifacts_dir=str(mc.dir),
                           notes=tuple(notes), input_file=str(inputs[0]) if inputs else None, mesh=mesh,
                           setup=setup, hbm_allocated_bytes=hbm)


def report_from_modules(target, compiled, source: dict, with_llo: bool = True, suggestions: bool = True):
    """(each module's parsed artifacts, the compile report built from them): each artifact parsed once."""
    from tpudiag.analyze.compile.report import build_compile_report
    from tpudiag.analyze.suggest.build import unpriced_report

    arts = [module_artifacts(mc, with_llo) for mc in compiled]
    report = build_compile_report(target, arts, source)
    hlo = {m.artifacts_dir: m.hlo for m in arts if m.status == "ok" and m.hlo is not None}
    if hlo and suggestions:  # the patterns a kernel replaces, unpriced (`tpudiag suggest RUN` prices them)
        report = replace(report, suggestions=unpriced_report(report, hlo, target.chip))
    return arts, report


def compile_inputs(inputs, run: Path, target, *, static_profile=True, jobs=2, limits=None, progress=None,
                   source: dict | None = None, with_llo: bool = True, suggestions: bool = True,
                   selection=None, group_setup: bool = True, skip_setup: bool = False):
    """Compile `ModuleInput`s (lowered modules) for `target` into `run/modules/` and return the
    compile report (`with_llo`: as for `module_artifacts`; `suggestions`: as for `build_compile_report`).
    `progress` hears each module's start and end (`tpu_compile.compile_modules`). `selection` (a
    `capture.select.Selection`) keeps some modules, numbered as among all; without one, setup
    modules (`parse.setup_modules`) are left out with `skip_setup` where some module is not one
    (the report's `source.setup_skipped` names them), else compiled together unless `group_setup`
    is False."""
    from tpudiag.capture.select import Selection, pick
    from tpudiag.capture.tpu_compile import Limits, compile_modules
    from tpudiag.parse.setup_modules import SETUP_RULE, is_setup_module

    source = dict(source or {})
    selection = selection or Selection()
    keep = pick([i.name for i in inputs], selection, str(source.get("input", run)))
    if selection:
        source["selection"] = {"asked": selection.describe(), "modules": len(inputs),
                               "compiled": [f"{k:02d}-{inputs[k].name}" for k in keep]}
    elif skip_setup and len(inputs) > 1:
        setup = [k for k in keep if is_setup_module(inputs[k].path)]
        if setup and len(setup) < len(keep):  # a program that is all setup is compiled whole
            keep = [k for k in keep if k not in set(setup)]
            source["setup_skipped"] = {"modules": [f"{k:02d}-{inputs[k].name}" for k in setup], "rule": SETUP_RULE}
    results = compile_modules([inputs[k] for k in keep], run / rundir.MODULES_DIR, target.topology,
                              static_profile=static_profile, limits=limits or Limits(), jobs=jobs, progress=progress,
                              group_setup=group_setup and not selection, numbers=keep)
    return report_from_modules(target, results, source, with_llo, suggestions)[1]


def compile_run_artifacts(run: Path, with_llo: bool = True, suggestions: bool = True, manifest=None):
    """(each module's parsed artifacts, the compile report built from them) of a compile run: every
    artifact parsed once, never recompiled (`with_llo`: as for `module_artifacts`; `suggestions`: as
    for `build_compile_report`; `manifest`: the run's, where the caller has read it)."""
    from tpudiag.capture.tpu_compile import load_module
    from tpudiag.targets import resolve_target

    run = Path(run)
    manifest = manifest or rundir.read_manifest(run)
    target = resolve_target((manifest.target or {}).get("topology", ""))
    modules = run / rundir.MODULES_DIR
    mdirs = sorted(p for p in modules.iterdir() if (p / rundir.MODULE_JSON).is_file()) if modules.is_dir() else []
    source = dict(manifest.source or {})
    if "input" not in source and manifest.program:  # a run stopped before its manifest had a source
        source["input"] = manifest.program
    arts, report = report_from_modules(target, [load_module(d) for d in mdirs], source, with_llo, suggestions)
    return arts, report.with_artifacts(compile_artifacts(run))


def analyze_compile_run(run: Path, manifest=None):
    """Re-build a compile run's report from its module directories (never recompiles)."""
    return compile_run_artifacts(run, manifest=manifest)[1]


def compile_artifacts(run: Path) -> dict:
    """The `artifacts` of a compile run's report: where its report and module directories are."""
    return {"run_dir": str(run), "report": rundir.REPORT, "modules": rundir.MODULES_DIR}
