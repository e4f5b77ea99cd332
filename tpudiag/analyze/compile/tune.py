"""A search space and its ranking, for `tpudiag kernels tune` (and any sweep of compiled points).

`parse_space("block_q=128,256,512 block_k=128..512")` -> {name: values}; `space_points` -> every
choice (the product, the first name varying slowest); `tune_point` turns one point's compiled
module (a `ModuleReport`) into a `TunePoint` with the same figures `kernels bench` reports
(`kernel_bench.variant_figures`: per op the largest of the static estimate, the HBM floor and the
compute floor); `tune_document` ranks the points. No I/O, no jax.

Ranking: fewest corrected cycles first; a tie keeps the space's order, so the same sweep always
names the same winner. A point whose figure is partly roofline floors (no static estimate for some
op) is ranked by that figure too, and `ops_floor_only` says so.
"""

from __future__ import annotations

import itertools
import re

from tpudiag.analyze.compile.kernel_bench import variant_figures
from tpudiag.errors import InputError
from tpudiag.results.compile import CompileTarget, ModuleReport
from tpudiag.results.tune import TUNE_SCHEMA, KernelTune, TunePoint

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")  # a keyword, or a program option (batch-per-device)
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
# The most points one space may have: each is a compile of seconds to minutes.
MAX_POINTS = 4096
# What the TPU compiler says when a kernel's blocks do not fit its VMEM: Mosaic's scoped-VMEM check
# ("CompileTimeScopedVmemOom: 20.47M > 16.00M"), XLA's allocator ("... memory space vmem").
_VMEM = "vmem"


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    return text


def parse_space(text: str, what: str = "--space") -> dict[str, list]:
    """`name=v1,v2,... name2=LOW..HIGH ...` -> {name: [values]} (integers where they read as
    integers; LOW..HIGH is every integer from LOW to HIGH). An InputError names the bad item."""
    space: dict[str, list] = {}
    for item in text.replace(";", " ").split():
        name, eq, values = item.partition("=")
        if not eq or not _NAME.match(name):
            raise InputError(f"{what}: {item!r} is not NAME=V1,V2,... or NAME=LOW..HIGH "
                             "(for example block_q=128,256,512)")
        if name in space:
            raise InputError(f"{what}: {name!r} is given twice")
        m = _RANGE.match(values)
        if m:
            lo, hi = int(m[1]), int(m[2])
            if lo > hi:
                raise InputError(f"{what}: {item!r}: the range's low end is above its high end")
            vals = list(range(lo, hi + 1))
        else:
            vals = [_value(v) for v in values.split(",") if v != ""]
        if not vals:
            raise InputError(f"{what}: {name!r} has no values")
        if len(set(map(repr, vals))) != len(vals):
            raise InputError(f"{what}: {name!r} lists a value twice")
        space[name] = vals
    if not space:
        raise InputError(f"{what}: the search space is empty (give NAME=V1,V2,... for each choice)")
    n = 1
    for vals in space.values():
        n *= len(vals)
    if n > MAX_POINTS:
        raise InputError(f"{what}: {n:,} points, over the {MAX_POINTS:,} one search may compile; narrow the space")
    return space


def space_points(space: dict[str, list]) -> list[dict]:
    """Every choice of the space, the first name varying slowest."""
    names = list(space)
    return [dict(zip(names, combo)) for combo in itertools.product(*(space[n] for n in names))]


def choice_text(choice: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in choice.items())


def is_out_of_vmem(error: str | None) -> bool:
    return bool(error) and _VMEM in error.lower()


def tune_point(choice: dict, module: ModuleReport | None, target: CompileTarget, error: str | None = None,
               cached: bool = False) -> TunePoint:
    """One point's row. `module`: its compiled module (None where FUNC or the lowering raised,
    `error` saying why)."""
    if module is None:
        return TunePoint(choice=dict(choice), status="error", error=error or "not lowered", corrected_cycles=None,
                         static_cycles=None, ops=0, ops_floor_only=0, bytes_accessed=0, flops=0, static_profile=None,
                         cached=False, module=None, rank=None)
    f = variant_figures("kernel", module, target, error)
    status = f.status
    if status != "ok":
        status = "out_of_vmem" if is_out_of_vmem(f.error) else "failed"
    return TunePoint(choice=dict(choice), status=status, error=f.error, corrected_cycles=f.corrected_cycles,
                     static_cycles=f.static_cycles, ops=f.ops, ops_floor_only=f.ops_floor_only,
                     bytes_accessed=f.bytes_accessed, flops=f.flops, static_profile=f.static_profile,
                     cached=cached, module=f.module, rank=None)


def verified_point(point: TunePoint, result) -> TunePoint:
    """A compiled point after `validate` (its `ValidateResult`, or the one-line error of a check that
    could not run): "pass", or status "mismatch" with the first failure's why."""
    import dataclasses

    if isinstance(result, str):
        return dataclasses.replace(point, status="mismatch", verified="fail", error=f"not checked: {result}")
    if result.ok:
        return dataclasses.replace(point, verified="pass")
    bad = result.failures[0] if result.failures else None
    why = bad.why if bad is not None else "no case was judged"
    return dataclasses.replace(point, status="mismatch", verified="fail",
                               error=f"{result.passed}/{len(result.cases)} cases passed; {why}"[:400])


def with_chip_times(tune: KernelTune, device: str, rows: dict[int, dict]) -> KernelTune:
    """`tune` with each point's on-chip time (capture/chip_bench.py rows by point index), ranked by
    its fastest call; the chip's winner, and whether the static winner is the same point."""
    import dataclasses

    points = list(tune.points)
    for i, p in enumerate(points):
        row = rows.get(i)
        if row is None:
            continue
        ok = row.get("status") == "ok"
        points[i] = dataclasses.replace(p, chip_min_us=row.get("min_us") if ok else None,
                                        chip_median_us=row.get("median_us") if ok else None,
                                        chip_error=None if ok else row.get("error", "not timed"))
    timed = sorted((i for i, p in enumerate(points) if p.chip_min_us is not None), key=lambda i: (points[i].chip_min_us, i))
    for r, i in enumerate(timed):
        points[i] = dataclasses.replace(points[i], chip_rank=r + 1)
    chip_best = dict(points[timed[0]].choice) if timed else None
    return dataclasses.replace(tune, points=tuple(points), timing="chip", device=device, chip_best=chip_best,
                               static_best_is_chip_best=None if chip_best is None or tune.best is None
                               else chip_best == tune.best,
                               metric=tune.metric + "; on the chip: device time per call, fastest of the calls")


def tune_document(program: str, inputs: str, target_doc: dict, space: dict[str, list], points: list[TunePoint],
                  runner: str, static_profile: bool, default: dict | None = None,
                  reference: str | None = None) -> KernelTune:
    """Rank the points (fewest corrected cycles first, ties in the space's order) into the document.
    `default`: the kernel's own choice (a bundled kernel's blocks), shown beside the winner."""
    ok = sorted((i for i, p in enumerate(points) if p.status == "ok" and p.corrected_cycles is not None),
                key=lambda i: (points[i].corrected_cycles, i))
    rank = {i: r + 1 for r, i in enumerate(ok)}
    ranked = tuple(TunePoint(**{**p.__dict__, "rank": rank.get(i)}) for i, p in enumerate(points))
    best = dict(points[ok[0]].choice) if ok else None
    return KernelTune(schema=TUNE_SCHEMA, program=program, inputs=inputs, target=target_doc,
                      space={k: list(v) for k, v in space.items()}, runner=runner, static_profile=static_profile,
                      metric="corrected_cycles: per op max(static estimated cycles, HBM floor, compute floor), summed",
                      status="ok" if ok else "failed", best=best, points=ranked, default=default, reference=reference)
