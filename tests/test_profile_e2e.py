"""Real `tpudiag profile` runs in a subprocess: the main path, the step window, and every way a program can fail.

These run real JAX programs under the real profiler (a few seconds each).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import PROGRAMS, ROOT


def tpudiag(*args, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180, **kw)


def manifest(run):
    return json.loads((run / "manifest.json").read_text())


def test_profile_json_stdout_is_exactly_the_report(tmp_path):
    run = tmp_path / "run"
    p = tpudiag("profile", "--json", "--out", str(run), str(PROGRAMS / "mlp.py"), "--", "--steps", "2")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # nothing but JSON on stdout
    assert doc["schema"] == "tpudiag.report/1" and doc["status"] == "ok"
    assert "mlp: steps=2" in p.stderr, "the program's own stdout went to stderr"
    assert "mlp: steps=2" in (run / "program.log").read_text()
    assert doc == json.loads((run / "report.json").read_text())
    assert (run / "report.md").read_text().startswith("## tpudiag profile")
    assert doc["steps"]["count"] == 2
    train = [o for o in doc["ops"] if o["module"] == "jit_train_step"]
    assert train and all(o["occurrences"] == 2 for o in train)
    assert any(o["source"] and o["source"].endswith("mlp.py:" + o["source"].rsplit(":", 1)[1]) for o in train)
    m = manifest(run)
    assert m["status"] == "ok" and m["exit_code"] == 0 and m["versions"]["jax"] == md.version("jax")
    assert "--xla_dump_to" in m["env"]["XLA_FLAGS"]
    assert list((run / "hlo").glob("*jit_train_step*after_optimizations.txt"))
    assert list((run / "ir").glob("*.mlir"))
    assert list((run / "trace").glob("plugins/profile/*/*.xplane.pb"))
    # Capture once, render many: `report RUN` gives the same document.
    again = tpudiag("report", "--json", str(run))
    assert json.loads(again.stdout) == doc


def test_step_window_traces_only_the_selected_steps(tmp_path):
    run = tmp_path / "run"
    p = tpudiag("profile", "--json", "--steps", "2", "--skip", "1", "--out", str(run),
                str(PROGRAMS / "mlp.py"), "--", "--steps", "4")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r["step_num"] for r in doc["steps"]["rows"]] == [1, 2]
    assert doc["breakdown"]["compile_s"] == 0, "compiles happened before the window (step 0)"


def test_step_window_beyond_the_programs_steps(tmp_path):
    p = tpudiag("profile", "--steps", "1", "--skip", "10", "--out", str(tmp_path / "run"),
                str(PROGRAMS / "mlp.py"), "--", "--steps", "2")
    assert p.returncode == 2
    assert "nothing was traced" in p.stderr


def test_program_that_raises(tmp_path):
    run = tmp_path / "run"
    p = tpudiag("profile", "--out", str(run), str(PROGRAMS / "failing" / "raises.py"))
    assert p.returncode == 1
    assert "ValueError: boom from the program" in p.stderr
    assert 'raises.py", line' in p.stderr, "the program's traceback"
    assert "tpudiag/capture" not in p.stderr and "runpy" not in p.stderr, "not ours"
    m = manifest(run)
    assert m["status"] == "failed" and m["exit_code"] == 1 and "ValueError" in m["reason"]
    doc = json.loads((run / "report.json").read_text())
    assert doc["status"] == "failed" and doc["ops"], "what ran before the error is reported"


def test_program_that_calls_sys_exit(tmp_path):
    run = tmp_path / "run"
    p = tpudiag("profile", "--out", str(run), str(PROGRAMS / "failing" / "exits.py"))
    assert p.returncode == 3
    assert manifest(run)["reason"] == "program called sys.exit(3)"


def test_syntax_error(tmp_path):
    run = tmp_path / "run"
    p = tpudiag("profile", "--out", str(run), str(PROGRAMS / "failing" / "syntax_error.py"))
    assert p.returncode == 1
    assert "SyntaxError" in p.stderr and "syntax_error.py" in p.stderr
    assert "Traceback" not in p.stderr
    assert manifest(run)["status"] == "failed"


def test_program_killed_by_a_signal(tmp_path):
    run = tmp_path / "run"
    p = tpudiag("profile", "--out", str(run), str(PROGRAMS / "failing" / "killed.py"))
    assert p.returncode == 128 + signal.SIGKILL
    m = manifest(run)
    assert m["status"] == "failed" and m["reason"] == "killed by SIGKILL"
    assert json.loads((run / "report.json").read_text())["status"] == "failed"


def test_ctrl_c_writes_the_trace_and_exits_130(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "profile", "--out", str(run),
                             str(PROGRAMS / "failing" / "sleeps.py")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    for line in proc.stdout:
        if "ready" in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    m = manifest(run)
    assert m["status"] == "failed" and "interrupted" in m["reason"]
    assert m["xplanes"], "the trace was written"
    assert "Traceback" not in err


def test_python_m_and_console_script_agree():
    a = subprocess.run([sys.executable, "-m", "tpudiag", "--version"], capture_output=True, text=True)
    b = subprocess.run([os.path.join(os.path.dirname(sys.executable), "tpudiag"), "--version"],
                       capture_output=True, text=True)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and "tpudiag" in a.stdout


def test_cli_import_does_not_load_jax():
    code = "import sys, tpudiag.cli; sys.exit(1 if 'jax' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("program", ["collective.py"])
def test_program_setting_its_own_xla_flags(tmp_path, program):
    """collective.py appends --xla_force_host_platform_device_count=8 before it imports jax: that must still work."""
    p = tpudiag("profile", "--json", "--out", str(tmp_path / "run"), str(PROGRAMS / program))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["devices"]) == 8
    assert doc["breakdown"]["communication_s"] > 0


def test_paths_with_spaces_keep_the_hlo_join(tmp_path):
    """XLA splits XLA_FLAGS on spaces: the dump path must still land in the run directory."""
    import shutil

    d = tmp_path / "a dir"
    d.mkdir()
    shutil.copy(PROGRAMS / "mlp.py", d / "my prog.py")
    p = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--json", "--out", "run 1", "my prog.py",
                        "--", "--steps", "2"], cwd=d, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["argv"][0] == "my prog.py"
    assert not any("no matching instruction" in w for w in doc["warnings"])
    assert any(o["source"] and "my prog.py:" in o["source"] for o in doc["ops"])


def test_step_window_longer_than_the_program_warns(tmp_path):
    p = tpudiag("profile", "--json", "--steps", "5", "--out", str(tmp_path / "run"),
                str(PROGRAMS / "mlp.py"), "--", "--steps", "2")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["steps"]["count"] == 2
    assert any("asked for more steps than the program ran (2)" in w for w in doc["warnings"])


def test_profile_with_a_tpu_target(tmp_path):
    """`profile --target`: the run's own computations compiled for v5e, estimated beside the CPU times."""
    run = tmp_path / "run"
    p = tpudiag("profile", "--json", "--target", "v5e", "--no-static-profile", "--out", str(run),
                str(PROGRAMS / "mlp.py"), "--", "--steps", "2")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    est = doc["tpu_estimate"]
    assert est["target"]["chip"] == "v5e" and est["status"] == "ok"
    mods = {m["name"]: m for m in est["modules"]}
    train = mods["jit_train_step"]
    assert train["executions"] == 2 and train["status"] == "ok"
    assert train["tpu_estimated_total_s"] == pytest.approx(2 * train["tpu_estimated_s"])
    # The step estimate weights each module by its runs inside the steps: here make_inputs runs in
    # step 0 and train_step once per step.
    expected = sum(m["tpu_estimated_s"] * n for m, n in ((train, 2), (mods["jit_make_inputs"], 1))) / 2
    assert est["step"]["tpu_estimated_s"] == pytest.approx(expected, rel=1e-6)
    assert any(ln["source"].endswith(("mlp.py:55", "mlp.py:56")) and ln["cpu_self_s"] > 0 for ln in est["lines"])
    assert (run / "tpu" / "report.json").is_file()
    assert json.loads(tpudiag("report", "--json", str(run)).stdout) == doc
    # The compile's unpriced suggestions ride along: a plain MLP has none worth a kernel.
    assert est["suggestions"]["schema"] == "tpudiag.suggest/1" and est["suggestions"]["suggestions"] == []
    text = tpudiag("report", "--no-color", "--width", "120", str(run)).stdout
    assert "Suggestions\n  No op clears the minimums for a custom kernel." in text


def test_profile_target_is_checked_before_the_program_runs(tmp_path):
    p = tpudiag("profile", "--target", "v9", "--out", str(tmp_path / "run"), str(PROGRAMS / "mlp.py"))
    assert p.returncode == 2 and "valid targets" in p.stderr
    assert not (tmp_path / "run").exists()
