"""Every bundled kernel, at its default blocks and production shape, compiled for v5e and for v6e by
libtpu's compile-only client: the lowering and compile path of `tpudiag kernels bench`
(capture/lower.lower_for_tpu, then api/pipeline.compile_inputs in worker processes), plain (no static
LLO profile, which takes minutes per kernel), the kernel variant only; the variants at larger
blocks (a prefill chunk's) once, for the chip `_compiled_for` names.

Three checks per kernel and target: the module compiles; the compiled module holds every Mosaic
kernel the jaxpr traced (the kernel, not an XLA fallback, is what compiled); and the program's VMEM
(XLA's memory-usage report: the kernel's scoped limit plus XLA's own VMEM buffers above it) plus the
kernel's double-buffered blocks (read from the jaxpr, as tests/kernels/test_tiling.py counts them)
fits in the core's VMEM. The last is what the static-profile compile of `kernels bench` checks on
top of a plain compile: measured, rope with a 100 MiB limit compiled plain (program VMEM 104 MiB) and
failed with the static profile, "Used 128.07M of 128.00M vmem" (104 MiB plus its 24.07 MiB of
windows and spill slots counted again).

CI time: minutes of CPU (the grouped matmul, the fused MoE and the prefill variants take 10-50 s
each), so it runs on one leg: the newest jax leg (libtpu 0.0.50.1). The oldest's libtpu (0.0.42)
compiles them too (TPUDIAG_ALL_LEGS=1 runs it there).
"""

from __future__ import annotations

import re

import jax
import pytest

from tests.conftest import _only_on_leg
from tests.kernels.test_tiling import MIB, _need, _pallas_calls
from tpudiag.api.pipeline import compile_inputs
from tpudiag.capture.lower import lower_for_tpu
from tpudiag.capture.tpu_compile import ModuleInput
from tpudiag.kernels import fp8_matmul, fused_moe, int4_matmul, w8a8_matmul
from tpudiag.kernels.registry import all_specs
from tpudiag.targets import require_libtpu, resolve_target

TARGETS = ("v5e", "v6e")
_VMEM_TOTAL = re.compile(r"^Memory Space: vmem\b.*\nTotal bytes: (\d+)", re.M)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """(the lowered kernels as compile inputs, each kernel's traced Mosaic calls) at default blocks:
    lowering does not depend on the target, so it is done once."""
    _only_on_leg(newest=True, why="the bundled kernels compile for TPU on the newest jax leg only (CI time)")
    require_libtpu()
    out = tmp_path_factory.mktemp("lowered")
    inputs, calls = [], {}
    # Default blocks; a prefill chunk for the quantized matmuls, in M blocks of 512 (the 8-bit ones
    # with x quantized once per M block), fp8 at M 256 in v5e's blocks (x quantized once, in chunks of
    # K as its first N block multiplies); int4 at one row (x's int8 digits on the int8 MXU path); the
    # fused MoE at Qwen3-235B-A22B's D 4096 (its default blocks hold all of D).
    prefill = {"w8a8_matmul@m2048": w8a8_matmul.bench(m=2048), "fp8_matmul@m2048": fp8_matmul.bench(m=2048),
               "fp8_matmul@v5e-m256": fp8_matmul.bench(fp8_matmul.V5E_FP8_BLOCKS, m=256),
               "int4_matmul@m2048": int4_matmul.bench(m=2048), "int4_matmul@m1": int4_matmul.bench(m=1),
               "fused_moe@d4096": fused_moe.bench(shape={"d": 4096, "f": 1536, "tokens": 256})}
    for name, setup in [(spec.name, spec.bench()) for spec in all_specs()] + list(prefill.items()):
        calls[name] = list(_pallas_calls(jax.make_jaxpr(setup.kernel)(*setup.args_for("kernel")).jaxpr))
        path = lower_for_tpu(setup.kernel, setup.args_for("kernel"), out / f"{name}.mlir")
        inputs.append(ModuleInput(name=name, path=path, kind="mlir"))
    return inputs, calls


# Variants at a prefill chunk's larger blocks: compiled for v6e only (`_compiled_for`).
_LARGER_BLOCKS = ("@m2048", "@d4096")


def _compiled_for(name: str, chip: str) -> bool:
    """Every kernel at its production shape, and a variant that takes another kernel path (int4 at
    one row), is compiled for both chips. A variant at larger blocks (_LARGER_BLOCKS) is compiled for
    v6e only: its blocks do not depend on the chip, v5e and v6e have the same 128 MiB of VMEM a core,
    and each such compile takes 20-50 s of CPU. A variant at one chip's blocks ("@v5e-m256") is
    compiled for that chip."""
    if name.endswith(_LARGER_BLOCKS):
        return chip == "v6e"
    variant = name.split("@", 1)[1] if "@" in name else ""
    if variant.startswith(tuple(f"{t}-" for t in TARGETS)):
        return variant.startswith(f"{chip}-")
    return True


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request, lowered, tmp_path_factory):
    inputs, calls = lowered
    target = resolve_target(request.param)
    inputs = [i for i in inputs if _compiled_for(i.name, request.param)]
    run = tmp_path_factory.mktemp(f"compile-{request.param}")
    report = compile_inputs(inputs, run, target, static_profile=False, jobs=2, suggestions=False)
    return target, run, report, {i.name: calls[i.name] for i in inputs}


def test_every_kernel_compiles_and_keeps_its_mosaic_calls(compiled):
    target, _, report, calls = compiled
    by_name = {m.name: m for m in report.modules}
    assert set(by_name) == set(calls)
    failed = {n: m.error for n, m in by_name.items() if m.status != "ok"}
    assert not failed, f"{target.chip.name}: {failed}"
    for name, module in by_name.items():
        custom = {o.name.split(".")[0] for o in module.ops if o.opcode == "custom-call"}
        traced = {eqn.params["name"] for eqn in calls[name]}
        assert traced and traced <= custom, f"{name} on {target.chip.name}: traced {traced}, compiled {custom}"


def test_program_vmem_leaves_room_for_the_kernels_blocks(compiled):
    target, run, report, calls = compiled
    vmem = target.chip.vmem_bytes
    for module in report.modules:
        reports = list((run / "modules").glob(f"*-{module.name}/hlo/*memory-usage-report.txt"))
        assert reports, f"{module.name}: no memory-usage report"
        totals = [int(v) for p in reports for v in _VMEM_TOTAL.findall(p.read_text())]
        assert totals, f"{module.name}: no vmem memory space in {reports[0].name}"
        program, blocks = max(totals), max(_need(eqn) for eqn in calls[module.name])
        assert program + blocks <= vmem, (
            f"{module.name} on {target.chip.name}: program VMEM {program / MIB:.2f} MiB + blocks "
            f"{blocks / MIB:.2f} MiB > {vmem / MIB:.0f} MiB")
