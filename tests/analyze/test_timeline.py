"""The op timeline: joins to the HLO, self time under nesting, steps, and the per-op aggregate."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import ARTIFACTS, xplane_of
from tpudiag.analyze.profile.timeline import aggregate_ops, build_timeline
from tpudiag.api import analyze_run, hlo_index
from tpudiag.parse import frames
from tpudiag.parse.xplane import read_xplane


def test_every_op_joins_its_hlo_instruction():
    trace = read_xplane(xplane_of("decoder"))
    tl = build_timeline(trace.ops, trace.steps, hlo_index(ARTIFACTS / "decoder" / "hlo"))
    assert (tl["category"] != "unknown").all()
    assert tl["source"].notna().mean() > 0.5
    assert set(tl["bound"]) <= {"compute", "memory", "communication", "host", "control"}
    assert "compute" in set(tl["bound"])


def test_aggregate_counts_match_instances():
    report = analyze_run(ARTIFACTS / "mlp")
    tl, ops = report.timeline, report.op_frame
    assert ops["occurrences"].sum() == len(tl)
    assert ops["self_ns"].sum() == tl["self_ns"].sum()
    assert ops["share"].sum() == pytest.approx(1.0)
    assert list(ops["self_ns"]) == sorted(ops["self_ns"], reverse=True)
    # The train step runs once per step: its ops occur 3 times, all inside steps 0..2.
    train = tl[tl["module"] == "jit_train_step"]
    assert set(train["step"]) == {0, 1, 2}


def test_self_time_subtracts_nested_events():
    ops = pd.DataFrame({
        "device": ["d"] * 3, "line": ["l"] * 3, "module": ["m"] * 3, "program_id": [1, 1, 1], "run_id": [7, 7, 7],
        "op": ["while.1", "fusion.2", "fusion.3"], "start_ns": [0, 10, 50], "duration_ns": [100, 20, 30],
    }).astype({"program_id": "int64", "run_id": "int64", "start_ns": "int64", "duration_ns": "int64"})
    tl = build_timeline(ops, frames.empty_frame(frames.STEPS), {})
    assert dict(zip(tl["op"], tl["self_ns"])) == {"while.1": 50, "fusion.2": 20, "fusion.3": 30}
    assert (tl["step"] == -1).all()
    agg = aggregate_ops(tl)
    assert agg.iloc[0]["op"] == "while.1"
