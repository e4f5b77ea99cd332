"""A stop (Ctrl-C, SIGTERM, SIGHUP) ends tpudiag and the program it runs, wherever it lands: inside a
garbage-collection callback, inside code that catches `Exception`, during the shadow run of
`tpudiag compile SCRIPT`, before the program has started. Real processes; the time limits are guards
against a stop that is lost (the command would then run on), never measurements."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, as_in_a_terminal

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux signals and /proc")
ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
GUARD_S = 60  # far beyond the 5 s a stop may take: a lost stop runs until this, or forever

# Sends itself the signal from inside a gc callback that keeps running until the handler has run
# there, so its exception is raised where Python drops it; then works on in plain Python.
_STOPPED_IN_GC = """
import gc, os, signal, sys, time
from tpudiag.capture import workers
workers.install_handlers()
ran = []
def callback(phase, info):
    if phase == "start" and not ran:
        ran.append(1)
        os.kill(os.getpid(), signal.{sig})
        t = time.monotonic()
        while time.monotonic() - t < 0.5:  # the handler runs here, inside the callback
            pass
gc.callbacks.append(callback)
gc.collect()
print("went on", flush=True)
try:
    t = time.monotonic()
    while time.monotonic() - t < {guard}:
        try:
            sum(range(1000))  # code that turns failures into results: it must not swallow a stop
        except Exception:
            pass
except BaseException as e:
    print("stopped by", type(e).__name__, *([e.exit_code] if hasattr(e, "exit_code") else []), flush=True)
    raise SystemExit(3)
print("never stopped", flush=True)
"""


@pytest.mark.parametrize("sig,raised", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated 143"),
                                        ("SIGHUP", "Terminated 129")])
def test_a_stop_dropped_inside_a_gc_callback_is_raised_again(sig, raised):
    """Python drops an exception raised in a gc callback: before, the stop stayed recorded and
    `kernels verify` went on to the end of its case (30 s after a SIGTERM). Now it is raised again
    at once, and `Terminated` (SIGTERM, SIGHUP) is not an Exception for `except Exception` to eat."""
    p = subprocess.run([sys.executable, "-c", _STOPPED_IN_GC.format(sig=sig, guard=GUARD_S)], env=ENV,
                       capture_output=True, text=True, timeout=GUARD_S + 30, preexec_fn=as_in_a_terminal)
    assert p.stdout.splitlines() == ["went on", f"stopped by {raised}"], p.stdout + p.stderr
    assert p.returncode == 3 and "Exception ignored" not in p.stderr, p.stderr


# A command whose main thread waits in C and does not come back for a signal (SA_RESTART: the read
# is resumed by the kernel, so Python's handler never runs), inside a run directory.
_WAITS_IN_C = """
import os, signal, sys
from pathlib import Path
from tpudiag.capture import workers
from tpudiag.capture.rundir import RunDir
def leave(stop):
    print("left by the stop watch:", type(stop).__name__, flush=True)
    os._exit(getattr(stop, "exit_code", 130))
workers.install_handlers(leave=leave)
never_written, _ = os.pipe()
with RunDir(Path(sys.argv[1]), "compile", ("modules",)):  # (it sets its own SIGTERM handler)
    for s in workers.STOP_SIGNALS:
        signal.siginterrupt(s, False)
    print("ready", flush=True)
    os.read(never_written, 1)
print("never stopped", flush=True)
"""


@pytest.mark.parametrize("sig,raised,reason", [
    (signal.SIGINT, "KeyboardInterrupt", "interrupted (Ctrl-C)"),
    (signal.SIGTERM, "Terminated", "tpudiag failed: terminated by signal SIGTERM")])
def test_a_stop_the_main_thread_cannot_raise_is_forced_by_the_stop_watch(tmp_path, sig, raised, reason):
    """`kernels verify` waited 39 s after a SIGTERM for an interpret-mode computation in C to return.
    The stop watch thread sees the signal itself and, FORCE_AFTER_S later, marks the run directory
    and leaves; the main thread here never returns from C, so only the watch can end it."""
    from tpudiag.capture.workers import FORCE_AFTER_S

    proc = subprocess.Popen([sys.executable, "-c", _WAITS_IN_C, str(tmp_path / "run")],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_in_a_terminal)
    _wait_for(proc, "ready")
    time.sleep(0.5)  # from its print into its read
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=GUARD_S + 30)
    code = 130 if sig == signal.SIGINT else 143
    assert (proc.returncode, out) == (code, f"left by the stop watch: {raised}\n"), err
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (m["status"], m["exit_code"], m["reason"]) == ("failed", code, reason)
    assert FORCE_AFTER_S <= m["wall_s"] < GUARD_S


# A program that says "ready" from inside a gc callback and stays in it for 2 s: the forwarded Ctrl-C
# lands there. Then it works on in plain Python.
_STOPPED_IN_ITS_GC = """
import gc, time
import jax.numpy as jnp
print(float(jnp.ones(4).sum()), flush=True)
ran = []
def callback(phase, info):
    if phase == "start" and not ran:
        ran.append(1)
        print("ready", flush=True)
        t = time.monotonic()
        while time.monotonic() - t < 2.0:
            pass
gc.callbacks.append(callback)
gc.collect()
print("went on", flush=True)
t = time.monotonic()
while time.monotonic() - t < {guard}:
    sum(range(1000))
print("never stopped", flush=True)
"""


def _tpudiag(args, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tpudiag", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal)


def _wait_for(proc: subprocess.Popen, text: str) -> None:
    for line in proc.stdout:
        if text in line:
            return
    raise AssertionError(f"the program never printed {text!r}: {proc.stderr.read()[-2000:]}")


def test_a_ctrl_c_landing_in_the_programs_gc_callback_still_stops_it(tmp_path):
    """The child bootstrap's KeyboardInterrupt raised inside the program's gc callback was dropped
    ("Exception ignored in: <function _xla_gc_callback>") and the program ran on: a Ctrl-C 3 s into
    `tpudiag compile SCRIPT` was lost so. It is raised again in the program now."""
    (tmp_path / "prog.py").write_text(_STOPPED_IN_ITS_GC.format(guard=GUARD_S))
    proc = _tpudiag(["profile", "--out", "run", "prog.py"], tmp_path)
    _wait_for(proc, "ready")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=GUARD_S + 60)
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert proc.returncode == 130 and "never stopped" not in out, err[-2000:]
    assert m["status"] == "failed" and m["reason"] == "interrupted (SIGINT / Ctrl-C)", m
    assert "Exception ignored" not in err and "Traceback" not in err, err[-2000:]


_SLEEPS = "import jax.numpy as jnp\nimport time\nprint(float(jnp.ones(4).sum()))\nprint('ready', flush=True)\n" \
          "time.sleep({guard})\n"


@pytest.mark.parametrize("sig,code,reason", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                             (signal.SIGTERM, 143, "tpudiag failed: terminated by signal SIGTERM")])
def test_a_script_compile_stopped_in_its_shadow_run_compiles_nothing(tmp_path, sig, code, reason):
    """`tpudiag compile SCRIPT` stopped while the script runs on the CPU: before, the program was
    stopped and then every computation it had run was compiled for the TPU anyway (minutes, with
    static profiles) before tpudiag exited. Now the stop ends the command."""
    (tmp_path / "prog.py").write_text(_SLEEPS.format(guard=GUARD_S))
    proc = _tpudiag(["compile", "--target", "v5e", "--no-static-profile", "--no-cache", "--out", "run", "prog.py"],
                    tmp_path)
    _wait_for(proc, "ready")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=GUARD_S)
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert proc.returncode == code, err[-2000:]
    assert (m["status"], m["exit_code"], m["reason"]) == ("failed", code, reason)
    assert list((tmp_path / "run" / "modules").iterdir()) == []  # nothing was compiled
    assert "Traceback" not in err and "module" not in err, err[-2000:]


def test_ctrl_c_before_the_program_starts_leaves_quietly(tmp_path):
    """Ctrl-C while the child bootstrap still imports (before the program runs): the bootstrap
    printed its own KeyboardInterrupt traceback. Now it records the stop and leaves; the run says
    so. The signal goes once the bootstrap catches SIGTERM (/proc: it does so first thing, and Python
    alone never does). (On a machine where jax imports before the signal, the program is interrupted
    instead: the exit and the absence of a traceback hold either way.)"""
    (tmp_path / "prog.py").write_text(_SLEEPS.format(guard=GUARD_S))
    proc = _tpudiag(["profile", "--out", "run", "prog.py"], tmp_path)
    t0, catches_sigterm = time.monotonic(), False
    while not catches_sigterm and time.monotonic() - t0 < GUARD_S:
        time.sleep(0.005)
        try:
            pid = json.loads((tmp_path / "run" / "manifest.json").read_text()).get("program_pid")
            caught = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigCgt"))
            catches_sigterm = bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
        except (OSError, ValueError, StopIteration):
            pass
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=GUARD_S)
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert proc.returncode == 130 and m["status"] == "failed" and "SIGINT" in m["reason"], err[-2000:]
    assert "Traceback" not in err, err[-2000:]
