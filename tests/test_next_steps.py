"""The "Next:" block `tpudiag profile` prints under a first run's report, chosen from what it found."""

from __future__ import annotations

from dataclasses import replace

from tests.conftest import ARTIFACTS, PROGRAMS, ROOT
from tpudiag.report.next_steps import next_steps


def _report(name):
    from tpudiag.api import runs
    from tpudiag.api.load import load_report

    return load_report(runs.open_run(ARTIFACTS / name))


def test_a_cpu_run_is_pointed_at_the_steady_state_and_a_tpu_estimate():
    rep = _report("decoder")
    steps = next_steps(rep, "decoder.py", ("--steps", "5"))
    text = "\n".join(steps)
    assert "tpudiag profile --target v5e decoder.py -- --steps 5" in text
    assert "suggest" not in text  # no TPU figures to price kernels against yet
    share = rep.breakdown_share.get("compile") or 0
    assert ("tpudiag profile --steps 3 --skip 2 decoder.py -- --steps 5" in text) == (share > 1 / 3 or
                                                                                     rep.steps.count == 0)
    assert steps[-1].startswith("this report again")


def test_a_run_with_tpu_times_is_pointed_at_suggest_and_a_failed_run_gets_nothing():
    rep = _report("decoder")
    on_tpu = replace(rep, backend="tpu")
    assert any("tpudiag suggest" in s for s in next_steps(on_tpu, "decoder.py"))
    assert not any("--target v5e" in s for s in next_steps(on_tpu, "decoder.py"))
    assert next_steps(replace(rep, status="failed"), "decoder.py") == []


def test_profile_prints_the_block(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--out", str(tmp_path / "run"),
                        str(PROGRAMS / "mlp.py")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    tail = p.stdout[p.stdout.index("\nNext:"):]
    assert "tpudiag profile --target v5e" in tail and "Terms: self:" in tail
