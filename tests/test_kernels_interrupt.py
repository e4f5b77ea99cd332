"""Ctrl-C in a real `python -m tpudiag kernels verify` (interpret mode on the CPU) once it has
started verifying: XLA's CPU client is up (its thread pool shows in /proc/PID/task) and the first
kernel is compiling and running. SIGINT then ends it with exit 130 and the one line `tpudiag:
interrupted`, never a segmentation fault (exit 139, -11: interpreter teardown under XLA's running
threads, 2 of 9 such interrupts before `cli.main` left by `os._exit`) and never a dropped interrupt
(a KeyboardInterrupt raised inside jax's gc callback, which Python ignores). The moments vary by a
pause after the thread pool appears; the test asserts the outcome, never a time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")

_XLA_THREADS = 8  # the CLI alone runs 1-2 threads; XLA's CPU client starts a pool of 15 or more


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("pause_s", [0.5, 1.5, 2.0, 2.5, 3.5])
def test_ctrl_c_during_verify_exits_130_with_one_line(pause_s):
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "kernels", "verify", "--interpret", "--seed", "1"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=env)
    try:
        while proc.poll() is None and _threads(proc.pid) < _XLA_THREADS:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        time.sleep(pause_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
    assert proc.returncode == 130, (proc.returncode, said)
    assert said == ["tpudiag: interrupted"], said  # (click's blank line before it closes the terminal's ^C)
    assert out == b""  # no report for a run cut short
