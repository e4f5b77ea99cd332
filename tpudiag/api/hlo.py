"""`tpudiag fusions` and `tpudiag hlo-diff`: the optimized HLO modules behind a path, with each
instruction's time where the run has one (measured in a profile run, estimated in a compile run).

Reads HLO files, XLA dump directories and run directories; returns `LoadedModule`s, fusion reports
and HLO diffs. It does not render.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tpudiag.api import runs
from tpudiag.capture import rundir
from tpudiag.errors import InputError
from tpudiag.outputs import check_output_file
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file


@dataclass(frozen=True)
class LoadedModule:
    """An optimized HLO module with the time of each of its instructions, where the run has them."""

    module: object  # parse.hlo.HloModule
    times: dict[str, float] | None  # instruction name -> seconds (measured self time or TPU estimate)
    time_source: str | None  # "measured" | "estimated" | None
    number: int = 0  # what --module INDEX names: a compile run's module directory number, else the order read


def _as_selection(selection):
    from tpudiag.capture.select import Selection

    if selection is None:
        return Selection()
    return Selection(modules=(selection,)) if isinstance(selection, str) else selection


def load_hlo_modules(path, selection=None) -> list[LoadedModule]:
    """The optimized HLO modules behind PATH (a path or its `RunHandle`): an HLO text file, an XLA
    dump directory, a profile run (with measured op times) or a compile run (with estimated TPU op
    times). `selection` (a `capture.select.Selection`, or a module name) keeps some of them: a
    compile run's modules are numbered as their directories are, others in the order read."""
    from tpudiag.capture.select import pick

    selection = _as_selection(selection)
    run = runs.open_run(path)
    path = run.path
    found: list[LoadedModule] = []
    numbers: list[int] | None = None
    if run.kind in (runs.FILE, runs.XPLANE):
        found = [LoadedModule(read_hlo_file(path), None, None)]
    elif run.is_compile:
        from tpudiag.api.pipeline import compile_run_artifacts

        # Each module's HLO parsed once, for both.
        arts, report = compile_run_artifacts(path, manifest=run.manifest)
        numbers = []
        for art, m in zip(arts, report.modules):
            if m.ok and art.hlo is not None:
                found.append(LoadedModule(art.hlo, {o.name: o.estimated_s for o in m.ops}, "estimated"))
                numbers.append(int(Path(art.artifacts_dir).name.split("-", 1)[0]))
    elif run.is_run:  # a profile run (a job's own directory reads as one)
        from tpudiag.api.profiling import analyze_run

        report = analyze_run(path, manifest=run.manifest)
        tl = report.timeline
        for pid, hpath in sorted(find_optimized_modules(path / rundir.HLO_DIR).items()):
            sel = tl[tl["program_id"] == pid]
            times = {op: ns * 1e-9 for op, ns in sel.groupby("op")["self_ns"].sum().items()} if len(sel) else None
            found.append(LoadedModule(read_hlo_file(hpath), times, "measured" if times else None))
    else:
        mods = find_optimized_modules(path)
        if not mods:
            raise InputError(f"{path}: no optimized HLO here (expected an HLO file, an XLA dump directory, "
                             "or a tpudiag run)")
        found = [LoadedModule(read_hlo_file(p), None, None) for _, p in sorted(mods.items())]
    numbers = numbers if numbers is not None else list(range(len(found)))
    found = [replace(m, number=k) for m, k in zip(found, numbers)]
    if selection:
        found = [found[k] for k in pick([m.module.name for m in found], selection, str(path), numbers)]
    if not found:
        raise InputError(f"{path}: no optimized HLO module to read (a compile run whose modules all failed, "
                         "or a run without HLO dumps)")
    return found


def fusion_reports(path, selection=None) -> list:
    """One `FusionReport` (tpudiag.fusions/1) per module behind PATH (a path or its `RunHandle`)."""
    from tpudiag.analyze.hlo.fusions import build_fusion_report

    return [build_fusion_report(m.module, m.times, m.time_source) for m in load_hlo_modules(path, selection)]


def hlo_diff(path_a: Path, path_b: Path, selection=None):
    """`tpudiag hlo-diff A B`: the `HloDiff` of one module from each side, matched structurally."""
    from tpudiag.analyze.diff.hlo_diff import diff_modules

    sides = []
    for path in (path_a, path_b):
        mods = load_hlo_modules(path, selection)
        if len(mods) > 1:
            from tpudiag.capture.select import listing

            names = listing([m.module.name for m in mods], [m.number for m in mods])
            raise InputError(f"{path}: {len(mods)} modules; pick one with --module NAME|INDEX or --function NAME "
                             f"(modules: {names})")
        sides.append(mods[0])
    return diff_modules(sides[0].module, sides[1].module, sides[0].times, sides[1].times)


def fusions_list(path: Path, selection=None):
    """`tpudiag fusions`: the `FusionList` (tpudiag.fusions_list/1), one report per module."""
    from tpudiag.results.fusions import LIST_SCHEMA, FusionList

    run = runs.open_run(path)
    runs.refuse_job(run, "fusions")
    return FusionList(schema=LIST_SCHEMA, modules=tuple(fusion_reports(run, selection)))


def write_diff_html(diff, path: Path) -> Path:
    """`hlo-diff --html FILE`: the side-by-side page of an `HloDiff`, written whole or not at all."""
    from tpudiag.report.registry import render

    check_output_file(path)
    rundir.write_text_atomic(Path(path), render(diff, "html"))
    return Path(path)
