"""Matmul probes from a real compile (the FSDP training step compiled for v5e by the regenerate
script): each compute-bound matmul fusion becomes a one-op HLO module that XLA's own parser
accepts, with the convolution's operands, labels and layouts as the step has them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import ARTIFACTS
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
