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
    # The fixture run traced 2 steps: the window that fits them skips 1 (a run of 5 steps: below).
    assert ("tpudiag profile --steps 1 --skip 1 decoder.py -- --steps 5" in text) == (share > 1 / 3)
    assert steps[-1].startswith("this report again")


def _with_steps(rep, count: int):
    return replace(rep, steps=replace(rep.steps, count=count), breakdown_share={**rep.breakdown_share, "compile": 0.6})


def test_the_steady_state_command_fits_the_steps_the_program_ran():
    """`--steps 3 --skip 2` selects no step of a program that ran fewer than 3 (`decode_step.py`
    runs one) or marks none (no StepTraceAnnotation): printed as the thing to do next, it then
    failed with "nothing was traced" (exit 2). The command now fits what the run found."""
    rep = _report("decoder")
    assert "--steps 3 --skip 2 decoder.py" in next_steps(_with_steps(rep, 5), "decoder.py")[0]
    assert "--steps 2 --skip 2 decoder.py" in next_steps(_with_steps(rep, 4), "decoder.py")[0]
    assert "--steps 1 --skip 1 decoder.py" in next_steps(_with_steps(rep, 2), "decoder.py")[0]
    one = next_steps(_with_steps(rep, 1), "decoder.py")[0]
    assert "ran one step" in one and one.endswith("-- OPTIONS")
    none = next_steps(_with_steps(rep, 0), "decoder.py")[0]
    assert "marks none" in none and "jax.profiler.StepTraceAnnotation" in none
    again = next_steps(_with_steps(rep, 3), "decoder.py", (), steps=3, skip=2)[0]
    assert "compiles again in its steady state" in again and "tpudiag profile --steps" not in again


def test_the_printed_steady_state_command_runs(tmp_path):
    """End to end on a held-out program of two marked steps: the command the first run prints is run
    as printed, and traces a step (the old `--steps 3 --skip 2` selected none of two)."""
    import shlex
    import subprocess
    import sys

    (tmp_path / "two.py").write_text(
        "import jax, jax.numpy as jnp\n@jax.jit\ndef f(x):\n    return jnp.tanh(x @ x)\n"
        "x = jnp.ones((128, 128))\nfor i in range(2):\n"
        "    with jax.profiler.StepTraceAnnotation('step', step_num=i):\n        x = f(x).block_until_ready()\n")
    first = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--out", "a", "two.py"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    printed = [ln for ln in first.stdout.splitlines() if "tpudiag profile --steps" in ln]
    if not printed:  # compile was under a third of the window on this machine: nothing to follow
        return
    cmd = shlex.split(printed[0][printed[0].index("tpudiag profile"):])
    assert cmd[:2] == ["tpudiag", "profile"] and "OPTIONS" not in cmd
    second = subprocess.run([sys.executable, "-m", "tpudiag", *cmd[1:]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]


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
