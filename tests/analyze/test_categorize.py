"""Op classification on real HLO: a CPU collective run and a libtpu (v5e) compile with TPU layouts."""

from __future__ import annotations

from tests.conftest import ARTIFACTS
from tpudiag.analyze.hlo.categories import guess_from_name, index_module
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file


def _module(run: str, name: str):
    return read_hlo_file(next(p for p in find_optimized_modules(ARTIFACTS / run / "hlo").values() if name in p.name))


def test_tpu_compile_collectives_matmuls_and_copies():
    info = index_module(_module("tpu_v5e_step", "jit_step"))
    by_opcode = {}
    for i in info.values():
        by_opcode.setdefault(i.opcode, set()).add((i.category, i.bound))
    assert by_opcode["all-gather"] == {("collective", "communication")}
    assert by_opcode["all-reduce"] == {("collective", "communication")}
    assert by_opcode["copy-start"] == {("data_movement", "memory")}
    # The matmuls were fused into output fusions around a convolution: compute.
    assert ("fusion:output", "compute") in by_opcode["fusion"]
    assert any("T(8,128)" in i.shape for i in info.values()), "TPU tiled layouts survive parsing"
    assert all(i.source is None or i.source.endswith(".py:" + i.source.rsplit(":", 1)[1]) for i in info.values())


def test_cpu_collectives_and_fusions():
    info = index_module(_module("collective", "jit_step"))
    comm = {n for n, i in info.items() if i.bound == "communication"}
    assert any(n.startswith("all-reduce") for n in comm) and any("all_gather" in n or "all-gather" in n for n in comm)
    assert not any(i.category == "unknown" for i in info.values())


def test_guess_from_name_for_bare_traces():
    assert guess_from_name("all-reduce.3").bound == "communication"
    assert guess_from_name("dot.12").bound == "compute"
    assert guess_from_name("while.2").bound == "control"
    assert guess_from_name("fusion.7").category == "unknown"
    assert (guess_from_name("copy.4").category, guess_from_name("reduce.1").category) == ("data_movement", "reduction")
    assert guess_from_name("ynn_fusion.2").opcode == "?"
