"""The measured check of an estimate (`plan --measure`): capture/step_timer.py runs a step function
for real and times it. Here it runs on the CPU (the same worker, `platform: cpu`) on the bundled
llama_train step, donated state included; on the chip `plan --measure` runs it on the TPU (marked
`tpu`: `pytest -m tpu tests/test_measured_step.py` there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROGRAMS, ROOT
from tpudiag.capture.process import tpu_attached

LLAMA = PROGRAMS / "llama_train.py"
TINY = ["--layers", "2", "--d-model", "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--d-ff", "256",
        "--vocab", "512", "--seq", "64", "--batch-per-device", "2"]


def _worker(tmp_path, argv, func="step", calls=3):
    out = tmp_path / "result.json"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"file": str(LLAMA), "func": func, "argv": argv, "mesh": [["fsdp", 1]],
                                "calls": calls, "out": str(out), "platform": "cpu"}))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "tpudiag.capture.step_timer", str(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.read_text())


def test_a_real_step_runs_and_is_timed_call_by_call(tmp_path, oldest_leg):
    proc, doc = _worker(tmp_path, TINY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(doc["step_s"]) == 3 and all(t > 0 for t in doc["step_s"])
    assert doc["tokens"] == 2 * 64  # batch x seq, as the step says
    assert doc["device"]


def test_a_step_that_fails_is_one_line_naming_the_program(tmp_path):
    proc, doc = _worker(tmp_path, TINY, func="nosuch")
    assert proc.returncode == 1
    assert doc["error"].startswith(f"{LLAMA}:nosuch: ") and "no function 'nosuch'" in doc["error"]
    assert "\n" not in doc["error"]


@pytest.mark.skipif(tpu_attached(), reason="a TPU is attached")
def test_plan_measure_without_a_tpu_is_one_line_before_any_work(tmp_path):
    for target, said in (("v5e:1x1", "--measure: no TPU attached here"),
                         ("v5e:2x2", "needs a one-chip target (v5e:1x1), not v5e:2x2")):
        proc = subprocess.run([sys.executable, "-m", "tpudiag", "plan", f"{LLAMA}:step", "--target", target,
                               "--measure", "--out", str(tmp_path / target.replace(":", "_")), "--", *TINY],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and said in lines[0], proc.stderr
        assert not (tmp_path / target.replace(":", "_")).exists()


@pytest.mark.tpu
@pytest.mark.skipif(not tpu_attached(), reason="needs a TPU attached to this machine (run on the chip)")
def test_on_the_chip_plan_checks_its_best_candidate(tmp_path):
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "plan", f"{LLAMA}:step", "--target", "v5e:1x1",
                           "--json", "--out", str(tmp_path / "plan"), "--", *TINY], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    m = doc["measured"]
    assert "error" not in m, m
    assert m["device"].startswith("TPU") and m["runs"] == 5 and m["step_s"] > 0 and m["estimated_s"] > 0
