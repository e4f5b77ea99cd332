"""While-loop trip counts read off the HLO, against XLA's own recorded counts.

XLA:CPU writes `known_trip_count` on the loops it can count; the TPU compiler does not. The reading
in analyze/hlo/loops.py ignores the recorded count (`recorded=False`) and must find the same number on
every recorded loop of the fixture runs, and the same number on the TPU compile of the same
function as on its CPU compile."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ARTIFACT_SETS, GOLDENS, glob_sets, set_id
from tpudiag.analyze.hlo.loops import loop_runs, trip_count
from tpudiag.parse.hlo import read_hlo_file

CPU_HLO = [p for p in glob_sets("*/hlo/*after_optimizations.txt", "*/shadow/hlo/*after_optimizations.txt")
           if "known_trip_count" in p.read_text()]


def test_the_fixture_runs_have_recorded_loops():
    assert len(CPU_HLO) >= 10


@pytest.mark.parametrize("path", CPU_HLO, ids=set_id)
def test_the_reading_matches_xlas_recorded_count(path):
    module = read_hlo_file(path)
    loops = [i for i in module.instructions() if i.opcode == "while" and i.known_trip_count is not None]
    assert loops
    for w in loops:
        assert trip_count(module, w, recorded=False) == w.known_trip_count, (path.name, w.name)


@pytest.mark.parametrize("artifact_set", list(ARTIFACT_SETS))
def test_tpu_loops_get_the_cpu_compiles_count(artifact_set):
    """The TPU compile of collective.py's threefry split (a loop of 5 rounds) records no count; the
    reading gives the count XLA:CPU recorded for the same function in the CPU profile run."""
    root = ARTIFACT_SETS[artifact_set]
    tpu = read_hlo_file(root / "compile_v5e_collective/modules/02-jit__threefry_split/optimized.hlo.txt")
    cpu = read_hlo_file(next(root.glob("collective/hlo/*jit__threefry_split.cpu_after_optimizations.txt")))
    tpu_loops = [i for i in tpu.instructions() if i.opcode == "while"]
    cpu_counts = sorted(i.known_trip_count for i in cpu.instructions() if i.opcode == "while")
    assert tpu_loops and all(w.known_trip_count is None for w in tpu_loops)
    assert sorted(trip_count(tpu, w) for w in tpu_loops) == cpu_counts == [5]
    runs = loop_runs(tpu)
    body, cond = tpu_loops[0].body, tpu_loops[0].condition
    assert (runs.runs[tpu.entry.name], runs.runs[body], runs.runs[cond]) == (1, 5, 6)
    assert runs.unknown == ()


def test_the_compile_report_counts_a_loop_body_per_trip():
    doc = json.loads((GOLDENS / "jax-0.10/compile_v5e_collective/report.json").read_text())
    split = next(m for m in doc["modules"] if m["name"] == "jit__threefry_split")
    assert {o["runs"] for o in split["ops"]} == {1, 5, 6}  # outside, the body, the condition
    assert split["totals"]["estimated_s"] == pytest.approx(sum(o["estimated_s"] * o["runs"] for o in split["ops"]),
                                                           abs=1e-11)
    assert any("5 times per execution" in f for f in split["findings"])
