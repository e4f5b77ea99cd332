"""Asynchronous copies within the chip, timed against the compute the schedule puts in their windows
(analyze/compile/async_copies.py), on a real v5e compile of an FSDP step."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tpudiag import api
from tpudiag.analyze.compile.async_copies import copy_time
from tpudiag.analyze.hlo.loops import loop_runs
from tpudiag.parse.hlo import read_hlo_file

RUN = ROOT / "fixtures" / "artifacts" / "compile_v5e_fsdp_async"


@pytest.fixture(scope="module")
def step():
    m = api.load_report(RUN).modules[0]
    hlo = read_hlo_file(next((RUN / "modules").glob("*/optimized.hlo.txt")))
    collectives = {c.name for c in m.collectives}
    rows = [(o.name, o.computation, o.estimated_s, o.runs, o.bound_by, o.opcode) for o in m.ops
            if o.name not in collectives]
    return hlo, loop_runs(hlo).runs, rows


def _scaled(rows, factor):
    """The rows with every compute op's time multiplied by `factor` (copies and HBM-bound ops as they are)."""
    return [(n, c, s * factor if b != "hbm" and op not in ("copy-start", "copy-done") else s, r, b, op)
            for n, c, s, r, b, op in rows]


def test_a_copy_whose_window_holds_no_compute_is_waited_for_whole(step):
    """This step's five copy windows hold no compute (each copy-done follows its start with only data
    movement between), so no compute time, however long, hides them; HBM-bound ops never do."""
    hlo, runs, rows = step
    starts = [r for r in rows if r[5] == "copy-start"]
    got = copy_time(hlo, runs, rows)
    assert len(starts) == 5 and got is not None
    assert got.copy_s == pytest.approx(sum(s * n for _, _, s, n, _, _ in starts))
    assert got.exposed_s == pytest.approx(got.copy_s)
    assert copy_time(hlo, runs, _scaled(rows, 1e9)).exposed_s == pytest.approx(got.copy_s)
    hbm_scaled = [(n, c, s * 1e9 if b == "hbm" and op not in ("copy-start", "copy-done") else s, r, b, op)
                  for n, c, s, r, b, op in rows]
    assert copy_time(hlo, runs, hbm_scaled).exposed_s == pytest.approx(got.copy_s)


def test_a_step_without_copies_has_no_copy_time(step):
    hlo, runs, rows = step
    assert copy_time(hlo, runs, [r for r in rows if r[5] not in ("copy-start", "copy-done")]) is None
