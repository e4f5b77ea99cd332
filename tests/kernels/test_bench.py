"""`tpudiag kernels bench` machinery on a real compile: RMSNorm at a small shape for v5e with the
static profile, its plain-JAX version, and a third variant that fails to lower (reported, not fatal)."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import pytest

from tpudiag.analyze.compile.kernel_bench import op_corrected_cycles
from tpudiag.api.kernels import kernels_bench as run_bench
from tpudiag.capture.rundir import KERNELS_COMPILE_REPORT
from tpudiag.kernels import rmsnorm
from tpudiag.kernels.spec import BenchSetup
from tpudiag.results.compile import ModuleReport
from tpudiag.results.kernels import BENCH_SCHEMA


def _broken(*args):
    raise ValueError("this variant cannot be traced")


def _small_setup(blocks=None):
    args = (jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16),
            jax.ShapeDtypeStruct((1024,), jnp.bfloat16))
    real = rmsnorm.SPEC.bench()
    return BenchSetup(shape="N512 D1024 bf16", args=args, kernel=real.kernel, xla=real.xla,
                      jax_kernel=_broken, jax_name="broken on purpose")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    spec = dataclasses.replace(rmsnorm.SPEC, bench=_small_setup)
    result, run = run_bench([spec], "v5e", tmp_path_factory.mktemp("b") / "run", static_profile=True, jobs=2)
    doc = result.to_dict()
    assert doc == json.loads((run / "report.json").read_text()), "the document is the model, as written"
    return doc, run


def test_rows_carry_the_issues_fields(bench):
    doc, run = bench
    assert doc["schema"] == BENCH_SCHEMA and (run / "report.json").is_file()
    assert (run / KERNELS_COMPILE_REPORT).is_file()
    (row,) = doc["kernels"]
    for key in ("name", "shape", "kernel_cycles", "xla_cycles", "ratio_vs_xla", "jax_cycles", "ratio_vs_jax"):
        assert key in row
    assert row["kernel_cycles"] > 0 and row["xla_cycles"] > 0
    assert row["ratio_vs_xla"] == round(row["kernel_cycles"] / row["xla_cycles"], 4)
    assert json.loads((run / "report.json").read_text()) == doc
    assert json.loads((run / "manifest.json").read_text())["status"] == "failed"  # the broken variant


def test_a_variant_that_fails_is_reported_and_the_others_are_still_measured(bench):
    doc, _ = bench
    (row,) = doc["kernels"]
    jax_v = row["variants"]["jax"]
    assert jax_v["status"] == "failed" and "this variant cannot be traced" in jax_v["error"]
    assert row["jax_cycles"] is None and row["ratio_vs_jax"] is None
    assert row["variants"]["kernel"]["status"] == "ok" and row["variants"]["xla"]["status"] == "ok"
    assert doc["status"] == "failed" and doc["failed"] == ["rmsnorm"]


def test_static_cycles_are_the_compilers_own_and_corrections_only_raise_them(bench):
    doc, run = bench
    report = json.loads((run / KERNELS_COMPILE_REPORT).read_text())
    t = report["target"]
    for module in report["modules"]:
        variant = module["name"].split(".")[-1]
        fig = doc["kernels"][0]["variants"][variant]
        # oracle: the static profile files, read by regex
        files = sorted((run / "modules").glob(f"*{module['name']}/static_profile/*.textproto"))
        if fig["static_profile"] == "ok":
            assert files
            total = sum(int(re.search(r"estimated_cycles:\s*(\d+)", f.read_text()).group(1)) for f in files)
            assert fig["static_cycles"] <= total  # the report counts executed ops only
        corrected = floors = 0.0
        for op in ModuleReport.from_dict(module).ops:
            cycles, how = op_corrected_cycles(op, t["clock_hz"])
            hbm = op.bytes_accessed if op.hbm_bytes is None else op.hbm_bytes
            floor = hbm / t["hbm_bytes_per_s"] * t["clock_hz"]
            compute = op.flops / t["peak_bf16_flops_per_s"] * t["clock_hz"]
            floors += max(floor, compute)
            # The op's time is rounded to 1e-12 s in the report: a thousandth of a cycle at ~1 GHz.
            assert cycles >= max(floor, compute) - 1e-2
            if op.estimated_cycles:
                assert cycles == pytest.approx(max(op.estimated_cycles, floor, compute), abs=1e-2)
                assert how in ("static", "hbm_floor", "compute_floor")
            else:
                assert how == "roofline"
            corrected += cycles
        assert fig["corrected_cycles"] == round(corrected)
        assert fig["floor_cycles"] == round(floors) and fig["floor_cycles"] <= fig["corrected_cycles"]


def test_the_floor_is_the_least_variant_floor_and_a_kernel_at_it_meets_the_xla_goal(bench):
    doc, _ = bench
    (row,) = doc["kernels"]
    ok = [v["floor_cycles"] for v in row["variants"].values() if v["status"] == "ok"]
    assert row["floor_cycles"] == min(ok) > 0
    assert row["kernel_vs_floor"] == round(row["kernel_cycles"] / row["floor_cycles"], 4) >= 1.0
    assert row["xla_vs_floor"] == round(row["xla_cycles"] / row["floor_cycles"], 4) >= 1.0
    assert row["goal_vs_floor"] == 1.05
    assert row["meets_xla_goal"] == (row["ratio_vs_xla"] <= row["goal_vs_xla"]
                                     or row["kernel_vs_floor"] <= row["goal_vs_floor"])


def test_the_pallas_kernels_hbm_floor_is_its_own_cost_estimate(bench):
    _, run = bench
    report = json.loads((run / KERNELS_COMPILE_REPORT).read_text())
    kernel = next(m for m in report["modules"] if m["name"] == "rmsnorm.kernel")
    calls = [o for o in kernel["ops"] if o["opcode"] == "custom-call"]
    assert calls
    hlo = next((run / "modules").glob("*rmsnorm.kernel/hlo/*after_optimizations.txt")).read_text()
    declared = [int(b) for b in re.findall(r'"bytes_accessed":"(\d+)"', hlo)]
    assert sorted(o["bytes_accessed"] for o in calls) == sorted(declared)


def _no_xla_setup(blocks=None):
    return dataclasses.replace(_small_setup(blocks), xla=_broken, jax_kernel=None, jax_name=None)


def test_a_row_whose_xla_variant_failed_renders_in_every_format(tmp_path):
    # XLA's lowering of a reference can fail where the kernel compiles (a gather that does not fit
    # HBM at a long prefill chunk): the row keeps its kernel figures and its floor, without XLA's ratio.
    import io

    from rich.console import Console

    from tpudiag.report.registry import formats, render, renderer

    spec = dataclasses.replace(rmsnorm.SPEC, bench=_no_xla_setup)
    result, _ = run_bench([spec], "v5e", tmp_path / "run", static_profile=False, jobs=1)
    (row,) = result.kernels
    assert row.kernel_cycles and row.xla_cycles is None and row.xla_vs_floor is None
    assert row.floor_cycles and row.kernel_vs_floor
    md = render(result, "md")
    assert f"ours {row.kernel_vs_floor:.2f}x)" in md and "XLA" not in md.split("\n")[-2]
    for fmt in formats(result):
        if fmt == "terminal":
            out = io.StringIO()
            renderer(result, fmt)(result, Console(file=out, width=200))
            assert "rmsnorm" in out.getvalue()
        else:
            assert render(result, fmt)


def _uncosted_scale(x, y, w):
    """x * w in a Pallas call that declares no cost estimate (as JAX's ragged paged attention)."""
    from jax.experimental import pallas as pl

    def body(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...] * w_ref[...]

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, w.reshape(1, -1))


def _uncosted_setup(blocks=None):
    return dataclasses.replace(_small_setup(blocks), jax_kernel=_uncosted_scale, jax_name="no cost estimate")


def test_a_variant_counting_no_flops_is_left_out_of_the_floor_and_said_so(tmp_path):
    from tpudiag.report.registry import render

    spec = dataclasses.replace(rmsnorm.SPEC, bench=_uncosted_setup)
    result, _ = run_bench([spec], "v5e", tmp_path / "run", static_profile=False, jobs=1)
    (row,) = result.kernels
    v = row.variants
    assert v["jax"].status == "ok" and v["jax"].flops == 0 and v["kernel"].flops > 0
    assert row.floor_cycles == min(v["kernel"].floor_cycles, v["xla"].floor_cycles)
    assert v["jax"].floor_cycles < row.floor_cycles  # the least of the three, were it counted
    assert "jax counts no FLOPs (a Pallas call without a cost estimate)" in render(result, "md")
