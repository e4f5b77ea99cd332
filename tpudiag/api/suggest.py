"""`tpudiag suggest`: a run's kernel suggestions, priced by compiling the bundled kernels at the
matched shapes for the run's own TPU target.

Reads a compile run, a profile run made with `--target` (its `tpu/` compile run, and its
measured op times by source line), a profile run made on a TPU (its own optimized HLO, with each
op's time measured on the chip: no compile of the program is needed), or profiles a script with
`--target` first. Kernels are
lowered and compiled in a temporary directory through the same workers and compile cache as
`kernels bench`, so a second `suggest` of the same shapes costs no compile; the run directory is
read, never written. Returns a `SuggestReport` (results/suggest.py).
"""

from __future__ import annotations

import shlex

import tempfile
from pathlib import Path

from tpudiag.api import runs
from tpudiag.capture import rundir
from tpudiag.errors import InputError


def suggest_run(run, target_text: str | None = None, *, static_profile: bool = True, jobs: int = 2, limits=None,
                progress=None, include_all: bool = False, selection=None, calibration: bool = True,
                measure: bool = False, calls: int = 10, chip_progress=None, requests: dict | None = None):
    """Suggestions for a compile run or a profile run made with --target; `selection` (a
    `capture.select.Selection`) keeps some of its modules. `calibration`: price kernels (and XLA's
    ops where the run did not measure them) from the chip's measured kernel table where the target
    has one (kernels/measured.py); False keeps the static figures. `measure`: also time each
    suggestion's kernel and its XLA twin on the attached TPU at the matched shapes (`calls` calls
    each; api/suggest_chip.py), lines about it to `chip_progress`; no TPU is a one-line InputError
    before any work. `requests` (a dict), where given, gets the chip worker's request for each
    suggestion it would time, by (module, pattern, ops), measured or not."""
    if measure:
        from tpudiag.api.suggest_chip import require_tpu

        require_tpu()
    chip = {"measure": measure, "calls": calls, "progress": chip_progress, "requests": requests}
    from tpudiag.analyze.suggest.build import (DEFAULT_SUGGEST_CONFIG, build_report, candidates, findings_for,
                                               roofline_bound)
    from tpudiag.api.pipeline import compile_run_artifacts
    from tpudiag.targets import resolve_target

    handle = runs.open_run(run)
    if handle.kind == runs.PROFILE and handle.tpu is None:
        from tpudiag.api.profiling import analyze_run

        prof = analyze_run(handle.path, manifest=handle.manifest)
        if prof.backend == "tpu":
            return _suggest_measured(handle, prof, target_text, static_profile=static_profile, jobs=jobs,
                                     limits=limits, progress=progress, include_all=include_all,
                                     calibration=calibration, chip_opts=chip)
    handle = _compiled_run(handle, target_text)
    run = handle.path
    profiled = handle.kind == runs.PROFILE
    compile_dir = handle.tpu if profiled else run
    # No op time depends on the LLO dump; the detectors run below, on the priced path, not twice.
    arts, report = compile_run_artifacts(compile_dir, with_llo=False, suggestions=False,
                                         manifest=None if profiled else handle.manifest)
    if selection:
        arts, report = _selected(arts, report, selection, compile_dir)
    if target_text:
        asked = resolve_target(target_text)
        if asked.chip.name != report.target.chip:
            raise InputError(f"{run}: compiled for {report.target.topology}, not {asked.topology}; compile it for "
                             f"that target first: tpudiag compile --target {target_text} "
                             f"{run / rundir.IR_DIR if profiled else report.source.get('input', 'INPUT')}")
    ok = [a for a in arts if a.status == "ok" and a.hlo is not None]
    if not ok:
        raise InputError(f"{compile_dir}: every module failed to compile, so there is no optimized HLO to read "
                         f"(tpudiag report {compile_dir} shows why)")
    modules = {a.artifacts_dir: a.hlo for a in ok}
    cands, replaced = candidates(report, modules)
    target = resolve_target(report.target.topology)
    bounds = {i: roofline_bound(c, target.chip) for i, c in enumerate(cands)}
    worth = [i for i, c in enumerate(cands) if include_all or c.share >= DEFAULT_SUGGEST_CONFIG.min_share]
    timed = _on_chip(cands, worth, target, chip)  # first: the chip worker must hold the TPU alone
    prices = _price(cands, worth, target, static_profile=static_profile, jobs=jobs, limits=limits, progress=progress,
                    calibration=calibration)
    findings = findings_for(report, modules, cands, target.chip.hbm_bytes_per_s)
    measured, notes, per_step = None, [], None
    if profiled:
        from tpudiag.api.profiling import analyze_run

        # The compile report built above is the run's TPU section too: RUN/tpu/ is read once.
        prof = analyze_run(run, manifest=handle.manifest, compiled=report)
        measured = {}
        for o in prof.ops:
            if o.source:
                measured[o.source] = measured.get(o.source, 0.0) + o.self_s
        notes.append(f"measured shares are of the CPU run's op time ({prof.backend}), by source line")
        per_step = _executions_per_step(prof.tpu_estimate)
    return _with_chip(build_report(str(run), report, cands, replaced, prices, bounds, findings, measured, notes=notes,
                                   per_step=per_step, chip_table=_chip_table(target, calibration)), cands, timed)


def _on_chip(cands, indices, target, chip: dict):
    """`suggest --measure`: (device kind, {candidate index: ChipTimes}, calls) for `indices`, or None."""
    if not chip.get("measure") and chip.get("requests") is None:
        return None
    from tpudiag.api.suggest_chip import chip_requests, measure_on_chip

    requests = chip_requests(cands, indices)
    if chip.get("requests") is not None:
        chip["requests"].update({(cands[i].module, cands[i].match.pattern, cands[i].ops): r for i, r in requests.items()})
    if not chip.get("measure"):
        return None
    device, times = measure_on_chip(requests, target, chip["calls"], chip.get("progress"))
    return device, times, chip["calls"]


def _with_chip(rep, cands, timed):
    """`rep` with the chip's times beside the estimates (analyze/suggest/chip.py) where measured."""
    if timed is None:
        return rep
    from tpudiag.analyze.suggest.chip import with_chip_times

    device, times, calls = timed
    return with_chip_times(rep, cands, times, device, calls)


def _chip_table(target, calibration: bool) -> dict | None:
    from tpudiag.kernels.measured import chip_figures

    return chip_figures(target.chip.name) if calibration else None


def _suggest_measured(handle, prof, target_text, *, static_profile, jobs, limits, progress, include_all,
                      calibration=True, chip_opts=None):
    """Suggestions for a profile run made on a TPU: its dump's optimized HLO is the TPU compiler's own,
    and each XLA op's time is its measured self time; only the kernels are compiled (and estimated)."""
    from tpudiag.analyze.compile.report import ModuleArtifacts, build_compile_report
    from tpudiag.analyze.suggest.build import (DEFAULT_SUGGEST_CONFIG, build_report, candidates, findings_for,
                                               roofline_bound)
    from tpudiag.analyze.suggest.measured import executions_per_step, measured_report
    from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file
    from tpudiag.targets import resolve_target

    run = handle.path
    chip = prof.device.chip if prof.device is not None else None
    measured_on = resolve_target(chip) if chip else None
    target = resolve_target(target_text) if target_text else measured_on
    if target is None:
        raise InputError(f"{run}: the trace does not name its TPU; say which: tpudiag suggest --target v5e {run}")
    if measured_on is not None and target.chip.name != measured_on.chip.name:
        raise InputError(f"{run}: measured on {measured_on.chip.name} ({chip}), not {target.chip.name}: its op times "
                         f"are that chip's; drop --target, or profile on a {target.chip.name}")
    tl = prof.timeline
    names = dict(zip(tl["program_id"].astype(int), tl["module"]))
    dumped = find_optimized_modules(run / rundir.HLO_DIR)
    executed = sorted(set(names) & set(dumped))
    if not executed:
        raise InputError(f"{run}: no optimized HLO of the modules it ran in {run / rundir.HLO_DIR}; suggestions "
                         "read the run's HLO dump")
    arts = [ModuleArtifacts(name=names[pid], status="ok", error=None, static_profile="off", result={},
                            hlo=read_hlo_file(dumped[pid]), static=None, llo=None, artifacts_dir=str(dumped[pid]))
            for pid in executed]
    report = build_compile_report(target, arts, {"input": handle.manifest.program or str(run)})
    report = measured_report(report, tl, {str(dumped[pid]): pid for pid in executed})
    modules = {a.artifacts_dir: a.hlo for a in arts}
    cands, replaced = candidates(report, modules)
    bounds = {i: roofline_bound(c, target.chip) for i, c in enumerate(cands)}
    worth = [i for i, c in enumerate(cands) if include_all or c.share >= DEFAULT_SUGGEST_CONFIG.min_share]
    timed = _on_chip(cands, worth, target, chip_opts or {})  # first: the chip worker must hold the TPU alone
    prices = _price(cands, worth, target, static_profile=static_profile, jobs=jobs, limits=limits, progress=progress,
                    calibration=calibration)
    findings = findings_for(report, modules, cands, target.chip.hbm_bytes_per_s)
    measured = {}
    for o in prof.ops:
        if o.source:
            measured[o.source] = measured.get(o.source, 0.0) + o.self_s
    table = _chip_table(target, calibration)
    notes = [f"XLA's op times are measured on the chip ({chip}), per execution of their module; each kernel's "
             + (f"time is its measured time on a {target.chip.name} scaled to the matched shapes where the chip's "
                "kernel table has it (kernel_basis measured_table), else " if table else "time is ")
             + f"the TPU compiler's estimate for {target.chip.name} at the matched shapes"]
    return _with_chip(build_report(str(run), report, cands, replaced, prices, bounds, findings, measured, notes=notes,
                                   per_step=executions_per_step(tl, prof.steps.count, {p: names[p] for p in executed}),
                                   chip_table=table), cands, timed)


def _selected(arts, report, selection, where: Path):
    """The modules of a compile run that `selection` keeps (numbered as their directories are)."""
    from dataclasses import replace

    from tpudiag.capture.select import pick

    numbers = [int(Path(a.artifacts_dir).name.split("-", 1)[0]) for a in arts]
    keep = pick([a.name for a in arts], selection, str(where), numbers)
    return [arts[k] for k in keep], replace(report, modules=tuple(report.modules[k] for k in keep))


def _compiled_run(run: runs.RunHandle, target_text: str | None) -> runs.RunHandle:
    """`run` if it is a compile run or a profile run with its TPU compile; otherwise a one-line
    InputError naming what is missing and the command that makes it."""
    target = target_text or "v5e"
    if run.kind == runs.XPLANE:
        raise InputError(f"{run.path}: a bare trace has no HLO to read; suggestions need a TPU compile: "
                         f"tpudiag profile --target {target} SCRIPT")
    if not run.is_run:
        raise InputError(f"{run.path}: not a tpudiag run directory (no {rundir.MANIFEST}); give a run directory "
                         "or a script")
    if run.kind == runs.JOB:
        # `suggest SCRIPT` runs the script as one plain process, where `jax.distributed.initialize()`
        # finds no cluster; `compile` runs a multi-process program as the whole job in one process.
        job = run.manifest
        argv = list(job.argv or [job.program or "SCRIPT"])
        args = " -- " + shlex.join(argv[1:]) if len(argv) > 1 else ""
        raise InputError(f"{run.path}: a {job.num_processes}-process job has no TPU compile; suggestions need one: "
                         f"tpudiag compile --target {target} --out RUN {shlex.quote(argv[0])}{args}, then "
                         "tpudiag suggest RUN")
    if run.kind == runs.PROFILE and run.tpu is None:
        program = run.manifest.program or "SCRIPT"
        raise InputError(f"{run.path}: a profile run without a TPU compile; suggestions need one: "
                         f"tpudiag profile --target {target} {program} (or tpudiag compile --target {target} "
                         f"{run.path / rundir.IR_DIR})")
    return run


def _executions_per_step(section) -> dict | None:
    """{module name: executions per traced step} of a profile run's TPU estimate; a name compiled
    more than once (two shapes) is left out: its executions cannot be told apart by name."""
    if section is None:
        return None
    names = [m.name for m in section.modules]
    return {m.name: m.executions_per_step for m in section.modules
            if m.executions_per_step is not None and names.count(m.name) == 1}


def _price(cands, indices, target, *, static_profile, jobs, limits, progress, calibration: bool = True) -> dict:
    """{candidate index: Price}: each distinct kernel setup lowered and compiled once; with
    `calibration`, kernel ops priced from floors move to the share of the peak they reached on the chip
    (the calibration tpudiag ships for the target's chip, where it ships one)."""
    from tpudiag.analyze.compile.calibrated import flash_kernel_delta
    from tpudiag.analyze.compile.kernel_bench import op_floor_cycles
    from tpudiag.api.calibrate import shipped
    from tpudiag.analyze.suggest.build import Price
    from tpudiag.api.pipeline import compile_inputs
    from tpudiag.capture.lower import lower_for_tpu
    from tpudiag.capture.tpu_compile import ModuleInput
    from tpudiag.kernels.at_shapes import setup_for, with_backward

    prices, setups, by_key = {}, {}, {}
    for i in indices:
        c = cands[i]
        s = setup_for(c.match.detector, c.match.shapes, c.match.notes)
        if isinstance(s, str):
            prices[i] = Price(None, None, why_not=s)
            continue
        if c.backward:
            s = with_backward(s)
            if isinstance(s, str):
                prices[i] = Price(None, None, why_not=s)
                continue
        key = (s.kernel, s.description)
        by_key.setdefault(key, []).append(i)
        setups[key] = s
    if not setups:
        return prices
    cal = shipped(target.chip.name) if calibration else None
    with tempfile.TemporaryDirectory(prefix="tpudiag-suggest-") as tmp:
        inputs, failed = [], {}
        for n, (key, s) in enumerate(setups.items()):
            path = Path(tmp) / f"{n:02d}-{s.kernel}.mlir"
            try:
                # debug_info=False: a stable cache key, whoever calls; traced as for the target's chip
                lower_for_tpu(s.fn, s.args, path, debug_info=False, topology=target.topology,
                              donate_argnums=s.donate)
            except Exception as e:  # the kernel refused these shapes while tracing (block sizes, VMEM)
                failed[key] = f"{s.kernel} does not lower at {s.description}: {str(e).splitlines()[0][:200]}"
                continue
            inputs.append((key, ModuleInput(name=f"{s.kernel}", path=path, kind="mlir")))
        rep = compile_inputs([m for _, m in inputs], Path(tmp), target, static_profile=static_profile, jobs=jobs,
                             limits=limits, progress=progress, with_llo=False, suggestions=False,
                             group_setup=False) if inputs else None
        compiled = {key: rep.modules[k] for k, (key, _) in enumerate(inputs)} if rep else {}
    for key, idx in by_key.items():
        s = setups[key]
        for i in idx:
            if key in failed:
                prices[i] = Price(s.kernel, None, why_not=failed[key], snippet=s.snippet, description=s.description)
                continue
            m = compiled[key]
            if not m.ok or m.totals is None:
                prices[i] = Price(s.kernel, None, why_not=f"{s.kernel} failed to compile at {s.description}: {m.error}",
                                  snippet=s.snippet, description=s.description)
            else:
                floor = sum(op_floor_cycles(op, rep.target) for op in m.ops) / rep.target.clock_hz
                shapes = cands[i].match.shapes
                added, note = (flash_kernel_delta(m.ops, cal, target.chip, getattr(shapes, "head_dim", 0) or 128,
                                                  getattr(shapes, "q_len", 0) or 2048)
                               if cal is not None else (0.0, None))
                prices[i] = Price(s.kernel, m.totals.estimated_s + added, static_ok=m.static_profile == "ok",
                                  snippet=s.snippet, description=s.description, floor_s=floor or None,
                                  calibrated=note, measured_as=s.measured_as, step_scale=s.step_scale)
    return prices


def suggest(input_path, args=(), target_text: str | None = None, out=None, *, static_profile: bool = True,
            jobs: int = 2, limits=None, progress=None, include_all: bool = False, program_stdout=None,
            selection=None, calibration: bool = True, measure: bool = False, calls: int = 10, chip_progress=None):
    """`tpudiag suggest INPUT`: a run directory as it is, or a script profiled with --target first.
    `measure`: time the suggestions on the attached TPU too (suggest_run). Returns (SuggestReport,
    the run directory read)."""
    from tpudiag.api.profiling import profile
    from tpudiag.errors import ProgramFailed

    path = Path(input_path)
    if measure:  # before a script is profiled: no TPU is one line, with nothing written
        from tpudiag.api.suggest_chip import require_tpu

        require_tpu()
    if path.suffix == ".py":
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        result = profile(path, list(args), out, target=target_text or "v5e", static_profile=static_profile,
                         jobs=jobs, limits=limits, progress=progress, program_stdout=program_stdout,
                         selection=selection)
        if result.capture.exit_code != 0:
            raise ProgramFailed(f"the program failed ({result.capture.reason}); nothing to suggest from "
                                f"{result.capture.run_dir}", result.capture.exit_code)
        run = result.capture.run_dir
    else:
        run = path
    return suggest_run(run, target_text, static_profile=static_profile, jobs=jobs, limits=limits, progress=progress,
                       include_all=include_all, selection=selection, calibration=calibration, measure=measure,
                       calls=calls, chip_progress=chip_progress), run
