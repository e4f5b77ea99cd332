"""`tpudiag plan FILE.py:FUNC --target v5e:2x4 --mesh-axes fsdp,tensor --search "remat=full,minimal"`:
the meshes that divide a slice over the given axes, times the choices FUNC exposes, each estimated
as `tpudiag estimate` would (capture/estimate_worker.py lowers it, the compile-only client compiles
it), ranked by tokens/s per device.

A candidate's choice reaches the program as arguments (`--remat full` after a FILE.py:FUNC program's
own; `remat_policy=full` and `ici_fsdp_parallelism=N` for `maxtext:MODEL`). A candidate the compiler
says does not fit in HBM is a row ("does_not_fit", with the compiler's figures) and is never ranked
above one that fits; one whose FUNC, lowering or compile fails is a row too ("failed"). Candidates are
estimated without matmul probes (no matmul compiled alone; the step's compute-bound matmuls take the
compiler's convolution cost model from its own HLO): the ranking compares configurations of one
program, and the winner's `tpudiag estimate` command (`reproduce`) times it with probes too.

Writes a run directory: `candidates/NNN/` (each candidate's whole estimate run) and `report.json`
(tpudiag.plan/1). Everything the command line gave is checked before it exists: the space, the mesh
axes (against what FUNC declares, or MaxText's `ici_*_parallelism` settings), the entry, the target.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from pathlib import Path
from typing import Callable

from tpudiag.capture import rundir
from tpudiag.capture.rundir import RunDir
from tpudiag.errors import InputError, TpudiagError, one_line
from tpudiag.outputs import check_run_dir

MANIFEST_KIND = "plan"
CANDIDATES_DIR = "candidates"
_AXIS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_axes(text: str) -> list[str]:
    axes = [a.strip() for a in (text or "").split(",") if a.strip()]
    if not axes:
        raise InputError("--mesh-axes: no axis given (e.g. fsdp,tensor)")
    for a in axes:
        if not _AXIS.match(a):
            raise InputError(f"--mesh-axes: {a!r} is not an axis name")
    if len(set(axes)) != len(axes):
        raise InputError(f"--mesh-axes {text}: an axis is given twice")
    return axes


def declared_axes(path: Path) -> tuple[str, ...] | None:
    """The mesh axes a FUNC program declares (`MESH_AXES = ("fsdp", "tensor")` at module level),
    read without running it; None when it declares none."""
    node = _module_assign(path, "MESH_AXES")
    if node is None:
        return None
    try:
        return tuple(str(v) for v in ast.literal_eval(node))
    except ValueError:
        return None


def _module_assign(path: Path, name: str):
    """The value node of `NAME = ...` at FUNC's module level, or None."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError, OSError) as e:
        raise InputError(f"{path}: cannot be read as Python ({one_line(e, 200)})") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    return None


def declared_remat(path: Path) -> tuple[str, ...]:
    """The remat choices a FUNC program offers as `--remat NAME`: the string keys of its module-level
    `REMAT = {"full": ..., "minimal": ...}` dict, read without running it."""
    node = _module_assign(path, "REMAT")
    if not isinstance(node, ast.Dict):
        return ()
    return tuple(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))


def check_func(path: Path, func: str) -> None:
    """FUNC, read without running `path`, is what estimate calls as FUNC(argv, mesh): bound at the
    module level (a def, an assignment, an import), not a literal value nor a module, and a plain def
    takes (argv, mesh). What cannot be told without running it (a decorated def, an imported name, a
    computed value) is left to the estimate worker. An InputError names the file and the problem,
    before any candidate runs: each would fail the same way (plan FILE.py:CONSTANT ran them all, then
    said "no candidate fits")."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError, OSError) as e:
        raise InputError(f"{path}: cannot be read as Python ({one_line(e, 200)})") from None
    bound = None  # the last module-level statement binding FUNC
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == func:
            bound = node
        elif isinstance(node, ast.Assign) and any(_binds(t, func) for t in node.targets):
            bound = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == func:
            bound = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == func for a in node.names):
            bound = node
    if bound is None:
        raise InputError(f"{path}: no function {func!r} at its module level")
    calls = f"plan calls {func}(argv, mesh)"
    if isinstance(bound, ast.Import):
        raise InputError(f"{path}: {func} is a module, not a function; {calls}")
    if isinstance(bound, (ast.Assign, ast.AnnAssign)) and bound.value is not None:
        try:
            value = ast.literal_eval(bound.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return  # computed: only running it tells
        target = bound.target if isinstance(bound, ast.AnnAssign) else next(t for t in bound.targets
                                                                            if _binds(t, func))
        if isinstance(target, (ast.Tuple, ast.List)):  # `BATCH, D_IN = 128, 512`: FUNC's own element
            names = [t.id if isinstance(t, ast.Name) else None for t in target.elts]
            if func not in names or not isinstance(value, (tuple, list)) or len(value) != len(names):
                return
            value = value[names.index(func)]
        raise InputError(f"{path}: {func} is not a function ({type(value).__name__} value); {calls}")
    if isinstance(bound, (ast.FunctionDef, ast.AsyncFunctionDef)) and not bound.decorator_list:
        _check_signature(path, func, bound)


def _binds(target, name: str) -> bool:
    """An assignment target binds `name` (`name = ...`, or `a, name = ...`)."""
    if isinstance(target, ast.Name):
        return target.id == name
    return isinstance(target, (ast.Tuple, ast.List)) and any(_binds(t, name) for t in target.elts)


def _check_signature(path: Path, func: str, node) -> None:
    """A plain def FUNC binds (argv, mesh): checked on a stub with its parameters (defaults None, no
    annotations), as the estimate worker checks the real function with `inspect.signature`."""
    import inspect

    args = ast.parse(f"def f({ast.unparse(node.args)}): pass").body[0].args
    for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if a is not None:
            a.annotation = None
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    stub = ast.Module([ast.FunctionDef("stub", args, [ast.Pass()], [], None, lineno=1)], [])
    scope: dict = {}
    exec(compile(ast.fix_missing_locations(stub), str(path), "exec"), scope)  # the parameters alone: no code of FILE
    try:
        inspect.signature(scope["stub"]).bind([], None)
    except TypeError as e:
        raise InputError(f"{path}: {func}({ast.unparse(node.args)}) cannot be called as {func}(argv, mesh): "
                         f"{e}") from None


# MaxText's remat policies searched by a plain plan (its `remat_policy` names).
MAXTEXT_REMAT = ("full", "minimal", "save_qkv_proj", "save_dot_except_mlpwi")


def default_space(path: Path, argv: list[str], maxtext: bool) -> dict[str, list]:
    """What a plain `plan` (no --search) searches: the program's remat choices, unless its arguments
    already fix one."""
    if maxtext:
        return {} if any(a.startswith("remat_policy=") for a in argv) else {"remat_policy": list(MAXTEXT_REMAT)}
    if any(a == "--remat" or a.startswith("--remat=") for a in argv):
        return {}
    remat = declared_remat(path)
    return {"remat": list(remat)} if remat else {}


def maxtext_axes() -> tuple[str, ...] | None:
    """The mesh axes MaxText takes (`ici_AXIS_parallelism` in its base.yml), without importing it;
    None when maxtext is not installed (its estimate then says so)."""
    spec = importlib.util.find_spec("maxtext")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations))) / "configs" / "base.yml"
    if not base.is_file():
        return None
    return tuple(re.findall(r"^ici_([a-z_]+)_parallelism:", base.read_text(), re.M))


def _check_axes(axes: list[str], accepted: tuple[str, ...] | None, entry: str) -> None:
    if accepted is None:
        return
    unknown = [a for a in axes if a not in accepted]
    if unknown:
        raise InputError(f"--mesh-axes: {entry} takes no mesh axis {', '.join(map(repr, unknown))} "
                         f"(it takes: {', '.join(accepted)})")


def _reproduce(entry: str, target_text: str, mesh: dict[str, int], argv: list[str], maxtext: bool) -> str:
    from tpudiag.analyze.plan import mesh_text

    cmd = ["tpudiag", "estimate", entry, "--target", target_text]
    if not maxtext:
        cmd += ["--mesh", mesh_text(mesh)]
    return shlex.join(cmd + (["--", *argv] if argv else []))


def estimate_into(out_dir: Path, entry: str, target_text: str, argv: list[str], mesh: str | None,
                  compile_timeout_s: float, calibration=None) -> dict:
    """A sweep task: one candidate's whole estimate run in `out_dir`; its document, or
    {"error": why} when FUNC refused or raised (the run keeps its log)."""
    from tpudiag.api.estimate import estimate

    try:
        _, est = estimate(entry, target_text, argv, out_dir, mesh=mesh, compile_timeout_s=compile_timeout_s,
                          matmul_probes=False, cost_model=True, calibration=calibration)
    except TpudiagError as e:
        return {"error": str(e).splitlines()[0][:300]}
    return est.to_dict()


def _measured(doc, path: Path, func: str, argv: list[str], maxtext: bool, progress) -> dict:
    """The best candidate's step run on the attached chip, beside its estimate."""
    from tpudiag.analyze.plan import candidate_argv
    from tpudiag.api.measured_step import measure_step

    best = doc.candidates[doc.best]
    if progress:
        progress("running the best candidate's step on the chip (the measured check)")
    got = measure_step(path.resolve(), func, candidate_argv(argv, best.choice, best.mesh, maxtext), best.mesh)
    return {**got, "estimated_s": best.step_s}


def plan(entry: str, target_text: str, argv=(), out: Path | None = None, *, mesh_axes: str | None = None,
         search: str | None = None, jobs: int | None = None, ray_address: str | None = None,
         compile_timeout_s: float = 1800.0, progress: Callable[[str], None] | None = None, calibration=None,
         measure: bool | None = None):
    """Plan `entry` on `target_text`; returns (the run directory, the `Plan`). `mesh_axes` None: the
    program's own MESH_AXES (fsdp,tensor for MaxText; fsdp where it declares none); `search` None:
    its remat choices (`default_space`). `calibration`: as `estimate`'s. `measure`: run the best
    candidate's step on the attached chip and record its time beside the estimate (None: where a TPU
    is attached and the slice is one chip)."""
    from tpudiag.analyze.compile.tune import parse_space, space_points
    from tpudiag.analyze.plan import MAX_CANDIDATES, candidate_argv, candidate_row, mesh_shapes, mesh_text, plan_document
    from tpudiag.api.estimate import maxtext_model, parse_entry
    from tpudiag.capture.sweep import Task, runner_for
    from tpudiag.results.estimate import EstimateReport
    from tpudiag.targets import require_libtpu, resolve_target

    path, _func = parse_entry(entry)
    maxtext = maxtext_model(entry) is not None
    if not maxtext:
        check_func(path, _func)
    declared = maxtext_axes() if maxtext else declared_axes(path)
    if mesh_axes is None:
        mesh_axes = "fsdp,tensor" if maxtext else ",".join(declared or ("fsdp",))
    axes = parse_axes(mesh_axes)
    _check_axes(axes, declared, entry)
    space = parse_space(search, "--search") if search is not None else default_space(path, list(argv), maxtext)
    target = resolve_target(target_text)
    if measure and (maxtext or not target.single_chip):
        raise InputError("--measure: the measured check runs the best step on the attached chip, so it needs a "
                         + ("FILE.py:FUNC step (maxtext:MODEL is lowered, not run)" if maxtext else
                            f"one-chip target (v5e:1x1), not {target.topology}"))
    if measure:
        from tpudiag.capture.process import tpu_attached

        if not tpu_attached():
            raise InputError("--measure: no TPU attached here (the measured check runs the best step on the chip)")
    devices = (target.megacore() if maxtext and target.chip.name == "v4" else target).model_devices
    meshes = mesh_shapes(devices, axes)
    choices = space_points(space) if space else [{}]
    points = [(m, c) for m in meshes for c in choices]
    if len(points) > MAX_CANDIDATES:
        raise InputError(f"plan: {len(meshes)} meshes x {len(choices)} choices = {len(points):,} candidates, over the "
                         f"{MAX_CANDIDATES} one plan may estimate; narrow --mesh-axes or --search")
    require_libtpu()
    runner = runner_for(ray_address, jobs)
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(Path(f"plan-{path.stem}")))
    argv = list(argv)
    program = entry if maxtext else f"{path.resolve()}:{_func}"  # by its absolute path: a Ray node runs it too
    with RunDir(run, MANIFEST_KIND, (CANDIDATES_DIR,), program=entry, argv=[entry, *argv],
                target=target.to_dict()) as rd:
        cal_arg = calibration if calibration in (None, False) else str(calibration)  # a Ray task's argument
        tasks = [Task(f"{k:03d}", estimate_into,
                      (program, target_text, candidate_argv(argv, c, m, maxtext), None if maxtext else mesh_text(m),
                       compile_timeout_s, cal_arg), run / CANDIDATES_DIR / f"{k:03d}")
                 for k, (m, c) in enumerate(points)]
        rows: dict[int, object] = {}

        def done(k: int, result) -> None:
            mesh, choice = points[k]
            rel = f"{CANDIDATES_DIR}/{k:03d}"
            if isinstance(result, BaseException):
                rows[k] = candidate_row(mesh, choice, None, rel, f"task failed: {one_line(result, 300)}")
            elif "error" in result:
                rows[k] = candidate_row(mesh, choice, None, rel, result["error"])
            else:
                rows[k] = candidate_row(mesh, choice, EstimateReport.from_dict(result, rel), rel)
            if progress:
                row = rows[k]
                how = row.status if row.status != "ok" else f"{row.tokens_per_s_per_device:,.0f} tokens/s/device"
                shown = " ".join(f"{a}={b}" for a, b in choice.items())
                progress(f"[{len(rows)}/{len(points)}] {mesh_text(mesh)} {shown}: {how}")

        runner.run(tasks, on_done=done)
        ordered = [rows[k] for k in range(len(points))]
        doc = plan_document(entry, argv, target.to_dict(), axes, space, ordered, runner.description,
                            lambda c: _reproduce(entry, target_text, c.mesh,
                                                 candidate_argv(argv, c.choice, c.mesh, maxtext), maxtext))
        if measure is None:
            from tpudiag.capture.process import tpu_attached

            measure = tpu_attached() and target.single_chip and not maxtext
        if measure and doc.best is not None:
            doc = doc.with_measured(_measured(doc, path, _func, argv, maxtext, progress))
        doc = doc.with_artifacts({"run_dir": str(run), "report": rundir.REPORT, "candidates": CANDIDATES_DIR})
        rd.write_json(rundir.REPORT, doc.to_dict())
        rd.finish(doc.status == "ok", reason=None if doc.status == "ok" else "no candidate fits")
    return run, doc
