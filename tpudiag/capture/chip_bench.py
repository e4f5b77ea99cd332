"""Time bench variants on the attached TPU by device time: the worker `tpudiag kernels bench` starts
on a machine with a TPU (`python -m tpudiag.capture.chip_bench REQUEST.json RESULTS.jsonl`).

For each kernel of the request, each variant of its bench setup (ours, XLA's, JAX's own) is jitted
under its own name, called once (the compile) and once per argument set (warm-up), then called
`calls` times under the profiler, rotating argument sets, in a trace of its own. The time of a call
is its module's span on the device (the trace's "XLA Modules" line, parse/device_planes.py): what the
chip spent, without the host's dispatch. Two variants that compile to the same program share one
executable, which the runtime names after the first of them (a challenge graded with its own ground
truth as the solution; two tune points the kernel clamps to the same blocks): in a variant's own
trace, the runs of any variant's module are its runs. Argument sets are rotated so that together
they exceed `rotate_bytes` (twice VMEM): XLA keeps a buffer it has already read in VMEM across
calls, which a model's next layer (a different weight) never gets.

A request names "kernels" (their bench setups, `kernels bench`), a "tune" (one kernel's block
points, `kernels tune`) or "at_shapes" (`suggest --measure`: each suggestion's kernel and its XLA
twin at the program's matched shapes, built again here from the kernel's name and the match's
shapes by kernels/at_shapes.py; one "kernel" per suggestion, its request "id").

Writes one JSON line per variant to RESULTS.jsonl as it goes (`{"kernel", "variant", "status", ...}`)
and a first line `{"device": KIND}`; each variant's trace goes under the request's "traces"
directory (KERNEL/VARIANT), so a runtime fault ends only the variant it hit: the parent sees which
variant was running and starts this worker again for the rest. Exit 3: no TPU backend
(the reason on stderr, one line).
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tpudiag.errors import one_line

EXIT_NO_TPU = 3
HBM_BUDGET = 4 << 30  # argument sets of one variant stay under this


def argument_sets(set_bytes: int, rotate_bytes: int) -> int:
    """How many argument sets to rotate: together over `rotate_bytes`, at least 2, at most 64, and
    within `HBM_BUDGET`."""
    k = max(2, math.ceil(rotate_bytes / max(set_bytes, 1)))
    return max(1, min(k, 64, HBM_BUDGET // max(set_bytes, 1)))


def named(fn, name: str):
    def call(*args):
        return fn(*args)

    call.__name__ = call.__qualname__ = name
    return call


def _module_runs(trace_dir: Path, modules: set[str]) -> dict[str, list[int]]:
    """Device durations in ns of each of `modules`' runs in the trace written under `trace_dir`."""
    from tpudiag.parse.device_planes import read_device_planes

    paths = sorted(trace_dir.rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not paths:
        return {}
    planes = read_device_planes(paths[-1], paths[-1].read_bytes())
    if planes is None:
        return {}
    runs = planes.module_runs
    return {m: runs.loc[runs["module"] == m, "duration_ns"].astype(int).tolist() for m in modules}


def runs_of(module: str, runs: dict[str, list[int]]) -> tuple[str, list[int]]:
    """(the module that ran, its runs) for a variant jitted as `module`, from the runs of each bench
    module in the variant's own trace: its own name's, else the one other name that ran (the
    executable it shares with an earlier variant of the same program), else none."""
    if runs.get(module):
        return module, runs[module]
    ran = [(m, r) for m, r in runs.items() if r]
    return ran[0] if len(ran) == 1 else (module, [])


def time_kernel(spec, chip, calls: int, rotate_bytes: int, emit, trace_root: Path | None = None) -> None:
    """Time every variant of `spec`'s bench setup on the chip; `emit(row)` each variant's row. The
    trace is kept under `trace_root`/KERNEL where given (for XProf: where each call's time goes)."""
    try:
        setup = spec.bench_setup(chip=chip)
    except Exception as e:
        emit({"kernel": spec.name, "variant": "kernel", "status": "failed", "error": f"bench setup failed: {one_line(e)}"})
        return
    items = [(v, fn, setup.args_for(v)) for v, fn in (("kernel", setup.kernel), ("xla", setup.xla),
                                                       ("jax", setup.jax_kernel)) if fn is not None]
    time_functions(spec.name, items, calls, rotate_bytes, emit, None if trace_root is None else trace_root / spec.name)


def time_points(spec, chip, points: list, candidates: bool, calls: int, rotate_bytes: int, emit,
                trace_root: Path | None = None) -> None:
    """`kernels tune` on the chip: `spec`'s kernel at each (i, choice) of `points` (its block
    candidate `i` where `candidates`, else its default blocks with the choice's fields replaced),
    as variants "pointNNN"."""
    import dataclasses

    items = []
    for i, choice in points:
        label = f"point{i:03d}"
        try:
            blocks = (spec.block_candidates[i] if candidates
                      else dataclasses.replace(type(spec.block_candidates[0])(), **choice))
            setup = spec.bench_setup(blocks, chip)
            items.append((label, setup.kernel, setup.args_for("kernel")))
        except Exception as e:  # block sizes the kernel refuses
            emit({"kernel": spec.name, "variant": label, "calls": calls, "status": "failed", "error": one_line(e, 300)})
    time_functions(spec.name, items, calls, rotate_bytes, emit, None if trace_root is None else trace_root / spec.name)


def time_functions(kernel: str, items: list, calls: int, rotate_bytes: int, emit, trace_dir: Path | None,
                   inputs: str | None = None, arg_sets=None) -> None:
    """Time each (label, function, ShapeDtypeStructs) of `items` on the chip with inputs for kernel
    `kernel` (kernels/bench_inputs.py; by the rule `inputs` where given; `arg_sets(r)` gives argument
    set r itself where given: a challenge task's own draws), all in one trace; `emit` a row per
    label."""
    import jax

    from tpudiag.kernels.bench_inputs import bench_inputs, nbytes

    ready, rows = [], {}
    for label, fn, sds in items:
        row = rows[label] = {"kernel": kernel, "variant": label, "calls": calls}
        emit({**row, "status": "running"})
        try:
            k = argument_sets(nbytes(sds), rotate_bytes)
            sets = [arg_sets(r) if arg_sets is not None else bench_inputs(inputs or kernel, sds, jax.random.key(r))
                    for r in range(k)]
            name = f"tpudiag_bench_{kernel}_{label}"
            jf = jax.jit(named(fn, name))
            t = time.perf_counter()
            jax.block_until_ready(jf(*sets[0]))
            row["first_call_s"] = round(time.perf_counter() - t, 2)
            for s in sets:  # warm: every set's buffers written, the executable loaded
                jax.block_until_ready(jf(*s))
            row["buffers"] = k
            ready.append((label, jf, sets, "jit_" + name))
        except Exception as e:
            emit({**row, "status": "failed", "error": one_line(e, 500)})
    if not ready:
        return
    names = {m for *_, m in ready}
    with tempfile.TemporaryDirectory(prefix="tpudiag-chip-bench-") as tmp:
        root = Path(tmp) if trace_dir is None else trace_dir
        for label, jf, sets, module in ready:
            where = root / label
            where.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(where))
            try:
                t = time.perf_counter()
                outs = [jf(*sets[c % len(sets)]) for c in range(calls)]
                jax.block_until_ready(outs)
                rows[label]["wall_us"] = round((time.perf_counter() - t) / calls * 1e6, 1)
                del outs
            finally:
                jax.profiler.stop_trace()
            ran_as, runs = runs_of(module, _module_runs(where, names))
            row = rows[label]
            if not runs:
                emit({**row, "status": "failed", "error": f"the trace holds no run of {module}"})
                continue
            us = [d / 1e3 for d in runs]
            emit({**row, "status": "ok", "runs": len(us), "min_us": round(min(us), 2),
                  "median_us": round(statistics.median(us), 2), "run_us": [round(u, 2) for u in us],
                  **({"ran_as": ran_as} if ran_as != module else {})})
    ready.clear()
    gc.collect()


def time_at_shapes(item: dict, calls: int, rotate_bytes: int, emit, trace_root: Path | None = None) -> None:
    """`suggest --measure`: a suggestion's kernel and its XLA twin at the program's matched shapes
    (`item`: an `at_shapes.request` with its "id"), as variants "kernel" and "xla" of kernel `id`."""
    from tpudiag.kernels.at_shapes import from_request

    try:
        s = from_request(item)
    except Exception as e:
        s = f"building it failed: {one_line(e)}"
    if isinstance(s, str):
        emit({"kernel": item["id"], "variant": "kernel", "calls": calls, "status": "failed", "error": s})
        return
    items = [(v, fn, s.args) for v, fn in (("kernel", s.fn), ("xla", s.xla)) if fn is not None]
    time_functions(item["id"], items, calls, rotate_bytes, emit, None if trace_root is None else trace_root / item["id"],
                   inputs=s.inputs or s.kernel)


def start_worker(argv: list[str]):
    """A chip worker's first steps: die with tpudiag, read REQUEST.json, open the TPU. (request, the
    RESULTS path, the TPU devices), or None where there is no TPU (its reason printed on stderr)."""
    from tpudiag.parent_death import die_with_parent

    die_with_parent()
    request, out = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    import jax

    try:
        return request, out, jax.devices("tpu")
    except RuntimeError as e:
        print(one_line(e, 400), file=sys.stderr)
        return None


def main(argv: list[str]) -> int:
    started = start_worker(argv)
    if started is None:
        return EXIT_NO_TPU
    request, out, devices = started
    from tpudiag.kernels.registry import get_spec
    from tpudiag.targets import resolve_target

    chip = resolve_target(request["target"]).chip
    with out.open("a") as f:
        def emit(row):
            f.write(json.dumps(row) + "\n")
            f.flush()

        emit({"device": devices[0].device_kind})
        traces = Path(request["traces"]) if request.get("traces") else None
        for item in request.get("at_shapes", ()):  # suggest --measure: kernels at a program's shapes
            time_at_shapes(item, request["calls"], request["rotate_bytes"], emit, traces)
        if tune := request.get("tune"):  # kernels tune: one kernel's points
            time_points(get_spec(tune["kernel"]), chip, tune["points"], tune["candidates"], request["calls"],
                        request["rotate_bytes"], emit, traces)
            return 0
        for name in request.get("kernels", ()):
            time_kernel(get_spec(name), chip, request["calls"], request["rotate_bytes"], emit, traces)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
