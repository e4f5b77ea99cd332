"""Matmul probes from a real compile (the FSDP training step compiled for v5e by the regenerate
script): each compute-bound matmul fusion becomes a one-op HLO module that XLA's own parser
accepts, with the convolution's operands, labels and layouts as the step has them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import ARTIFACT_SETS, ARTIFACTS
from tpudiag.analyze.compile.matmul_probe import probe_text, select_probes
from tpudiag.api.pipeline import compile_run_artifacts

RUN = ARTIFACTS / "compile_v5e_fsdp_async"


@pytest.fixture(scope="module")
def step():
    arts, report = compile_run_artifacts(RUN, with_llo=False, suggestions=False)
    # an estimate compiles without the static profile: its ops with FLOPs are taken at the MXU peak
    ops = [replace(o, bound_by="compute") if o.flops > 0 else o for o in report.modules[0].ops]
    return arts[0].hlo, ops


def test_every_probe_is_a_module_xla_parses(step):
    hlo_parser = pytest.importorskip("jaxlib._hlo")
    module, ops = step
    probes = select_probes(module, ops)
    assert probes, "the step has matmul fusions"
    names = {o.name for o in ops}
    for p in probes:
        parsed = hlo_parser.hlo_module_from_text(p.text)  # XLA's own parser is the oracle
        assert "convolution" in parsed.to_string() or " dot(" in parsed.to_string()
        assert "S(" not in p.text and "metadata" not in p.text and "backend_config" not in p.text
        assert p.ops and set(p.ops) <= names and p.total_s > 0
    assert [p.total_s for p in probes] == sorted((p.total_s for p in probes), reverse=True)
    assert len({p.text for p in probes}) == len(probes)


def test_a_probe_keeps_the_convolution_as_the_step_has_it(step):
    module, ops = step
    fusion = next(module.instruction(o.name, o.computation) for o in ops
                  if o.opcode == "fusion" and probe_text(module, module.instruction(o.name, o.computation)))
    conv = next(i for i in module.walk([fusion.calls]) if i.opcode == "convolution")
    text = probe_text(module, fusion)
    assert f"dim_labels={conv.attributes['dim_labels']}" in text
    for k in range(2):  # each operand a parameter of its shape (layout kept, memory space dropped)
        shape = module.operand(conv, k).shape.split("{")[0]
        assert f"%p{k} = {shape}" in text
    assert text.count("ROOT") == 1 and text.count("parameter(") == 2


def test_ops_without_a_matmul_make_no_probe(step):
    module, ops = step
    plain = [o for o in ops if o.flops == 0][:5]
    assert select_probes(module, [replace(o, bound_by="compute") for o in plain]) == []


def test_rows_are_cut_and_scaled_back(step, monkeypatch):
    """A probe's rows are cut (the static profile steps through every row block), and the cut is
    the factor its cycles are scaled by; the cut module still parses."""
    hlo_parser = pytest.importorskip("jaxlib._hlo")
    import tpudiag.analyze.compile.matmul_probe as mp

    module, ops = step
    whole = {p.ops: p for p in select_probes(module, ops)}
    monkeypatch.setattr(mp, "PROBE_ROWS", 128)
    cut = [p for p in select_probes(module, ops) if p.scale > 1]
    assert cut, "some matmul has more than 128 rows"
    for p in cut:
        hlo_parser.hlo_module_from_text(p.text)
        assert whole[p.ops].scale == 1.0 and len(p.text) <= len(whole[p.ops].text) + 8
        flops_whole = sum(o.flops for o in ops if o.name in p.ops)
        assert flops_whole > 0 and p.scale == int(p.scale)


def test_output_features_are_cut_and_scaled_back(step, monkeypatch):
    """A probe's output features are cut too (a 32B model's [8192, 28672] weight took the static
    profile past its budget at 2048 rows), each cut a whole factor the cycles are scaled by; the cut
    module still parses and its result has the cut width."""
    hlo_parser = pytest.importorskip("jaxlib._hlo")
    import tpudiag.analyze.compile.matmul_probe as mp

    module, ops = step
    whole = {p.ops: p for p in select_probes(module, ops)}
    monkeypatch.setattr(mp, "PROBE_COLS", 128)
    cut = [p for p in select_probes(module, ops) if p.scale > whole[p.ops].scale]
    assert cut, "some matmul has more than 128 output features"
    for p in cut:
        hlo_parser.hlo_module_from_text(p.text)
        root = next(line for line in p.text.splitlines() if "ROOT" in line)
        assert ",128]" in root.split("=", 1)[1].split(" convolution", 1)[0] and p.scale == int(p.scale)


def test_vmem_bytes_count_only_buffers_outside_hbm(step):
    from tpudiag.analyze.compile.memory_space import vmem_bytes

    module, ops = step
    seen = 0
    for o in ops:
        instr = module.instruction(o.name, o.computation)
        v = vmem_bytes(module, instr)
        shapes = [instr.shape] + [module.operand(instr, k).shape for k in range(len(instr.operands))]
        if not any("S(" in s for s in shapes):
            assert v == 0
        else:
            seen += v > 0
        assert v >= 0
    assert seen, "XLA placed some of this step's buffers in VMEM"


def test_a_step_without_activation_offload_moves_nothing_to_host(step):
    from tpudiag.analyze.compile.host_transfers import host_transfers
    from tpudiag.analyze.hlo.loops import loop_runs

    module, _ = step
    assert "S(5)" not in "".join(i.shape or "" for i in module.instructions())
    assert host_transfers(module, loop_runs(module).runs) == []


@pytest.mark.parametrize("leg", sorted(ARTIFACT_SETS))
def test_the_compilers_cost_model_cycles_are_read_from_each_matmul_fusion(leg):
    """The executable's optimized HLO records, on each matmul fusion, the cycles of the tiling the
    convolution emitter chose (`window_config`, the classic cost model). Another cost model's record
    (INVALID, as copies carry), an unset, zero or unreadable figure, and an op without a matmul give
    none."""
    from tpudiag.analyze.compile.matmul_probe import _matmuls, cost_model_cycles
    from tpudiag.parse.hlo import parse_hlo_text, read_hlo_file

    (path,) = (ARTIFACT_SETS[leg] / "compile_v5e_fsdp_async" / "modules").glob("*/optimized.hlo.txt")
    module = read_hlo_file(path)
    fusions = [i for i in module.instructions() if i.opcode == "fusion" and _matmuls(module, i)]
    assert len(fusions) == 11  # the FSDP MLP's forward and backward matmuls
    assert all(cost_model_cycles(module, i) > 0 for i in fusions)
    inner = [i for i in module.instructions() if i.opcode == "convolution"]  # in the fused computations
    assert inner and all(cost_model_cycles(module, i) is None for i in inner)
    # the same fusion with another cost model's record, an unset or empty figure, or no figure: none
    fusion = fusions[0]
    line = next(x for x in path.read_text().splitlines() if f"%{fusion.name} = " in x)
    cycles = str(cost_model_cycles(module, fusion))
    for old, new in (("COST_MODEL_TYPE_CLASSIC", "COST_MODEL_TYPE_INVALID"),
                     (f'"estimated_cycles":"{cycles}"', '"estimated_cycles":"9223372036854775807"'),
                     (f'"estimated_cycles":"{cycles}"', '"estimated_cycles":"0"'),
                     (f'"estimated_cycles":"{cycles}"', '"estimated_cycles":"x"')):
        assert old in line
        changed = parse_hlo_text(path.read_text().replace(line, line.replace(old, new)))
        assert cost_model_cycles(changed, changed.instruction(fusion.name)) is None, new


@pytest.mark.parametrize("leg", sorted(ARTIFACT_SETS))
def test_the_cost_model_and_the_static_profile_agree_on_a_matmul_both_time(leg):
    """The v5e run compiled with the static profile: its one matmul fusion has both figures, and the
    cost model's is above the static profile's and within 1.5x of it (bench/RESULTS.md: 0.90-1.11x
    on 23 of 30 probes of published steps, 1.29-1.85x on the other 7)."""
    from tpudiag.analyze.compile.matmul_probe import cost_model_cycles
    from tpudiag.parse.hlo import read_hlo_file

    run = ARTIFACT_SETS[leg] / "compile_v5e_collective"
    arts, report = compile_run_artifacts(run, with_llo=False, suggestions=False)
    both = []
    for a, m in zip(arts, report.modules):
        if a.hlo is None:
            continue
        module = read_hlo_file(Path(a.artifacts_dir) / "optimized.hlo.txt")  # the executable's, with its configs
        for o in m.ops:
            instr = module.instruction(o.name, o.computation)
            cycles = cost_model_cycles(module, instr) if instr is not None else None
            if cycles and o.cycles_source == "static_profile":
                both.append((cycles, o.estimated_cycles))
    assert len(both) == 1
    (model, static), = both
    assert static < model < 1.5 * static


def test_the_estimate_takes_the_cost_model_for_matmuls_no_probe_timed():
    """MaxText's MoE step for v5e (no static profile): each compute-bound matmul fusion takes the
    cycles its cost model recorded where they are longer than its MXU-peak time; an op a probe timed
    keeps its time, and every other op is untouched."""
    from tpudiag.analyze.compile.matmul_probe import cost_model_cycles
    from tpudiag.analyze.compile.estimate_passes import cost_model_matmuls, hbm_outside_vmem

    arts, report = compile_run_artifacts(ARTIFACT_SETS["jax-0.12"] / "estimate_maxtext_moe_megablox", with_llo=False,
                                         suggestions=False)
    hlo = arts[0].hlo
    report, _ = hbm_outside_vmem(report, hlo)
    before = {o.name: o for o in report.modules[0].ops}
    clock = report.target.clock_hz
    candidates = {o.name: cost_model_cycles(hlo, hlo.instruction(o.name, o.computation))
                  for o in before.values() if o.bound_by == "compute" and o.flops > 0}
    candidates = {k: v for k, v in candidates.items() if v}
    assert len(candidates) == 34
    longest = max(candidates, key=lambda k: (candidates[k] / clock - before[k].estimated_s) * before[k].runs)
    after, note = cost_model_matmuls(report, hlo, probed=frozenset({longest}))
    assert note.startswith("33 compute-bound matmul op(s) with no static cycles timed by the TPU compiler's "
                           "convolution cost model")
    ops = {o.name: o for o in after.modules[0].ops}
    added = 0.0
    for name, o in ops.items():
        if name in candidates and name != longest and candidates[name] / clock > before[name].estimated_s:
            assert (o.bound_by, o.cycles_source) == ("static_cycles", "cost_model")
            assert o.estimated_cycles == candidates[name]
            assert o.estimated_s == pytest.approx(candidates[name] / clock)
            added += (o.estimated_s - before[name].estimated_s) * o.runs
        else:
            assert o == before[name]
    slower = sum(o.cycles_source == "cost_model" for o in ops.values())
    assert slower and f": {slower} slower than the MXU peak, +{added:.4g} s per step" in note
    assert after.modules[0].findings[-1] == note
    # an op the step's own static profile timed keeps its cycles, even where they beat the peak
    timed = replace(before[longest], cycles_source="static_profile", estimated_cycles=1)
    report = replace(report, modules=(replace(report.modules[0], ops=tuple(
        timed if o.name == longest else o for o in report.modules[0].ops)),))
    again, _ = cost_model_matmuls(report, hlo)
    assert next(o for o in again.modules[0].ops if o.name == longest) == timed


# A 32B model's MLP weight gradient as tpudiag's probe writes it (MaxText's 32B on v5e-256, the
# probe's rows and features cut to 2048 x 4096): a windowed convolution whose emitter libtpu's static
# profile does not time.
WEIGHT_GRADIENT_PROBE = """HloModule matmul_probe

ENTRY %main (p0: bf16[4,2048,2048]{2,1,0:T(8,128)(2,1)}, p1: bf16[4,2048,4096]{2,1,0:T(8,128)(2,1)}) -> bf16[2048,4096,1]{1,0,2:T(8,128)(2,1)} {
  %p0 = bf16[4,2048,2048]{2,1,0:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[4,2048,4096]{2,1,0:T(8,128)(2,1)} parameter(1)
  ROOT %m0 = bf16[2048,4096,1]{1,0,2:T(8,128)(2,1)} convolution(%p0, %p1), window={size=4}, dim_labels=0fb_0io->bf0
}
"""


def test_a_probe_with_no_static_cycles_takes_its_own_cost_model(tmp_path):
    """Compiled alone for v5e with the static profile (as `estimate` compiles its probes), the weight
    gradient's fusion gets 0 cycles from the profile; the probe's own convolution cost model records
    its tiling's cycles, within 10% of the MXU peak for its FLOPs, and the estimate takes those
    (`estimate_probes._probe_cost_model`) rather than the step's record for the full-size op."""
    from tpudiag.api.estimate_probes import _probe_cost_model, compile_alone, probe_setup
    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.targets import resolve_target

    target = resolve_target("v5e")
    pdir, limits = probe_setup(tmp_path, "probes", Limits())
    path = pdir / "probe00.hlo.txt"
    path.write_text(WEIGHT_GRADIENT_PROBE)
    pm = compile_alone(path, "probe00", "hlo", pdir, target, limits)
    assert pm.ok
    (conv,) = [o for o in pm.ops if o.flops > 0]
    assert not conv.estimated_cycles  # the static profile does not time this emitter
    cycles = _probe_cost_model(pm)
    peak = conv.flops / target.chip.peak_bf16_flops_per_s * target.chip.clock_hz
    assert peak < cycles < 1.1 * peak, (cycles, peak)


def test_an_op_whose_probe_gave_no_static_cycles_takes_the_lower_cost_model_record():
    """The 32B v5e step's weight-gradient probe (docs/estimate.md): its own cost model read 1,089,376
    cycles; the step's record for the same full-size op is the other. Static cycles always stand."""
    from tpudiag.analyze.compile.estimate_passes import ProbeTime

    assert ProbeTime(543_953, "probe00", False, 400_000).chosen() == (543_953, "probe00")
    assert ProbeTime(1_089_376, "probe02", True, 1_193_124).chosen() == (1_089_376, "probe02, its cost model")
    assert ProbeTime(1_089_376, "probe02", True, None).chosen() == (1_089_376, "probe02, its cost model")
    assert ProbeTime(1_089_376, "probe02", True, 1_050_000).chosen() == (
        1_050_000, "probe02; the step's cost model, lower")
