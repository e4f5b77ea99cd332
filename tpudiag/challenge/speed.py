"""The speed measurement of a grade: `python -m tpudiag.challenge.speed TASK_DIR SOLUTION.py SEED
OUT.json MODE`, run by grade.py in its own process (the solution is untrusted code, and a chip
worker must hold the TPU alone).

Three variants are measured at the task's speed shapes (its `speed` spec, else its public one):
the solution, the task's ground truth and its reference jitted (what XLA makes of it). Each is
called with keyword arguments by the spec's names, `interpret=False` where it takes `interpret`;
a task with `grad` measures the forward and the VJP of every floating input together. The reference
of a task with float32 inputs is traced under `jax.default_matmul_precision("highest")`: its
float32 matmuls at the precision correctness holds the task to (XLA's TPU default rounds them to
one bf16 pass). The solution and the ground truth run as written: correctness is judged on the
CPU, where an f32 matmul is exact at any precision, so a solution that leaves an f32 matmul's
precision unset is timed with the TPU's one-pass bf16 product (docs/challenges.md says so).

MODE "static": each variant is lowered for the TPU target here and AOT-compiled with the static
profile (`tpudiag.compile`); its cycles are summed per op as `tpudiag kernels bench` sums them
(analyze/compile/kernel_bench.py: the largest of the static estimate, the HBM floor and the compute
floor), and its roofline floor beside them. MODE "chip": each variant is timed on the attached TPU
by device time (capture/chip_bench.time_functions) on the task's own input draws. Writes one JSON
document to OUT.json: {"mode", "target", "inputs", "figures": [SpeedFigure as a dict, ...]}, or
{"error": why} where nothing could be measured. Scores nothing; grade.py does.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
from pathlib import Path

from tpudiag.errors import one_line

SPEED_TARGET = "v5e"  # the chip the static figures are compiled for; the chip path times whatever is attached
CHIP_CALLS = 20  # calls timed per variant on the chip (the fastest one is the figure)


def speed_spec(task) -> str:
    return task.speed or task.public


def _bound(fn, names: tuple[str, ...], grad: bool, label: str, f32: bool):
    """fn(**inputs) as a positional function of the spec's arguments, named for its module; with
    `grad`, the forward and the VJP of every floating argument (the output as its own cotangent)."""
    import jax
    import jax.numpy as jnp

    try:
        takes = "interpret" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    extra = {"interpret": False} if takes else {}

    def forward(*args):
        return fn(**dict(zip(names, args)), **extra)

    run = forward
    if grad:
        def run(*args):
            floats = [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]

            def of_floats(*fl):
                full = list(args)
                for i, x in zip(floats, fl):
                    full[i] = x
                return forward(*full)

            out, vjp = jax.vjp(of_floats, *(args[i] for i in floats))
            return out, vjp(out)

    def measured(*args):
        # XLA's version of a float32 task at float32 precision, the task's computation: the TPU's
        # default rounds f32 matmul operands to bf16 in one pass, which the correctness rule would
        # reject. Only there: an unset precision made HIGHEST reaches bf16 dots, in a Pallas kernel
        # or in XLA's own Mosaic fusions, and Mosaic refuses them ("Bad lhs type").
        if label != "reference" or not f32:
            return run(*args)
        with jax.default_matmul_precision("highest"):
            return run(*args)

    measured.__name__ = measured.__qualname__ = f"challenge_{label}"
    return measured


def variants(task, solution: Path) -> list[tuple[str, object]]:
    """(label, positional function) for the solution, the ground truth (where the task has one) and
    the reference."""
    from tpudiag.challenge.child import load_fresh
    from tpudiag.parity import inputs as inp

    specs = inp.parse_spec(speed_spec(task))
    names, f32 = tuple(s.name for s in specs), any(s.dtype == "float32" for s in specs)
    out = [("solution", load_fresh(solution, task.function))]
    if task.ground_truth:
        path, func = task.function_of(task.ground_truth)
        out.append(("ground_truth", load_fresh(path, func)))
    out.append(("reference", load_fresh(task.reference_path, task.reference_function)))
    return [(label, _bound(fn, names, task.grad, label, f32)) for label, fn in out]


def _figure(variant: str, **kw) -> dict:
    base = {"variant": variant, "status": "ok", "error": None, "cycles": None, "floor_cycles": None,
            "min_us": None, "median_us": None}
    return {**base, **kw}


def static_figures(task, fns, sds) -> list[dict]:
    """Each variant AOT-compiled for SPEED_TARGET with the static profile: its corrected cycles and
    roofline floor (kernel_bench's per-op rules), or why it has none."""
    import tpudiag
    from tpudiag.analyze.compile.kernel_bench import op_corrected_cycles, op_floor_cycles
    from tpudiag.capture.tpu_compile import Limits

    out = []
    with tempfile.TemporaryDirectory(prefix="tpudiag-challenge-speed-") as tmp:
        for label, fn in fns:
            try:
                # every loop iteration stepped through, as `kernels bench` does: fast-forwarded loops
                # inflate a gridded kernel's cycles (api/tune.py)
                res = tpudiag.compile(fn, *sds, target=SPEED_TARGET, out=Path(tmp) / label, static_profile=True,
                                      jobs=1, limits=Limits(fast_forward=False))
            except Exception as e:  # a variant that does not lower or compile for the TPU
                out.append(_figure(label, status="failed", error=f"did not compile for {SPEED_TARGET}: "
                                                                   f"{one_line(e, 300)}"))
                continue
            report = res.report
            bad = [m.error or m.status for m in report.modules if m.status != "ok"]
            if bad or not report.modules:
                out.append(_figure(label, status="failed", error=f"did not compile for {SPEED_TARGET}: "
                                                                   f"{'; '.join(map(str, bad)) or 'no module'}"[:400]))
                continue
            t = report.target
            ops = [o for m in report.modules for o in m.ops]
            out.append(_figure(label, cycles=round(sum(op_corrected_cycles(o, t.clock_hz)[0] for o in ops)),
                               floor_cycles=round(sum(op_floor_cycles(o, t) for o in ops))))
    return out


def chip_figures(task, fns, sds, seed: int) -> tuple[str, list[dict]]:
    """(the device kind, each variant's device time on the attached TPU), on the task's own draws
    (`normal` regime, a fresh seed per argument set)."""
    import jax
    import jax.numpy as jnp

    from tpudiag.capture.chip_bench import time_functions
    from tpudiag.parity import inputs as inp
    from tpudiag.targets import resolve_target

    specs = inp.parse_spec(speed_spec(task))
    rows = {}

    def emit(row):
        if row.get("status") != "running":
            rows[row["variant"]] = row

    def arg_sets(r):
        return tuple(jnp.asarray(a) for a in inp.make_args(specs, "normal", seed + r))

    rotate = 2 * resolve_target(SPEED_TARGET).chip.vmem_bytes  # XLA keeps a buffer it read in VMEM across calls
    time_functions(task.name, [(label, fn, sds) for label, fn in fns], CHIP_CALLS, rotate, emit, None,
                   arg_sets=arg_sets)
    out = []
    for label, _ in fns:
        row = rows.get(label, {"status": "failed", "error": "not timed"})
        if row.get("status") == "ok":
            out.append(_figure(label, min_us=row["min_us"], median_us=row["median_us"]))
        else:
            out.append(_figure(label, status="failed", error=f"on the chip: {row.get('error')}"))
    return jax.devices()[0].device_kind, out


def main(argv: list[str]) -> None:
    task_dir, solution, seed, out, mode = Path(argv[0]), Path(argv[1]), int(argv[2]), Path(argv[3]), argv[4]
    if mode == "static":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # lowered here, compiled in tpudiag's worker
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from tpudiag.challenge.task import load_task
    from tpudiag.parity import inputs as inp

    task = load_task(task_dir)
    doc = {"mode": mode, "target": SPEED_TARGET, "inputs": speed_spec(task), "figures": []}
    try:
        import jax

        sds = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in inp.parse_spec(speed_spec(task)))
        fns = variants(task, solution)
        if mode == "chip":
            if jax.default_backend() != "tpu":
                raise RuntimeError(f"no TPU backend (jax's default backend is {jax.default_backend()})")
            doc["target"], doc["figures"] = chip_figures(task, fns, sds, seed)
        else:
            from tpudiag.targets import require_libtpu

            require_libtpu()
            doc["figures"] = static_figures(task, fns, sds)
    except BaseException as e:  # nothing measured: the grade says why
        doc["error"] = f"{type(e).__name__}: {one_line(e, 300)}"
    out.write_text(json.dumps(doc))


if __name__ == "__main__":
    main(sys.argv[1:])
