"""The xplane walk, checked against a naive walk of the same real traces, and its bad-input errors."""

from __future__ import annotations

import shutil

import pytest
from jax.profiler import ProfileData

from tests.conftest import SET_RUNS, xplane_of
from tpudiag.errors import InputError, ParseError
from tpudiag.parse.xplane import locate_xplane, read_xplane


def _naive_ops(path):
    """Every event carrying an `hlo_op` stat, straight from ProfileData (the oracle)."""
    out = []
    for plane in ProfileData.from_file(str(path)).planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                if "hlo_op" in stats and ev.duration_ns > 0:
                    out.append((stats["hlo_op"], int(ev.start_ns), int(ev.duration_ns)))
    return sorted(out)


@pytest.mark.parametrize("artifact_set,run", SET_RUNS)
def test_ops_match_naive_walk(artifact_set, run):
    path = xplane_of(run, artifact_set)
    trace = read_xplane(path)
    mine = sorted(zip(trace.ops["op"], trace.ops["start_ns"], trace.ops["duration_ns"]))
    assert mine == _naive_ops(path)
    assert len(mine) > 0
    assert trace.backend == "cpu"
    assert trace.window_ns > 0
    assert (trace.ops["start_ns"] >= 0).all()


def test_steps_are_the_programs_step_annotations():
    trace = read_xplane(xplane_of("mlp"))
    assert sorted(trace.steps["step_num"].tolist()) == [0, 1, 2]
    assert set(trace.steps["name"]) == {"train"}


def test_collective_run_has_eight_cpu_devices():
    trace = read_xplane(xplane_of("collective"))
    assert trace.devices == tuple(f"/device:CPU:{i}" for i in range(8))


def test_truncated_trace_is_a_parse_error(tmp_path):
    src = xplane_of("mlp").read_bytes()
    bad = tmp_path / "cut.xplane.pb"
    bad.write_bytes(src[: len(src) // 3])
    with pytest.raises(ParseError) as e:
        read_xplane(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("content", [b"", b"garbage, not a protobuf\n"])
def test_empty_and_garbage_traces(tmp_path, content):
    bad = tmp_path / "x.xplane.pb"
    bad.write_bytes(content)
    with pytest.raises(ParseError, match="x.xplane.pb"):
        read_xplane(bad)


def test_locate_xplane(tmp_path):
    assert locate_xplane(xplane_of("mlp").parents[3]) == xplane_of("mlp")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no .xplane.pb"):
        locate_xplane(tmp_path / "empty")
    with pytest.raises(InputError, match="no such file"):
        locate_xplane(tmp_path / "missing")
    other = tmp_path / "notes.txt"
    shutil.copy(__file__, other)
    with pytest.raises(InputError, match="not an .xplane.pb"):
        locate_xplane(other)


def test_xprof_hlo_stats_is_empty_for_cpu_traces_and_leaves_no_cache_file():
    """XProf's converter really runs on the trace; for CPU planes its table is empty (device planes only)."""
    from tpudiag.parse import frames
    from tpudiag.parse.xprof_tools import hlo_stats

    path = xplane_of("mlp")
    before = sorted(p.name for p in path.parent.iterdir())
    df = hlo_stats(path)
    assert list(df.columns) == list(frames.XPROF_HLO_STATS) and df.empty
    assert sorted(p.name for p in path.parent.iterdir()) == before
