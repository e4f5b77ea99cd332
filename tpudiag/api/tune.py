"""`tpudiag kernels tune`: a Pallas kernel's block sizes (or any choice its builder takes) searched on
the TPU compiler, without a TPU.

`FILE.py:FUNC` is called once per point of the search space with that point's choice as keyword
arguments (`FUNC(block_q=256, block_k=512)`) and returns the function to compile; `--inputs` gives
its arguments' shapes and dtypes (`q=bf16[1,8,2048,128] ...`, as `validate` reads them). A bundled
kernel's name instead (`flash_attention`) searches its block candidates (or `--space` over its
block-size fields) at its production shape, and the result says where the kernel's own blocks rank. Each point
is lowered here (Pallas -> Mosaic happens at lowering: block sizes the kernel refuses fail here, as
a row) and compiled for the target by the sweep engine (`capture/sweep.py`: this machine's
processes, or a Ray cluster), with the static cycle profile; the points are ranked by the figure
`kernels bench` uses (analyze/compile/tune.py). A point that runs out of VMEM, crashes the compiler
or times out is a row, never the end of the sweep.

Writes a run directory: `lowered/` (each point's StableHLO), `modules/` (the compiler's artifacts
per point), `compile-report.json` (every op's figures) and `report.json` (tpudiag.kernels-tune/1).
"""

from __future__ import annotations

import dataclasses
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


def _is_bundled(entry: str) -> bool:
    """A bundled kernel's name (`flash_attention`), not FILE.py:FUNC."""
    return ":" not in entry and not entry.endswith(".py")


def _bundled_points(name: str, space_text: str | None, inputs_text: str | None, chip=None):
    """A bundled kernel's search: (space, points, build(i, choice) -> function, args, inputs shown,
    the kernel's own choice). Without --space the points are the kernel's block candidates (the
    fields that differ between them are the choice); with one, every combination of the kernel's
    block-size fields, the others at the kernel's own. The shape is the kernel's production shape."""

    from tpudiag.analyze.compile.tune import parse_space, space_points
    from tpudiag.kernels.registry import get_spec

    spec = get_spec(name)
    setup = spec.bench_setup(chip=chip)
    if inputs_text:
        raise InputError(f"--inputs: {name} is a bundled kernel, tuned at its production shape ({setup.shape}); "
                         "--inputs is for FILE.py:FUNC")
    if not spec.block_candidates:
        raise InputError(f"{name}: has no block sizes to tune")
    cls = type(spec.block_candidates[0])
    fields = [f.name for f in dataclasses.fields(cls)]
    # The kernel's own blocks: the candidate its bench takes by default (a kernel whose default
    # depends on the shape, as mla_decode's on the page size, is not its class's defaults).
    own_blocks = next((c for c in spec.block_candidates if str(c) == setup.blocks), None) or cls()
    default = _fields(own_blocks)
    if space_text is not None:
        space = parse_space(space_text)
        unknown = [n for n in space if n not in fields]
        if unknown:
            raise InputError(f"--space: {name}'s block sizes have no {', '.join(map(repr, unknown))} "
                             f"(they have: {', '.join(fields)})")
        points = space_points(space)

        def blocks(i, choice):
            return dataclasses.replace(own_blocks, **choice)
    else:
        cands = list(spec.block_candidates)
        rows = [_fields(c) for c in cands]
        varying = [f for f in fields if len({repr(r[f]) for r in rows}) > 1] or fields[:1]
        space = {f: list(dict.fromkeys(r[f] for r in rows)) for f in varying}
        points = [{f: r[f] for f in varying} for r in rows]

        def blocks(i, choice):
            return cands[i]
    own = {n: default[n] for n in space}
    args = list(setup.args_for("kernel"))
    shown = f"{setup.shape}: " + " ".join(f"{a.dtype}[{','.join(map(str, a.shape))}]" for a in args)
    return space, points, (lambda i, choice: spec.bench_setup(blocks(i, choice), chip).kernel), args, shown, own


def _fields(blocks) -> dict:
    """A block-size dataclass's fields as JSON values: a nested one (fused_moe's per-call tiles) is
    its text."""
    return {f.name: v if isinstance(v := getattr(blocks, f.name), (bool, int, float, str, type(None))) else str(v)
            for f in dataclasses.fields(blocks)}


def _func_points(entry: str, space_text: str | None, inputs_text: str | None):
    """FILE.py:FUNC's search: the same tuple as `_bundled_points`, FUNC(**choice) the function."""
    from tpudiag.analyze.compile.tune import parse_space, space_points
    from tpudiag.parity.inputs import parse_spec
    from tpudiag.parity.sides import load_function

    for option, text in (("--space", space_text), ("--inputs", inputs_text)):
        if text is None:
            raise InputError(f"{option}: required for FILE.py:FUNC ({entry}); a bundled kernel's name needs neither")
    space = parse_space(space_text)
    specs = parse_spec(inputs_text)
    func = load_function(entry, "kernel builder")
    _check_accepts(func, entry, list(space))
    import jax

    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in specs]
    return space, space_points(space), (lambda i, choice: func(**choice)), args, " ".join(a.text() for a in specs), None


def _check_against(reference: str, rows: list, points: list[dict], build, inputs_text: str, seed: int,
                   progress) -> list:
    """Each compiled point's function against `reference` by validate's rule (analyze.compile.tune.
    verified_point)."""
    from tpudiag.analyze.compile.tune import choice_text, verified_point
    from tpudiag.api.validate import validate

    todo = [i for i, r in enumerate(rows) if r.status == "ok"]
    out = list(rows)
    for k, i in enumerate(todo):
        if progress:
            progress(f"checking [{k + 1}/{len(todo)}] {choice_text(points[i])} against {reference}")
        try:
            result = validate(reference, build(i, points[i]), inputs_text, seed=seed, shrink=False)
        except Exception as e:  # the inputs do not fit the reference, the kernel raised on this CPU
            result = one_line(e, 300)
        out[i] = verified_point(rows[i], result)
    return out


def kernels_tune(entry: str, target_text: str, space_text: str | None, inputs_text: str | None,
                 out: Path | None = None, *, jobs: int | None = None, ray_address: str | None = None,
                 static_profile: bool = True, limits=None, fast_forward: bool = False,
                 reference: str | None = None, seed: int | None = None,
                 progress: Callable[[str], None] | None = None, on_chip: bool | None = None, calls: int = 10):
    """Search `space_text` for `entry` at `inputs_text` on `target_text`; returns (the `KernelTune`
    result, the run directory). `entry` is FILE.py:FUNC (FUNC(**choice) returns the function to
    compile; --space and --inputs required) or a bundled kernel's name (its block candidates, or
    --space over its block-size fields, at its production shape). Everything the command line gave
    is checked before a run directory exists: the space, the inputs, the target, FUNC and its
    arguments, the Ray cluster.

    The static profile steps through every iteration of a kernel's grid unless `fast_forward`:
    libtpu's fast-forwarded loops inflate a gridded kernel's cycles (the bundled flash attention at
    1024-row blocks: 539.7k fast-forwarded, 115.5k stepped through) and can reorder the points; a
    kernel's module is small, so stepping through costs little (8 flash-attention points: 51 s).

    `reference` (FILE.py:FUNC, as `validate` takes it): every point that compiled is then run on
    this CPU (Pallas interpret mode, when the built function takes `interpret`) at fresh inputs of
    --inputs' shapes, one seed for all, against the reference by validate's rule; a point that does
    not match is a row ("mismatch") and is never ranked.

    `on_chip` (None: where a TPU is attached, for a bundled kernel): every point is also timed on
    the attached TPU first (api/kernels_chip.py, `calls` calls each), and ranked by its fastest
    call beside the static rank. FILE.py:FUNC has no rules for its inputs' values: static only."""
    from tpudiag.analyze.compile.tune import choice_text, tune_document, tune_point
    from tpudiag.capture.sweep import compile_modules, runner_for
    from tpudiag.capture.tpu_compile import Limits, ModuleCompile, ModuleInput
    from tpudiag.targets import require_libtpu, resolve_target

    if _is_bundled(entry):
        if reference is not None:
            raise InputError(f"--reference: {entry} is a bundled kernel; `tpudiag kernels verify {entry}` checks it "
                             "against its own reference")
        space, points, build, args, inputs_shown, own = _bundled_points(entry, space_text, inputs_text,
                                                                        resolve_target(target_text).chip)
    else:
        space, points, build, args, inputs_shown, own = _func_points(entry, space_text, inputs_text)
    if reference is not None:
        import secrets

        from tpudiag.parity.sides import load_function

        load_function(reference, "reference")  # a missing file or function: refused before the run
        seed = secrets.randbelow(2**31) if seed is None else seed
    target = resolve_target(target_text)
    from tpudiag.capture.process import tpu_attached

    if on_chip and not _is_bundled(entry):
        raise InputError(f"kernels tune --on-chip: {entry} is FILE.py:FUNC; only a bundled kernel is timed on the chip "
                         "(its inputs' values follow the kernel's rules)")
    if on_chip and not tpu_attached():
        raise InputError("kernels tune --on-chip: no TPU is attached to this machine (no /dev/accel* or /dev/vfio "
                         "device files)")
    on_chip = _is_bundled(entry) and (tpu_attached() if on_chip is None else on_chip)
    require_libtpu()
    runner = runner_for(ray_address, jobs)
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(Path("kernels-tune")))
    argv = [entry] + (["--space", space_text] if space_text is not None else []) + \
        (["--inputs", inputs_shown] if inputs_text is not None else [])
    with RunDir(run, MANIFEST_KIND, rundir.COMPILE_SUBDIRS + (rundir.LOWERED_DIR,), program=entry,
                argv=argv, target=target.to_dict(), static_profile=static_profile,
                timing="chip" if on_chip else "static") as rd:
        from tpudiag.capture.lower import lower_for_tpu

        if on_chip:  # first: the chip worker must hold the chip alone
            from tpudiag.api.kernels_chip import chip_tune_times

            device, chip_rows = chip_tune_times(entry, points, space_text is None, target_text, calls,
                                        2 * target.chip.vmem_bytes, run, progress)

        inputs, index, errors = [], {}, {}
        for i, choice in enumerate(points):
            if progress:
                progress(f"lowering [{i + 1}/{len(points)}] {choice_text(choice)}")
            path = run / rundir.LOWERED_DIR / f"point{i:03d}.mlir"
            try:
                lower_for_tpu(build(i, choice), args, path, debug_info=False, topology=target.topology)
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

        import dataclasses

        limits = dataclasses.replace(limits or Limits(), fast_forward=fast_forward)
        compiled = compile_modules(runner, inputs, run / rundir.MODULES_DIR, target.topology,
                                   static_profile=static_profile, limits=limits, progress=on_compiled)
        from tpudiag.api.pipeline import report_from_modules

        _, report = report_from_modules(target, compiled, {"input": entry, "kind": "kernels-tune"}, with_llo=False,
                                        suggestions=False)
        rd.write_json(rundir.KERNELS_COMPILE_REPORT, report.to_dict())
        modules = {m.name: m for m in report.modules}
        cached = {mc.name: bool(mc.cached) for mc in compiled}
        by_point = {i: inputs[k].name for k, i in index.items()}
        rows = [tune_point(choice, modules.get(by_point.get(i)), report.target, errors.get(i),
                           cached.get(by_point.get(i), False)) for i, choice in enumerate(points)]
        if reference is not None:
            rows = _check_against(reference, rows, points, build, inputs_text, seed, progress)
        result = tune_document(entry, inputs_shown, report.to_dict()["target"], space, rows, runner.description,
                               static_profile, own, f"{reference} (seed {seed})" if reference else None
                               ).with_artifacts(
            {"run_dir": str(run), "report": rundir.REPORT, "compile_report": rundir.KERNELS_COMPILE_REPORT})
        if on_chip:
            from tpudiag.analyze.compile.tune import with_chip_times

            result = with_chip_times(result, device, chip_rows)
        rd.write_json(rundir.REPORT, result.to_dict())
        rd.finish(result.status == "ok", reason="no point compiled" if result.status != "ok" else None)
    return result, run
