"""`tpudiag kernels tune`: a Pallas kernel's block sizes (or any choice its builder takes) searched on
the TPU compiler, without a TPU.

`FILE.py:FUNC` is called once per point of the search space with that point's choice as keyword
arguments (`FUNC(block_q=256, block_k=512)`) and returns the function to compile; `--inputs` gives
its arguments' shapes and dtypes (`q=bf16[1,8,2048,128] ...`, as `validate` reads them). Each point
is lowered here (Pallas -> Mosaic happens at lowering: block sizes the kernel refuses fail here, as
a row) and compiled for the target by the sweep engine (`capture/sweep.py`: this machine's
processes, or a Ray cluster), with the static cycle profile; the points are ranked by the figure
`kernels bench` uses (analyze/compile/tune.py). A point that runs out of VMEM, crashes the compiler
or times out is a row, never the end of the sweep.

Writes a run directory: `lowered/` (each point's StableHLO), `modules/` (the compiler's artifacts
per point), `compile-report.json` (every op's figures) and `report.json` (tpudiag.kernels-tune/1).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

from tpudiag.capture import rundir
from tpudiag.capture.rundir import RunDir
from tpudiag.errors import InputError, one_line
from tpudiag.outputs import check_run_dir

MANIFEST_KIND = "kernels-tune"


def _check_accepts(fn: Callable, entry: str, names: list[str]) -> None:
    """FUNC must take every name of the space as a keyword argument."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: the first point's call says what is wrong
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [n for n in names if n not in accepted]
    if unknown:
        raise InputError(f"{entry}: takes no argument {', '.join(map(repr, unknown))} from --space "
                         f"(it takes: {', '.join(accepted) or 'none'})")


def kernels_tune(entry: str, target_text: str, space_text: str, inputs_text: str, out: Path | None = None, *,
                 jobs: int | None = None, ray_address: str | None = None, static_profile: bool = True, limits=None,
                 progress: Callable[[str], None] | None = None):
    """Search `space_text` for `entry` (FILE.py:FUNC) at `inputs_text` on `target_text`; returns (the
    `KernelTune` result, the run directory). Everything the command line gave is checked before a
    run directory exists: the space, the inputs, the target, FUNC and its arguments, the Ray cluster."""
    from tpudiag.analyze.compile.tune import choice_text, parse_space, space_points, tune_document, tune_point
    from tpudiag.capture.sweep import compile_modules, runner_for
    from tpudiag.capture.tpu_compile import Limits, ModuleCompile, ModuleInput
    from tpudiag.parity.inputs import parse_spec
    from tpudiag.parity.sides import load_function
    from tpudiag.targets import require_libtpu, resolve_target

    space = parse_space(space_text)
    specs = parse_spec(inputs_text)
    target = resolve_target(target_text)
    require_libtpu()
    func = load_function(entry, "kernel builder")
    _check_accepts(func, entry, list(space))
    runner = runner_for(ray_address, jobs)
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(Path("kernels-tune")))
    points = space_points(space)
    inputs_shown = " ".join(a.text() for a in specs)
    with RunDir(run, MANIFEST_KIND, rundir.COMPILE_SUBDIRS + (rundir.LOWERED_DIR,), program=entry,
                argv=[entry, "--space", space_text, "--inputs", inputs_shown], target=target.to_dict(),
                static_profile=static_profile) as rd:
        import jax

        from tpudiag.capture.lower import lower_for_tpu

        args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in specs]
        inputs, index, errors = [], {}, {}
        for i, choice in enumerate(points):
            if progress:
                progress(f"lowering [{i + 1}/{len(points)}] {choice_text(choice)}")
            path = run / rundir.LOWERED_DIR / f"point{i:03d}.mlir"
            try:
                lower_for_tpu(func(**choice), args, path, debug_info=False)
            except Exception as e:  # block sizes the kernel refuses, shapes they do not divide
                errors[i] = one_line(e, 300)
                continue
            index[len(inputs)] = i
            inputs.append(ModuleInput(name=f"point{i:03d}", path=path, kind="mlir"))
        done, point_of = [0], {inp.name: index[k] for k, inp in enumerate(inputs)}

        def on_compiled(mc):
            if progress and isinstance(mc, ModuleCompile):
                done[0] += 1
                i = point_of[mc.name]
                how = "cached" if mc.cached else mc.status
                progress(f"[{done[0]}/{len(inputs)}] {choice_text(points[i])}: {how}"
                         + ("" if mc.status == "ok" else f" ({(mc.error or '')[:80]})"))

        compiled = compile_modules(runner, inputs, run / rundir.MODULES_DIR, target.topology,
                                   static_profile=static_profile, limits=limits or Limits(), progress=on_compiled)
        from tpudiag.api.pipeline import report_from_modules

        _, report = report_from_modules(target, compiled, {"input": entry, "kind": "kernels-tune"}, with_llo=False,
                                        suggestions=False)
        rd.write_json(rundir.KERNELS_COMPILE_REPORT, report.to_dict())
        modules = {m.name: m for m in report.modules}
        cached = {mc.name: bool(mc.cached) for mc in compiled}
        by_point = {i: inputs[k].name for k, i in index.items()}
        rows = [tune_point(choice, modules.get(by_point.get(i)), report.target, errors.get(i),
                           cached.get(by_point.get(i), False)) for i, choice in enumerate(points)]
        result = tune_document(entry, inputs_shown, report.to_dict()["target"], space, rows, runner.description,
                               static_profile).with_artifacts(
            {"run_dir": str(run), "report": rundir.REPORT, "compile_report": rundir.KERNELS_COMPILE_REPORT})
        rd.write_json(rundir.REPORT, result.to_dict())
        rd.finish(result.status == "ok", reason="no point compiled" if result.status != "ok" else None)
    return result, run
