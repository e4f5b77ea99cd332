"""`tpudiag kernels bench`: compile each kernel, the plain-JAX version and JAX's own kernel for a TPU
target at the kernel's production shape, and compare the TPU compiler's corrected cycle estimates.

Each variant is lowered here (Pallas -> Mosaic happens at lowering) and compiled in its own worker
process (capture/tpu_compile.py), so a variant that crashes libtpu is a failed row, not a dead bench.
Writes a run directory: `modules/` (the compiler's artifacts per variant), `lowered/` (the StableHLO),
`compile-report.json` (every op's figures) and `report.json` (schema tpudiag.kernels-bench/1).
The figures themselves are computed in analyze/kernel_bench.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from tpudiag.analyze.kernel_bench import VARIANTS, bench_document, kernel_row, variant_figures
from tpudiag.capture import rundir
from tpudiag.errors import one_line

MANIFEST_KIND = "kernels-bench"
COMPILE_REPORT = "compile-report.json"


def _variants(setup) -> list[tuple[str, object]]:
    """(variant, function) for each variant the setup has: kernel, xla, and jax where JAX has one."""
    return [(v, fn) for v, fn in zip(VARIANTS, (setup.kernel, setup.xla, setup.jax_kernel)) if fn is not None]


def _lower(fn, args, path: Path) -> None:
    import jax

    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    path.write_text(lowered.as_text(debug_info=True))


def run_bench(specs: list, target_text: str, out: Path | None = None, *, static_profile: bool = True,
              jobs: int = 2, limits=None, progress: Callable[[str], None] | None = None) -> tuple[dict, Path]:
    """Bench `specs` for `target_text`; returns (the bench document, the run directory)."""
    from tpudiag.analyze.compile_report import build_compile_report
    from tpudiag.api import _module_artifacts, _versions
    from tpudiag.capture.tpu_compile import Limits, ModuleInput, compile_modules
    from tpudiag.targets import require_libtpu, resolve_target

    target = resolve_target(target_text)
    require_libtpu()
    run = Path(out) if out else rundir.default_run_dir(Path("kernels-bench"))
    rundir.create_run_dir(run, rundir.COMPILE_SUBDIRS + ("lowered",))
    t0 = time.perf_counter()
    manifest = {"schema": rundir.MANIFEST_SCHEMA, "kind": MANIFEST_KIND, "status": "running",
                "program": "tpudiag kernels bench", "kernels": [s.name for s in specs],
                "target": target.to_dict(), "static_profile": static_profile, "versions": _versions(),
                "exit_code": None, "reason": None}
    rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
    try:
        inputs, setups, errors = [], {}, {}  # errors: (kernel, variant) -> why it has no module
        for spec in specs:
            try:
                setup = spec.bench()
            except Exception as e:  # a kernel whose bench setup fails is a failed row
                errors[(spec.name, "kernel")] = f"bench setup failed: {one_line(e)}"
                continue
            setups[spec.name] = setup
            for variant, fn in _variants(setup):
                path = run / "lowered" / f"{spec.name}.{variant}.mlir"
                if progress:
                    progress(f"lowering {spec.name}.{variant}")
                try:
                    _lower(fn, setup.args, path)
                except Exception as e:
                    errors[(spec.name, variant)] = f"lowering failed: {one_line(e)}"
                    continue
                inputs.append(ModuleInput(name=f"{spec.name}.{variant}", path=path, kind="mlir"))
        done = [0]

        def on_compiled(mc):
            done[0] += 1
            if progress:
                note = "" if mc.static_profile in ("ok", "off") else f" (static profile: {mc.static_profile[:60]})"
                progress(f"[{done[0]}/{len(inputs)}] {mc.name} {mc.status}{note}")

        results = compile_modules(inputs, run / "modules", target.topology, static_profile=static_profile,
                                  limits=limits or Limits(), jobs=jobs, progress=on_compiled)
        report = build_compile_report(target, [_module_artifacts(r) for r in results],
                                      {"input": "tpudiag kernels bench", "kind": "kernels"}).to_dict()
        rundir.write_json_atomic(run / COMPILE_REPORT, report)
        modules = {m["name"]: m for m in report["modules"]}
        rows = []
        for spec in specs:
            setup = setups.get(spec.name)
            wanted = ["kernel"] if setup is None else [v for v, _ in _variants(setup)]  # no setup: one failed row
            figures = {v: variant_figures(v, modules.get(f"{spec.name}.{v}"), report["target"],
                                          errors.get((spec.name, v))) for v in wanted}
            rows.append(kernel_row(spec.name, setup.shape if setup else "", setup.blocks if setup else None,
                                   setup.jax_name if setup else None, figures))
        doc = bench_document(report["target"], rows, static_profile)
        doc["artifacts"] = {"run_dir": str(run), "report": rundir.REPORT, "compile_report": COMPILE_REPORT}
        rundir.write_json_atomic(run / rundir.REPORT, doc)
    except BaseException as e:  # no report: the manifest must not stay "running"
        manifest.update(status="failed", exit_code=getattr(e, "exit_code", 1), reason=f"tpudiag failed: {e}"[:300])
        rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
        raise
    ok = doc["status"] == "ok"
    manifest.update(status="ok" if ok else "failed", exit_code=0 if ok else 1,
                    reason=None if ok else f"{len(doc['failed'])} kernel(s) failed: {', '.join(doc['failed'])}",
                    wall_s=round(time.perf_counter() - t0, 3))
    rundir.write_json_atomic(run / rundir.MANIFEST, manifest)
    return doc, run
