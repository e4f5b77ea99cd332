"""The MXU work of a Pallas kernel read from its own body: JAX's splash attention (causal, forward and
backward, no cost estimate of its own, two layers under `lax.scan`) compiled for v6e by `tpudiag
estimate` (fixture `estimate_splash`, fixtures/programs/tpu_splash.py, both artifact sets), its grid
steps decided by the block masks the step holds as constants and hands through its loops."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import ARTIFACT_SETS, set_versions, skip_if_newer_than_this_xla
from tpudiag.analyze.compile.kernel_body import STEP_PROBE, kernel_body, kernel_work, step_probe
from tpudiag.analyze.compile.kernel_passes import kernel_works, table_source
from tpudiag.api.estimate_probes import kernel_tables
from tpudiag.api.pipeline import compile_run_artifacts

pytest.importorskip("jaxlib.mlir")

HEADS, SEQ, DIM, BLOCK, LAYERS = 4, 8192, 128, 2048, 2  # the fixture's arguments (regenerate.py: ESTIMATE)
BLOCKS = SEQ // BLOCK
# a causal mask's blocks that hold any unmasked score: the diagonal and below
ACTIVE = sum(1 for i in range(BLOCKS) for j in range(BLOCKS) if j <= i)
ONE_MATMUL = 2 * BLOCK * BLOCK * DIM  # one block's [BLOCK, DIM] x [DIM, BLOCK] (or its transpose)
# matmuls per grid step of each kernel: forward QK^T and PV; dK/dV recomputes QK^T and P, then dV, dP
# and dK; dQ recomputes QK^T, then dP and dQ
MATMULS = {"splash_mha_fwd_residuals": 2, "splash_mha_dkv_no_residuals": 4, "splash_mha_dq_no_residuals": 3}


def _run(leg):
    """The leg's fixture run; skipped where this jax is older than the one that wrote it (an older
    Mosaic cannot read a newer kernel body: `test_a_newer_body_than_these_bindings_gives_no_figure`)."""
    run = ARTIFACT_SETS[leg] / "estimate_splash"
    skip_if_newer_than_this_xla(run)
    return run


def _kernels(hlo):
    return {i.name.rsplit(".", 1)[0]: i for i in hlo.instructions()
            if i.opcode == "custom-call" and i.custom_call_target == "tpu_custom_call"}


def _tables(run, hlo, instr):
    (tables_file,) = (run / "modules").glob("*/kernel_tables.json")
    values = json.loads(tables_file.read_text())
    return [values.get(table_source(hlo, hlo.operand(instr, k)) or "") for k in range(len(instr.operands))]


@pytest.mark.parametrize("leg", sorted(ARTIFACT_SETS))
def test_splash_kernels_work_is_their_matmuls_over_the_blocks_the_causal_mask_keeps(leg):
    arts, _ = compile_run_artifacts(_run(leg), with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    kernels = _kernels(hlo)
    assert set(kernels) == set(MATMULS)
    for name, instr in kernels.items():
        # in a loop's body: the tables come through the loop's tuple, unchanged, from constants
        assert hlo.instruction(instr.operands[1], instr.computation).opcode != "constant"
        assert hlo.instruction(table_source(hlo, hlo.operand(instr, 1))).opcode == "constant"
        body = kernel_body(instr.backend_config)
        work = kernel_work(body, _tables(_run(leg), hlo, instr))
        dense = HEADS * BLOCKS * BLOCKS * MATMULS[name] * ONE_MATMUL
        assert (work.steps, work.matmuls, work.guarded, work.resolved) == (HEADS * BLOCKS * BLOCKS, MATMULS[name],
                                                                           True, True)
        assert work.dense_flops == dense
        assert work.flops == HEADS * ACTIVE * MATMULS[name] * ONE_MATMUL  # 10 of 16 blocks
        assert work.active == HEADS * ACTIVE
        # without the tables' values every grid step is counted, and the work says so
        blind = kernel_work(body)
        assert (blind.flops, blind.resolved, blind.active) == (dense, False, blind.steps)


@pytest.mark.parametrize("leg", sorted(ARTIFACT_SETS))
def test_a_loop_element_that_changes_is_not_a_table(leg):
    """The loop's counter (element 0 of the scan's tuple, incremented by the body) is not followed
    back to its init; a constant outside any loop is itself."""
    arts, _ = compile_run_artifacts(_run(leg), with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    instr = _kernels(hlo)["splash_mha_fwd_residuals"]
    body = hlo.computations[instr.computation]
    counter = next(i for i in body.instructions if i.opcode == "get-tuple-element" and i.index == 0
                   and hlo.operand(i, 0).opcode == "parameter")
    assert table_source(hlo, counter) is None
    constant = hlo.instruction(table_source(hlo, hlo.operand(instr, 1)))
    assert table_source(hlo, constant) == constant.name
    assert table_source(hlo, None) is None


def test_a_newer_body_than_these_bindings_gives_no_figure():
    """jax 0.10.2's Mosaic cannot read the splash bodies jax 0.12 wrote: no figure, no error (the
    op keeps its time); jax 0.12 reads both sets (the other tests)."""
    import importlib.metadata as md

    newest = set_versions("jax-0.12")["jaxlib"]
    if md.version("jaxlib").split(".")[:2] == newest.split(".")[:2]:
        pytest.skip("this jaxlib wrote the newest set and reads it")
    arts, _ = compile_run_artifacts(ARTIFACT_SETS["jax-0.12"] / "estimate_splash", with_llo=False, suggestions=False)
    for instr in _kernels(arts[0].hlo).values():
        assert kernel_work(kernel_body(instr.backend_config)) is None


def test_a_body_that_cannot_be_read_gives_no_figure():
    assert kernel_body({"custom_call_config": {"body": "not base64!"}}) is None
    assert kernel_body({"flag_configs": []}) is None
    assert kernel_work(b"MLIR but not really") is None


@pytest.mark.parametrize("leg", sorted(ARTIFACT_SETS))
def test_the_estimate_times_each_splash_kernel_by_its_mxu_work(leg, tmp_path):
    from tpudiag.analyze.compile.estimate_passes import hbm_outside_vmem
    from tpudiag.analyze.compile.kernel_passes import kernel_bodies

    arts, report = compile_run_artifacts(_run(leg), with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    report, _ = hbm_outside_vmem(report, hlo)
    before = {o.name: o for o in report.modules[0].ops}
    after, note = kernel_bodies(report, kernel_works(report, hlo, kernel_tables(report, _run(leg))))
    ops = {o.name: o for o in after.modules[0].ops}
    peak = report.target.peak_bf16_flops_per_s
    added = 0.0
    for name, o in ops.items():
        kind = name.rsplit(".", 1)[0]
        if kind in MATMULS:
            flops = HEADS * ACTIVE * MATMULS[kind] * ONE_MATMUL
            assert before[name].flops == 0  # the kernel gives no cost estimate: its op counted none
            assert (o.flops, o.bound_by) == (flops, "compute")
            assert o.estimated_s == pytest.approx(flops / peak) and o.runs == LAYERS
            assert o.limit == (f"MXU, {flops / 1e9:.3g} GFLOP in its body's matmuls over the grid steps its "
                               "tables run")
            added += (o.estimated_s - before[name].estimated_s) * o.runs
        else:
            assert o == before[name]
    assert note == (f"3 Pallas kernel op(s) with no cost estimate of their own: MXU work read from the kernel's "
                    f"body over the grid steps that run it, at the MXU peak (+{added:.4g} s per step; softmax "
                    "and other vector work not counted)")
    assert after.modules[0].findings[-1] == note

    # a run without the tables' values: every grid step counted, and the finding says so
    bare = tmp_path / "run"
    shutil.copytree(_run(leg), bare)
    for f in (bare / "modules").glob("*/kernel_tables.json"):
        f.unlink()
    blind, note = kernel_bodies(report, kernel_works(report, hlo, kernel_tables(report, bare)))
    assert note.endswith("; 3 whose grid steps depend on tables that could not be evaluated (values not known, or "
                         "too many steps): every step counted")
    for o in blind.modules[0].ops:
        kind = o.name.rsplit(".", 1)[0]
        if kind in MATMULS:
            assert o.flops == HEADS * BLOCKS * BLOCKS * MATMULS[kind] * ONE_MATMUL
            assert o.limit.endswith("over every grid step (its tables not evaluated)")


def test_kernel_probes_stop_when_their_budget_is_spent(tmp_path, monkeypatch):
    """No pair of probes starts once the budget is spent: the splash kernels keep their time, nothing
    is compiled, and the finding says why."""
    import tpudiag.api.estimate_probes as ep
    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.targets import resolve_target

    monkeypatch.setattr(ep, "KERNEL_PROBE_BUDGET_S", 0.0)
    run = tmp_path / "run"
    shutil.copytree(_run("jax-0.10"), run)
    arts, report = compile_run_artifacts(run, with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    after, note = ep.probe_kernels(report, hlo, kernel_works(report, hlo, kernel_tables(report, run)), run,
                                   resolve_target("v6e:2x2"), Limits())
    assert note == ("no Pallas kernel op timed by the TPU compiler's cycles for its grid steps "
                    "(estimate/kernel_probes/); 3 kernel op(s) not probed: the probes' 0 s were spent; "
                    "those keep their time")
    assert after.modules[0].ops == report.modules[0].ops
    assert list((run / "estimate" / "kernel_probes").glob("*.mlir")) == []


def test_maxtext_own_step_splash_kernels_timed_and_its_gmm_left_alone():
    """MaxText's own MoE step (fixture `estimate_maxtext_moe_megablox`: sequence 1024, splash blocks of
    512, segment ids): its four splash kernels take their body's work over the 3 of 4 blocks the
    causal mask keeps; its megablox gmm/tgmm calls carry a cost estimate and are left alone."""
    from tpudiag.analyze.compile.kernel_passes import kernel_bodies

    run = ARTIFACT_SETS["jax-0.12"] / "estimate_maxtext_moe_megablox"
    skip_if_newer_than_this_xla(run)
    arts, report = compile_run_artifacts(run, with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    before = {o.name: o for o in report.modules[0].ops}
    after, note = kernel_bodies(report, kernel_works(report, hlo, kernel_tables(report, run)))
    assert note.startswith("4 Pallas kernel op(s) with no cost estimate of their own")
    assert "could not be evaluated" not in note
    changed = {o.name: o for o in after.modules[0].ops if o != before[o.name]}
    assert sorted(n.rsplit(".", 1)[0] for n in changed) == [
        "splash_mha_dkv_segmented_no_residuals", "splash_mha_dq_segmented_no_residuals",
        "splash_mha_fwd_segmented_residuals", "splash_mha_fwd_segmented_residuals"]
    for name, o in changed.items():
        work = kernel_work(kernel_body(hlo.instruction(name, o.computation).backend_config))
        assert work.steps % 4 == 0 and o.flops == work.dense_flops * 3 // 4
    gmm = [o for o in after.modules[0].ops if o.opcode == "custom-call" and "gmm" in o.name]
    assert gmm and all(o == before[o.name] and o.flops > 0 for o in gmm)


def _lowered_body(fn, args, tmp_path) -> bytes:
    """The Mosaic body of the one Pallas kernel in `fn`, lowered for v5e on this machine (no TPU)."""
    from jax._src.interpreters import mlir
    from jaxlib.mlir import ir

    from tpudiag.capture.lower import lower_for_tpu

    text = lower_for_tpu(fn, args, tmp_path / "k.mlir", topology="v5e:2x2").read_text()
    configs = []

    def visit(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name == "stablehlo.custom_call":
                        configs.append(ir.StringAttr(inner.operation.attributes["backend_config"]).value)
                    visit(inner.operation)
    with mlir.make_ir_context():
        visit(ir.Module.parse(text).operation)
    (config,) = configs
    return kernel_body(json.loads(config))


def test_a_guard_on_a_table_through_division_and_remainder(tmp_path):
    """A kernel of this file's own whose matmul runs where `table[i // 2, j % 3] > 0` (a scalar-
    prefetched table, grid 4 x 6): counted on exactly those steps; two matmuls, one unguarded."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(table, x_ref, w_ref, o_ref):
        i, j = pl.program_id(0), pl.program_id(1)
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

        @pl.when(table[i // 2, j % 3] > 0)
        def _():
            o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    def fn(table, x, w):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4, 6),
            in_specs=[pl.BlockSpec((128, 256), lambda i, j, t: (i, 0)),
                      pl.BlockSpec((256, 128), lambda i, j, t: (0, j))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j, t: (i, j)))
        return pl.pallas_call(kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((512, 768), jnp.float32))(
            table, x, w)

    table = np.array([[1, 0, 2], [0, 0, 3]], np.int32)
    args = (jax.ShapeDtypeStruct(table.shape, jnp.int32), jax.ShapeDtypeStruct((512, 256), jnp.bfloat16),
            jax.ShapeDtypeStruct((256, 768), jnp.bfloat16))
    body = _lowered_body(fn, args, tmp_path)
    one = 2 * 128 * 128 * 256
    runs = sum(1 for i in range(4) for j in range(6) if table[i // 2, j % 3] > 0)  # 12 of 24
    work = kernel_work(body, [table.ravel().tolist()])
    assert (work.steps, work.matmuls, work.guarded, work.resolved) == (24, 2, True, True)
    assert work.flops == 24 * one + runs * one and work.dense_flops == 48 * one
    assert work.active == 24  # one matmul runs on every step
    assert kernel_work(body, [[0] * 6]).flops == 24 * one  # the guard never holds
    assert kernel_work(body, [[0] * 6]).active == 24
    # two kinds of step, the guard holding or not, 12 each; its last axis has 6 steps: probes of 2 and 3
    # steps along it, the guard set as in each kind
    assert work.signatures == (((0,), 12), ((1,), 12))
    config = {"custom_call_config": {"body": _b64(body)}}
    shapes = ["s32[2,3]", "bf16[512,256]", "bf16[256,768]"]
    for steps in STEP_PROBE:
        for (holds,), _ in work.signatures:
            probe = kernel_work(_probe_body(step_probe(config, shapes, "f32[512,768]", steps, work, (holds,))))
            assert (probe.steps, probe.active, probe.resolved) == (steps, steps, True)
            assert probe.flops == (1 + holds) * steps * one and probe.signatures == (((), steps),)
    assert step_probe(config, shapes, "f32[512,768]", 2, work, (1, 0)) is None  # a signature of another body
    assert kernel_work(body, [[1, 2]]).resolved is False  # a table of the wrong size: not used
    assert work.table_gated and work.parallel == 1  # no dimension semantics given: none parallel


def _b64(body: bytes) -> str:
    import base64

    return base64.b64encode(body).decode()


def _probe_config(text: str) -> dict:
    """The backend config of the kernel call in a step probe's StableHLO module (parsed by jax's own
    bindings)."""
    from jax._src.interpreters import mlir
    from jaxlib.mlir import ir

    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        (call,) = [op for op in module.body.operations[0].regions[0].blocks[0].operations
                   if op.operation.name == "stablehlo.custom_call"]
        config = json.loads(ir.StringAttr(call.operation.attributes["backend_config"]).value)
    assert "debug_locations" not in config["custom_call_config"]
    return config


def _probe_body(text: str) -> bytes:
    """The kernel body inside a step probe's StableHLO module."""
    return kernel_body(_probe_config(text))


@pytest.mark.parametrize("leg", sorted(ARTIFACT_SETS))
def test_step_probes_run_every_step_of_a_cut_grid(leg):
    """Each splash kernel's step probe: the grid cut to 2, then 3, steps along its last axis (the key
    blocks, 4 of them here), every other axis 1, and the mask's branches made to hold, so the body
    the compiler sees does its matmuls on every step; row-major operands and results."""
    run = _run(leg)
    arts, _ = compile_run_artifacts(run, with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    for name, instr in _kernels(hlo).items():
        shapes = [hlo.operand(instr, k).shape for k in range(len(instr.operands))]
        work = kernel_work(kernel_body(instr.backend_config), _tables(run, hlo, instr))
        assert work.signatures == (((1,), HEADS * ACTIVE),)  # one kind of step: the block runs
        for steps in STEP_PROBE:
            text = step_probe(instr.backend_config, shapes, instr.shape, steps, work, (1,))
            assert "operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>" in text
            probe = kernel_work(_probe_body(text))
            assert (probe.steps, probe.active, probe.guarded, probe.resolved) == (steps, steps, True, True)
            assert probe.flops == probe.dense_flops == steps * MATMULS[name] * ONE_MATMUL
        # a grid whose last axis has no more steps than the longer probe is not probed (its last step
        # would write the output back)
        short = json.loads(json.dumps(instr.backend_config))
        short["custom_call_config"]["body"] = _b64(_probe_body(step_probe(instr.backend_config, shapes, instr.shape,
                                                                          STEP_PROBE[1], work, (1,))))
        short_work = kernel_work(kernel_body(short))
        assert short_work.bounds == (1, 1, STEP_PROBE[1])
        assert step_probe(short, shapes, instr.shape, STEP_PROBE[0], short_work, ()) is None
    assert step_probe({"custom_call_config": {"body": "bm90IE1MSVI="}}, ["f32[8]"], "f32[8]", 2, work, (1,)) is None
    assert step_probe(instr.backend_config, ["c64[8]"] * len(instr.operands), instr.shape, 2, work, (1,)) is None


def test_tokamax_splash_kinds_of_step_and_a_grid_sized_at_run_time():
    """tokamax's splash attention (fixture `estimate_splash_tokamax`: 2 heads, sequence 4096 in blocks
    of 1024, causal): its forward kernel's grid runs over the mask's 10 blocks a head, that count a
    leading operand of the call (a constant of the step); its fused backward kernel runs a full grid
    and branches between masked and unmasked blocks. Each step's kind (the values its branches on the
    tables take) is counted, and each kind's probe sets those branches so one matmul path runs."""
    run = ARTIFACT_SETS["jax-0.12"] / "estimate_splash_tokamax"
    skip_if_newer_than_this_xla(run)
    arts, report = compile_run_artifacts(run, with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    works = {n.rsplit(".", 1)[0]: (instr, w, estimated)
             for n, (instr, w, estimated) in kernel_works(report, hlo, kernel_tables(report, run)).items()}
    one = 2 * 1024 * 1024 * 128
    instr, fwd, estimated = works["splash_mha_fwd_residuals"]
    assert estimated  # tokamax gives a cost estimate: the MXU pass leaves it alone, the probes do not
    assert (fwd.dynamic, fwd.bounds, fwd.steps, fwd.active, fwd.resolved) == (1, (2, 10), 20, 20, True)
    assert fwd.flops == 20 * 2 * one
    # per head: each row's first block initialises, its diagonal block is masked and writes the row
    # back; rows of 1, 2, 3 and 4 blocks
    assert sorted(c for _, c in fwd.signatures) == [2, 6, 6, 6]
    shapes = [hlo.operand(instr, k).shape for k in range(len(instr.operands))]
    for sig, _ in fwd.signatures:
        text = step_probe(instr.backend_config, shapes, instr.shape, 3, fwd, sig)
        assert text.count("%a") - text.count("%a", text.index("stablehlo.custom_call")) == len(shapes) - 1
        probe = kernel_work(_probe_body(text))  # the run-time size dropped, one matmul path set to run
        assert (probe.dynamic, probe.bounds, probe.flops) == (0, (1, 3), 3 * 2 * one)
    # the config's fields indexed by operand follow the dropped run-time size
    marked = json.loads(json.dumps(instr.backend_config))
    marked["custom_call_config"]["allow_input_fusion"] = [k % 2 == 0 for k in range(len(shapes))]
    marked["custom_call_config"]["input_memory_space_colors"] = [{"operand_index": 0, "color": 1},
                                                                 {"operand_index": 2, "color": 1}]
    probed = _probe_config(step_probe(marked, shapes, instr.shape, 3, fwd, fwd.signatures[0][0]))["custom_call_config"]
    assert probed["allow_input_fusion"] == [k % 2 == 0 for k in range(1, len(shapes))]
    assert probed["input_memory_space_colors"] == [{"operand_index": 1, "color": 1}]
    assert "operand_to_metadata" not in probed
    # a list that counts the kernel's own operands only (as pallas_call's compiler params give it) is kept
    marked["custom_call_config"]["allow_input_fusion"] = [True] + [False] * (len(shapes) - 2)
    probed = _probe_config(step_probe(marked, shapes, instr.shape, 3, fwd, fwd.signatures[0][0]))["custom_call_config"]
    assert probed["allow_input_fusion"] == [True] + [False] * (len(shapes) - 2)
    instr, dkv, _ = works["splash_mha_dkv_no_residuals"]
    assert (dkv.bounds, dkv.active, dkv.flops) == ((4, 2, 4), 20, 20 * 5 * one)
    assert dkv.signatures == (((1, 0), 12), ((0, 1), 8))  # unmasked blocks below the diagonal, masked on it


def test_a_probe_the_compiler_cannot_profile_keeps_the_op_and_says_why(tmp_path):
    """tokamax's splash kernels as MaxText runs them (base-2 exponent, tokamax's default): libtpu
    0.0.50.1's static profile aborts on their probes, so their ops keep their time (tokamax's cost
    estimate) and the finding gives the compiler's reason."""
    import importlib.metadata as md

    from tpudiag.api.estimate_probes import probe_kernels
    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.targets import resolve_target

    fixture = ARTIFACT_SETS["jax-0.12"] / "estimate_splash_tokamax"
    skip_if_newer_than_this_xla(fixture)
    if md.version("libtpu") != "0.0.50.1":
        pytest.skip("the abort is libtpu 0.0.50.1's")
    run = tmp_path / "run"
    shutil.copytree(fixture, run)
    arts, report = compile_run_artifacts(run, with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    after, note = probe_kernels(report, hlo, kernel_works(report, hlo, kernel_tables(report, run)), run,
                                resolve_target("v6e:2x2"), Limits())
    assert note.startswith("no Pallas kernel op timed by the TPU compiler's cycles for its grid steps")
    assert ("; 2 kernel op(s) whose probes gave no cycles (kprobe00-kind0-2steps: dropped: the TPU compiler "
            "aborted") in note
    assert "LLO_CHECK failure" in note and note.endswith("; those keep their time")
    assert [o for o in after.modules[0].ops if o.cycles_source == "kernel_probe"] == []
    times = {o.name: o.estimated_s for o in report.modules[0].ops}
    assert {o.name: o.estimated_s for o in after.modules[0].ops} == times


def test_a_kernel_gated_on_grid_ids_alone_is_not_table_gated(tmp_path):
    """A kernel of this file's own whose matmul runs where `j < 5` (grid ids only, no table), its first
    axis `parallel`: its work is counted on those steps, but it is not a kernel whose tables gate its
    matmuls, so the estimate does not probe it (a probe along its last axis would not see the steps
    that run)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        @pl.when(pl.program_id(1) < 5)
        def _():
            o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    def fn(x, w):
        return pl.pallas_call(
            kernel, grid=(4, 6),
            in_specs=[pl.BlockSpec((128, 256), lambda i, j: (i, 0)), pl.BlockSpec((256, 128), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((512, 768), jnp.float32),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(x, w)

    args = (jax.ShapeDtypeStruct((512, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256, 768), jnp.bfloat16))
    work = kernel_work(_lowered_body(fn, args, tmp_path))
    one = 2 * 128 * 128 * 256
    assert (work.steps, work.active, work.flops, work.guarded, work.resolved) == (24, 20, 20 * one, True, True)
    assert not work.table_gated and work.parallel == 4 and work.signatures == (((), 20),)
