"""`compare` on measured times, against machine drift: each profile run times a fixed CPU loop before
and after the program, and `compare` divides step times by the ratio of the two runs' loops, or
refuses when the machine changed too much. Real runs of real programs; one with the machine loaded."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ARTIFACTS, ROOT, profile_sized_mlp
from tpudiag import api
from tpudiag.analyze.compare.runs import compare_reports
from tpudiag.errors import UsageError

ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


def _with_calibration(name: str, cal: tuple[float, ...]):
    return dataclasses.replace(api.load_report(ARTIFACTS / name), calibration_s=cal)


def test_a_slower_machine_is_divided_out_and_a_much_slower_one_refused():
    base = _with_calibration("mlp_steps8_a", (0.020, 0.023))
    same = compare_reports(base, _with_calibration("mlp_steps8_b", (0.022, 0.021)), "device_time", 0.05)
    plain = compare_reports(api.load_report(ARTIFACTS / "mlp_steps8_a"), api.load_report(ARTIFACTS / "mlp_steps8_b"),
                            "device_time", 0.05)
    assert same.headline == plain.headline, "within the loop's own noise: no correction"
    slower = compare_reports(base, _with_calibration("mlp_steps8_b", (0.031, 0.026)), "device_time", 0.05)
    assert any(w.startswith("machine drift: the calibration loop took 20.0 ms in base and 26.0 ms in cur (1.30x)")
               for w in slower.warnings)
    assert slower.headline.cur == pytest.approx(plain.headline.cur / 1.3, rel=1e-6)
    with pytest.raises(UsageError, match=r"the machine's speed changed between the runs: .*\(2\.50x\)"):
        compare_reports(base, _with_calibration("mlp_steps8_b", (0.050, 0.060)), "device_time", 0.05)
    forced = compare_reports(base, _with_calibration("mlp_steps8_b", (0.050, 0.060)), "device_time", 0.05,
                             force=True)
    assert any("divided by 2.50" in w for w in forced.warnings)


def _compare(a, b, metric="device_time"):
    return subprocess.run([sys.executable, "-m", "tpudiag", "compare", "--metric", metric, "--max-regression", "25%",
                           str(a), str(b)],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_real_runs_record_the_loop_and_the_gate_holds_under_load(tmp_path):
    base = profile_sized_mlp(tmp_path / "base", "--hidden", "1024")
    cal = base["calibration_s"]
    assert len(cal) == 2 and all(0 < c < 5 for c in cal)
    assert json.loads((tmp_path / "base" / "manifest.json").read_text())["calibration_s"] == cal
    # The same program while another process keeps a core busy: never a regression verdict; the
    # gate either corrects for the slower machine, passes within the noise, or refuses naming it.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        profile_sized_mlp(tmp_path / "loaded", "--hidden", "1024")
    finally:
        busy.kill()
        busy.wait()
    loaded = _compare(tmp_path / "base", tmp_path / "loaded")
    assert loaded.returncode in (0, 2), loaded.stdout + loaded.stderr
    assert loaded.returncode == 0 or "speed" in loaded.stderr
    # Sixteen times the matmul work is a regression all the same. On a many-core runner the base
    # step is mostly dispatch overhead, so a 4x change can hide in it (seen: +<25% with 4096);
    # 16x cannot. Timed, the gate may still refuse when the machine drifted; the machine-independent
    # `work` metric always says REGRESSION.
    profile_sized_mlp(tmp_path / "bigger", "--hidden", "16384")
    bigger = _compare(tmp_path / "base", tmp_path / "bigger")
    assert bigger.returncode in (1, 2), bigger.stdout + bigger.stderr
    if bigger.returncode == 1:
        assert "REGRESSION" in bigger.stdout + bigger.stderr
    else:
        assert "speed" in bigger.stderr
    work = _compare(tmp_path / "base", tmp_path / "bigger", metric="work")
    assert work.returncode == 1 and "REGRESSION" in work.stdout + work.stderr, work.stdout + work.stderr
