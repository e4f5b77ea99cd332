"""On a real TPU: capture a run with `tpudiag profile` and check it as tests/test_tpu_runs.py checks
the stored v5e fixtures (op names, joins, times, bounds and source lines against XProf's converter),
and `suggest` on it without `--target`. Marked `tpu`: skipped where no TPU is attached (CI); run on
the chip with `pytest -m tpu tests/test_on_chip.py` (docs/tpu.md)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_tpu_runs import check_bounds, check_names_and_joins, check_sources, check_times, xprof_stats

pytestmark = [pytest.mark.tpu, pytest.mark.skipif(not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")),
                                                  reason="needs a TPU attached to this machine (run on the chip)")]


def _profile(tmp_path, program: str, *args: str, options=()):
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)  # conftest pins the test process to the CPU; the program gets the chip
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--json", *options, "--out", str(out),
                           program, "--", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("program,args,options", [
    ("fixtures/programs/decoder.py", ("--steps", "5"), ()),
    ("fixtures/programs/lm_head.py", ("--steps", "4"), ("--steps", "3", "--skip", "1")),
])
def test_a_fresh_chip_run_reads_as_xprof_reads_it(tmp_path, program, args, options):
    from tpudiag.api.profiling import analyze_run

    run = _profile(tmp_path, program, *args, options=options)
    report, x = analyze_run(run), xprof_stats(run)
    check_names_and_joins(report)
    check_times(report, x)
    check_bounds(report, x)
    check_sources(report, x)
    assert report.device.in_steps is not None and report.device.in_steps.median.busy_s > 0


def test_suggest_on_a_fresh_chip_run_names_cross_entropy(tmp_path):
    from tpudiag.api.suggest import suggest_run

    run = _profile(tmp_path, "fixtures/programs/lm_head.py", "--steps", "4", options=("--steps", "3", "--skip", "1"))
    rep = suggest_run(run, static_profile=False)
    shown = [s for s in rep.suggestions if s.shown]
    assert shown and shown[0].kernel == "cross_entropy" and shown[0].xla_measured


def test_kernels_verify_runs_on_the_chip(tmp_path):
    """`kernels verify` where a TPU is attached compiles each case for it (int8_matmul's f32 case
    needs its dots at HIGHEST precision there: interpret mode cannot show that)."""
    import json

    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "kernels", "verify", "--json", "int8_matmul"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    doc = json.loads(proc.stdout)
    assert doc["mode"] == "chip" and doc["device"].startswith("TPU")
    assert proc.returncode == 0 and doc["ok"], [c for c in doc["cases"] if not c["ok"]]


def _tpudiag_json(*args: str, timeout=600) -> dict:
    import json

    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run([sys.executable, "-m", "tpudiag", *args, "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_kernels_bench_times_the_variants_on_the_chip(tmp_path):
    """Device time per call from the trace for ours and XLA's, beside the floor."""
    doc = _tpudiag_json("kernels", "bench", "--target", "v5e", "--no-static-profile", "--calls", "3",
                        "--out", str(tmp_path / "b"), "rmsnorm")
    assert doc["timing"] == "chip" and doc["device"].startswith("TPU")
    (row,) = doc["kernels"]
    for variant in ("kernel", "xla"):
        t = row["chip"][variant]
        assert t["status"] == "ok" and 0 < t["min_us"] <= t["median_us"] and t["buffers"] >= 2
    assert row["floor_us"] > 0 and 0 < row["pct_of_floor"] and "static_over_chip" not in row
    assert (tmp_path / "b" / "chip-traces" / "rmsnorm").is_dir()


def test_kernels_tune_ranks_the_points_on_the_chip(tmp_path):
    doc = _tpudiag_json("kernels", "tune", "--target", "v5e", "--no-static-profile", "--calls", "3",
                        "--out", str(tmp_path / "t"), "rmsnorm")
    assert doc["timing"] == "chip" and doc["device"].startswith("TPU")
    timed = [p for p in doc["points"] if p.get("chip_min_us")]
    assert timed and sorted(p["chip_rank"] for p in timed) == list(range(1, len(timed) + 1))
    assert doc["chip_best"] in [p["choice"] for p in timed] and isinstance(doc["static_best_is_chip_best"], bool)


def test_a_ground_truth_graded_on_the_chip_has_full_marks_and_its_own_time(tmp_path):
    """The ground truth as the solution compiles to the ground truth's program: one executable,
    timed for both variants."""
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    task = ROOT / "tpudiag" / "challenge" / "tasks" / "fp8_matmul"
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "challenge", "grade", "--json", "--seed", "7", "fp8_matmul",
                           str(task / "ground_truth.py")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    doc = json.loads(proc.stdout)
    speed = next(c for c in doc["criteria"] if c["name"] == "speed")
    figures = {f["variant"]: f for f in speed["speed"]["figures"]}
    assert speed["speed"]["basis"] == "chip" and figures["ground_truth"]["status"] == "ok"
    assert figures["ground_truth"]["min_us"] > 0
    assert doc["score"] == doc["max_score"], speed["why"]
