"""The breakdown: parts sum to the window, and agree with a naive per-microsecond walk of real traces."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ARTIFACTS, RUNS
from tpudiag.analyze.profile.breakdown import PRIORITY, split_window
from tpudiag.api import analyze_run


def _naive(window_ns: int, classes: dict, step_ns: int) -> dict[str, float]:
    """Sample the window every `step_ns`; give each sample to the first active class in priority order."""
    n = window_ns // step_ns + 1
    owner = np.full(n, -1)
    for rank, cls in reversed(list(enumerate(PRIORITY))):
        for s, e in zip(*classes.get(cls, ((), ()))):
            lo, hi = max(0, int(s) // step_ns), min(n, -(-int(e) // step_ns))
            owner[lo:hi] = rank
    return {cls: float((owner == r).sum()) * step_ns * 1e-9 for r, cls in enumerate(PRIORITY)}


def test_priority_on_hand_made_intervals():
    classes = {
        "compute": (np.array([0, 50]), np.array([30, 60])),
        "memory": (np.array([20]), np.array([40])),
        "communication": (np.array([25]), np.array([35])),
        "host": (np.array([0]), np.array([100])),
        "compile": (np.array([90]), np.array([120])),  # clipped at the window's end
    }
    bd = split_window(100, classes)
    ns = {k: round(v * 1e9) for k, v in bd.to_dict().items()}
    assert ns == {"total_s": 100, "communication_s": 10, "compute_s": 35, "memory_s": 5, "compile_s": 10,
                  "host_s": 40, "idle_s": 0}


def test_empty_window():
    bd = split_window(0, {})
    assert sum(bd.parts().values()) == 0 == bd.total_s


@pytest.mark.parametrize("run", RUNS)
def test_parts_sum_to_the_window(run):
    bd = analyze_run(ARTIFACTS / run).breakdown
    assert bd.total_s > 0
    assert abs(sum(bd.parts().values()) - bd.total_s) <= 0.01 * bd.total_s
    assert all(v >= 0 for v in bd.parts().values())


@pytest.mark.parametrize("run", ["mlp", "collective"])
def test_agrees_with_a_naive_walk(run):
    report = analyze_run(ARTIFACTS / run)
    tl = report.timeline
    classes = {}
    for bound in ("compute", "memory", "communication", "control", "host"):
        sel = tl[tl["bound"] == bound]
        classes[bound] = (sel["start_ns"].to_numpy(), (sel["start_ns"] + sel["duration_ns"]).to_numpy())
    from tpudiag.parse.xplane import read_xplane
    from tpudiag.parse.monitoring import read_monitoring
    from tests.conftest import xplane_of

    trace = read_xplane(xplane_of(run))
    h = trace.host
    classes["host"] = (np.concatenate([classes["host"][0], h["start_ns"]]),
                       np.concatenate([classes["host"][1], h["start_ns"] + h["duration_ns"]]))
    comp, _ = read_monitoring(ARTIFACTS / run / "capture" / "monitoring.jsonl")
    s = comp["start_ns"].to_numpy() - trace.start_time_ns
    c = trace.compile
    classes["compile"] = (np.concatenate([s, c["start_ns"]]),
                          np.concatenate([s + comp["duration_ns"].to_numpy(), c["start_ns"] + c["duration_ns"]]))
    naive = _naive(trace.window_ns, classes, step_ns=1000)
    bd = report.breakdown.to_dict()
    naive_compute = naive["compute"] + naive["control"]
    for key, value in (("compute_s", naive_compute), ("memory_s", naive["memory"]),
                       ("communication_s", naive["communication"]), ("compile_s", naive["compile"]),
                       ("host_s", naive["host"])):
        # 1 us sampling: each interval edge may be off by up to 1 us.
        assert bd[key] == pytest.approx(value, abs=0.002 * bd["total_s"] + 1e-4), key
    if run == "collective":
        assert bd["communication_s"] > 0
