"""Sharded compiles for a TPU slice: the `collectives` list of each module, from real compiles of
the pod programs (data, tensor and expert parallel on a 64-chip v5p, FSDP x tensor on a v5e 4x4
with libtpu's asynchronous collectives), held against the optimized HLO text itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACT_SETS, PROGRAMS, ROOT
from tpudiag.analyze.compile.collectives import group_hops, groups_of, wraps
from tpudiag.api.pipeline import analyze_compile_run
from tpudiag.cli import cli
from tpudiag.parse.hlo_text import parse_replica_groups
from tpudiag.targets import resolve_target

POD = [pytest.param(s, j, id=f"{s}/{j}") for s in ARTIFACT_SETS for j in ("dp_train", "tp_mlp", "ep_moe")]
SETS = [pytest.param(s, id=s) for s in ARTIFACT_SETS]
_COLLECTIVE_OP = re.compile(r"^\s+(?:ROOT )?%\S+ = .*? (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                            r"(-start)?\(")


def _step(report):
    (m,) = [m for m in report.modules if m.name.endswith("train_step")]
    return m


def _top_level_collectives(run, module) -> int:
    """Collective instructions outside fused computations in the module's optimized HLO text: the
    oracle for how many collectives a module without collective fusions has."""
    text = next((run / "modules").glob(f"*{module.name}/optimized.hlo.txt")).read_text()
    fused = set(re.findall(r"kind=k\w+, (?:[^,]*, )*?calls=%([\w.-]+)", text))
    count, current = 0, None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.-]+) .*\{$", line)
        if head:
            current = head.group(1)
        elif current not in fused and _COLLECTIVE_OP.match(line):
            count += 1
    return count


@pytest.mark.parametrize("set_name,job", POD)
def test_pod_programs_compile_for_a_64_chip_slice_with_their_mesh_axes(set_name, job):
    run = ARTIFACT_SETS[set_name] / f"compile_v5p_{job}"
    report = analyze_compile_run(run)
    assert report.status == "ok" and report.target.topology == "v5p:4x4x4" and report.target.devices == 64
    # the script ran on as many CPU devices as the slice has, its own mesh code unchanged
    assert re.search(r"\b64 (devices|experts)\b", (run / "shadow" / "program.log").read_text())
    m = _step(report)
    assert m.totals.devices == 64 and m.memory["fits"] and m.memory["hbm_capacity_bytes"] > 0
    axis = {"dp_train": "data", "tp_mlp": "tensor", "ep_moe": "expert"}[job]
    kinds = {c.kind for c in m.collectives}
    assert {"dp_train": {"all-reduce"}, "tp_mlp": {"all-reduce"}, "ep_moe": {"all-to-all", "all-reduce"}}[job] == kinds
    assert len(m.collectives) == _top_level_collectives(run, m)
    for c in m.collectives:
        assert c.mesh_axes == (axis,) and c.group_size == 64 and c.groups == 1
        assert c.ici_hops == 6  # a 4x4x4 torus: at most 2 hops per axis
        assert not c.is_async and c.exposed_s == c.estimated_s
        assert c.estimated_s == pytest.approx(c.ici_bytes / report.target.ici_ring_bytes_per_s, rel=1e-6)
    if job == "dp_train":
        # the gradients and the loss in one all-reduce: the same bytes the 2-process CPU job measured
        (c,) = m.collectives
        assert c.message_bytes == (256 * 256 + 256 + 256 * 8 + 1) * 4
        assert c.ici_bytes == round(2 * 63 / 64 * c.message_bytes)


@pytest.mark.parametrize("set_name", SETS)
def test_fsdp_async_collectives_on_a_2d_mesh(set_name):
    run = ARTIFACT_SETS[set_name] / "compile_v5e_fsdp_async"
    report = analyze_compile_run(run)
    m = _step(report)
    # one row per collective even where libtpu repeats it in a start, continuation fusions and a done
    names = {c.name for c in m.collectives}
    assert any(n.startswith("async-collective-start") for n in names)
    assert not any(n.startswith("async-collective-done") for n in names)
    assert sum(o.ici_bytes for o in m.ops) == sum(c.ici_bytes for c in m.collectives)
    axes = {c.mesh_axes for c in m.collectives}
    assert {("fsdp",), ("tensor",)} <= axes <= {("fsdp",), ("tensor",), ("fsdp", "tensor")}  # the loss: both
    hops = {c.mesh_axes: c.ici_hops for c in m.collectives}
    assert hops[("tensor",)] < hops[("fsdp",)]  # a tensor group is 4 chips of one host; fsdp spans the slice
    async_ = [c for c in m.collectives if c.is_async]
    assert async_ and any(c.scheduled_between_s > 0 for c in async_)
    for c in m.collectives:
        expected = max(0.0, c.estimated_s - c.scheduled_between_s) if c.is_async else c.estimated_s
        assert c.exposed_s == pytest.approx(expected)
    exposed = [c.exposed_s * c.runs for c in m.collectives]
    assert exposed == sorted(exposed, reverse=True)
    assert any("asynchronous" in f for f in m.findings)


@pytest.mark.parametrize("set_name", SETS)
def test_group_diameter_uses_the_slice_wraparound(set_name):
    """Real device coordinates of the v5p 4x4x4 compile: a torus on every axis (whole cube); the
    v5e 4x4 has no wraparound (only a 16-chip axis of a full pod has one)."""
    v5p = json.loads(next((ARTIFACT_SETS[set_name] / "compile_v5p_dp_train" / "modules").glob("*train_step/result.json"))
                     .read_text())["device_coords"]
    assert len(v5p) == 64 and sorted(map(tuple, v5p)) == sorted({tuple(c) for c in v5p})
    target = resolve_target("v5p:4x4x4")
    assert wraps(target) == (True, True, True) and wraps(resolve_target("v5e:4x4")) == (False, False)
    row = [d for d, c in enumerate(v5p) if c[1] == 0 and c[2] == 0]  # four chips along x
    assert group_hops(tuple(row), v5p, (4, 4, 4), (True, True, True)) == 2
    assert group_hops(tuple(row), v5p, (4, 4, 4), (False, False, False)) == 3
    assert group_hops(tuple(range(64)), v5p, (4, 4, 4), (True, True, True)) == 6


def test_replica_group_spellings_give_the_same_groups():
    iota = groups_of(parse_replica_groups("[4,4]<=[4,4]T(1,0)"), 16)
    listed = groups_of(parse_replica_groups("{{0,4,8,12},{1,5,9,13},{2,6,10,14},{3,7,11,15}}"), 16)
    mesh = groups_of(parse_replica_groups("mesh['axis_0'=4,'axis_1'=4] {'axis_0'}"), 16)
    assert iota == listed == mesh
    assert groups_of(None, 8) == [tuple(range(8))]


@pytest.mark.parametrize("set_name", SETS)
def test_collectives_render(set_name):
    run = ARTIFACT_SETS[set_name] / "compile_v5e_fsdp_async"
    md = CliRunner().invoke(cli, ["report", "--md", str(run)])
    assert md.exit_code == 0 and "collectives on the slice (ICI model)" in md.output and "| fsdp |" in md.output
    text = CliRunner().invoke(cli, ["report", "--no-color", "--width", "200", str(run)])
    assert "async," in text.output and "tensor" in text.output
    doc = json.loads(CliRunner().invoke(cli, ["report", "--json", str(run)]).output)
    rows = [c for m in doc["modules"] for c in m["collectives"]]
    assert rows and {"mesh_axes", "ici_hops", "is_async", "scheduled_between_s", "exposed_s"} <= set(rows[0])


def test_a_mesh_that_does_not_divide_the_slice_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "tpudiag", "compile", "--target", "v5e:4x4", "--no-static-profile",
                          "--out", str(tmp_path / "r"), str(PROGRAMS / "fsdp_mlp.py"), "--", "--tensor", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    lines = [x for x in res.stderr.splitlines() if x.startswith("tpudiag:")]
    assert len(lines) == 1 and "--tensor 3 does not divide 16 devices" in lines[0]
    assert "Traceback" not in res.stderr
