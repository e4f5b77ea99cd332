"""`tpudiag kernels bench`: compile each kernel, the plain-JAX version and JAX's own kernel for a TPU
target at the kernel's production shape, and compare the TPU compiler's corrected cycle estimates.
The kernels, their references and bench setups come from `tpudiag/kernels/` (`KernelSpec.bench()`).

Each variant is lowered here (Pallas -> Mosaic happens at lowering) and compiled in its own worker
process (capture/tpu_compile.py), so a variant that crashes libtpu is a failed row, not a dead bench.
Writes a run directory: `modules/` (the compiler's artifacts per variant), `lowered/` (the StableHLO),
`compile-report.json` (every op's figures) and `report.json` (schema tpudiag.kernels-bench/1); the
compile report is `pipeline.compile_inputs`'s, as for every compile.
The figures themselves are computed in analyze/compile/kernel_bench.py. The run directory goes through
`RunDir`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tpudiag.results.kernels import VARIANTS
from tpudiag.analyze.compile.kernel_bench import bench_document, kernel_row, variant_figures
from tpudiag.capture import rundir
from tpudiag.capture.process import tpu_attached
from tpudiag.capture.rundir import RunDir
from tpudiag.errors import one_line
from tpudiag.outputs import check_output_file, check_run_dir

MANIFEST_KIND = "kernels-bench"


def _variants(setup) -> list[tuple[str, object]]:
    """(variant, function) for each variant the setup has: kernel, xla, and jax where JAX has one."""
    return [(v, fn) for v, fn in zip(VARIANTS, (setup.kernel, setup.xla, setup.jax_kernel)) if fn is not None]


def specs_named(names) -> list:
    """KernelSpecs by name (all of them for no names); an unknown name is a one-line InputError."""
    from tpudiag.kernels.registry import all_specs, get_spec

    return [n if not isinstance(n, str) else get_spec(n) for n in names] if names else all_specs()


def kernels_list() -> dict:
    """`tpudiag kernels list`: the tpudiag.kernels/1 document."""
    from tpudiag.report.kernels_render import LIST_SCHEMA

    return {"schema": LIST_SCHEMA, "kernels": [s.describe() for s in specs_named(())]}


def kernel_card(name: str) -> dict:
    """`tpudiag kernels show NAME`: one kernel's tpudiag.kernels/1 entry."""
    from tpudiag.report.kernels_render import LIST_SCHEMA

    (spec,) = specs_named((name,))
    card = {"schema": LIST_SCHEMA, **spec.describe()}
    from tpudiag.kernels.measured import raw_table

    measured = raw_table("v5e")
    if spec.name in measured:  # the on-chip figure at the bench shape (bench/chip_measured.py)
        card["on_chip"] = measured[spec.name]
    return card


def kernels_verify(names, seed: int | None = None, progress=None, *, junit_path: Path | None = None,
                   on_chip: bool | None = None):
    """`tpudiag kernels verify`: every case of the named kernels (all for none) against the reference
    and float64; the JUnit XML too when `junit_path` is given. `on_chip`: True compiles them for the
    attached TPU (refused in one line without one), False runs interpret mode on the CPU, None does
    the first where a TPU is attached."""
    from tpudiag.errors import InputError
    from tpudiag.parity.kernel_cases import attached_tpu, tpu_backend_error, verify_specs

    if junit_path is not None:
        check_output_file(junit_path)  # before the cases run, not after
    specs = specs_named(names)
    if on_chip is not False:
        chip = attached_tpu()
        if on_chip and chip is None:
            raise InputError("kernels verify --on-chip: no TPU is attached to this machine (jax's devices are not "
                             "TPUs; another program holding the chip shows the same)")
        if chip is None and tpu_attached():  # the chip is there, jax cannot open it: say why, do not fall back
            raise InputError(f"kernels verify: this machine has a TPU but jax cannot use it ({tpu_backend_error()}); "
                             "another program may hold the chip; --interpret runs the cases on the CPU")
        on_chip = chip is not None
    result = verify_specs(specs, seed, progress, on_chip=on_chip)
    if junit_path is not None:
        from tpudiag.report.registry import render

        rundir.write_text_atomic(Path(junit_path), render(result, "junit"))
    return result


def kernels_bench(names, target_text: str, out: Path | None = None, *, static_profile: bool = True,
                  jobs: int = 2, limits=None, fast_forward: bool = False,
                  progress: Callable[[str], None] | None = None, on_chip: bool | None = None, calls: int = 10):
    """Bench the named kernels (or KernelSpecs; all for none) for `target_text`; returns (the
    `KernelBench` result, the run directory). The static profile steps through every loop
    iteration unless `fast_forward` (as `kernels tune`: fast-forwarded loops inflate a gridded
    kernel's cycles). `on_chip` (None: where a TPU is attached) also times every variant on the
    attached TPU, `calls` calls each (api/kernels_chip.py), before the static compile."""
    import dataclasses

    from tpudiag.analyze.compile.kernel_bench import chip_time, with_chip
    from tpudiag.errors import InputError

    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.api.pipeline import compile_inputs
    from tpudiag.capture.lower import lower_for_tpu
    from tpudiag.capture.tpu_compile import ModuleCompile, ModuleInput
    from tpudiag.targets import require_libtpu, resolve_target

    specs = specs_named(names)  # an unknown name fails before any work
    target = resolve_target(target_text)
    if on_chip is None:
        on_chip = tpu_attached()
    elif on_chip and not tpu_attached():
        raise InputError("kernels bench --on-chip: no TPU is attached to this machine (no /dev/accel* or /dev/vfio "
                         "device files)")
    require_libtpu()
    run = check_run_dir(Path(out) if out else rundir.default_run_dir(Path("kernels-bench")))
    with RunDir(run, MANIFEST_KIND, rundir.COMPILE_SUBDIRS + (rundir.LOWERED_DIR,), program="tpudiag kernels bench",
                kernels=[s.name for s in specs], target=target.to_dict(), static_profile=static_profile,
                timing="chip" if on_chip else "static") as rd:
        device, chip_rows = None, {}
        if on_chip:  # first: the worker must hold the chip alone
            from tpudiag.api.kernels_chip import chip_times

            device, chip_rows = chip_times([s.name for s in specs], target_text, calls,
                                           2 * target.chip.vmem_bytes, run, progress)
        inputs, setups, errors = [], {}, {}  # errors: (kernel, variant) -> why it has no module
        for spec in specs:
            try:
                setup = spec.bench_setup(chip=target.chip)
            except Exception as e:  # a kernel whose bench setup fails is a failed row
                errors[(spec.name, "kernel")] = f"bench setup failed: {one_line(e)}"
                continue
            setups[spec.name] = setup
            for variant, fn in _variants(setup):
                path = run / rundir.LOWERED_DIR / f"{spec.name}.{variant}.mlir"
                if progress:
                    progress(f"lowering {spec.name}.{variant}")
                try:
                    lower_for_tpu(fn, setup.args_for(variant), path, topology=target.topology,
                                  donate_argnums=tuple(setup.donate.get(variant, ())))
                except Exception as e:
                    errors[(spec.name, variant)] = f"lowering failed: {one_line(e)}"
                    continue
                inputs.append(ModuleInput(name=f"{spec.name}.{variant}", path=path, kind="mlir"))
        done = [0]

        def on_compiled(mc):
            if not isinstance(mc, ModuleCompile):  # a compile began: the count moves when it ends
                return
            done[0] += 1
            if progress:
                note = "" if mc.static_profile in ("ok", "off") else f" (static profile: {mc.static_profile[:60]})"
                progress(f"[{done[0]}/{len(inputs)}] {mc.name} {mc.status}{note}")

        # Every variant is measured as itself: a plain-JAX variant with no matmul is no setup module.
        limits = dataclasses.replace(limits or Limits(), fast_forward=fast_forward)
        compiled = compile_inputs(inputs, run, target, static_profile=static_profile, jobs=jobs, limits=limits,
                                  progress=on_compiled, source={"input": "tpudiag kernels bench", "kind": "kernels"},
                                  group_setup=False)
        report = compiled.to_dict()
        rd.write_json(rundir.KERNELS_COMPILE_REPORT, report)
        modules = {m.name: m for m in compiled.modules}
        rows = []
        for spec in specs:
            setup = setups.get(spec.name)
            wanted = ["kernel"] if setup is None else [v for v, _ in _variants(setup)]  # no setup: one failed row
            figures = {v: variant_figures(v, modules.get(f"{spec.name}.{v}"), compiled.target,
                                          errors.get((spec.name, v))) for v in wanted}
            row = kernel_row(spec.name, setup.shape if setup else "", setup.blocks if setup else None,
                             setup.jax_name if setup else None, figures)
            if on_chip:
                row = with_chip(row, {v: chip_time(r) for v, r in chip_rows.get(spec.name, {}).items()},
                                target.chip.clock_hz, static_profile)
            rows.append(row)
        result = bench_document(report["target"], rows, static_profile, device).with_artifacts(
            {"run_dir": str(run), "report": rundir.REPORT, "compile_report": rundir.KERNELS_COMPILE_REPORT})
        rd.write_json(rundir.REPORT, result.to_dict())
        rd.finish(result.status == "ok", reason=f"{len(result.failed)} kernel(s) failed: {', '.join(result.failed)}")
    return result, run
