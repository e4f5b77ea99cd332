"""How the profiled program lives and dies with tpudiag, with real processes: a closed terminal
(SIGHUP) and SIGKILL of tpudiag end the program too; an error in tpudiag while the program runs ends
it and fails its run; a background process the program started does not keep tpudiag waiting;
standard input reaches the program; a non-ASCII script path reads back."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PROGRAMS, ROOT, as_in_a_terminal

ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


def _start(run: Path, program: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tpudiag", "profile", "--out", str(run), str(program), *args],
                            env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=as_in_a_terminal)


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _wait_until_ready(run: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    """The program's pid, once it has printed "ready"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        log = run / "program.log"
        if log.is_file() and b"ready" in log.read_bytes():
            return _manifest(run)["program_pid"]
        time.sleep(0.1)
    raise AssertionError(f"the program never got ready: {proc.poll()}")


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").is_file() and Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z":
            return True  # exited, not yet reaped by its (new) parent
        time.sleep(0.05)
    return False


def test_a_closed_terminal_ends_the_program_and_the_run_says_so(tmp_path):
    run = tmp_path / "hup"
    proc = _start(run, PROGRAMS / "failing" / "sleeps.py")
    program = _wait_until_ready(run, proc)
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=60)
    assert _gone(program, within=1.0), "the program must not outlive tpudiag"
    m = _manifest(run)
    assert proc.returncode == 128 + signal.SIGHUP and m["status"] == "failed" and "SIGHUP" in m["reason"]


def test_sigkill_of_tpudiag_takes_the_program_down_and_the_next_reader_says_what_happened(tmp_path):
    run = tmp_path / "kill"
    proc = _start(run, PROGRAMS / "failing" / "sleeps.py")
    program = _wait_until_ready(run, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert _gone(program, within=1.0), "the program must not outlive tpudiag"
    assert _manifest(run)["status"] == "running"  # nobody was left to finish it ...
    report = subprocess.run([sys.executable, "-m", "tpudiag", "report", "--json", str(run)], env=ENV, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    m = _manifest(run)  # ... until the next reader
    assert m["status"] == "failed" and f"tpudiag (pid {proc.pid}) stopped before it finished" in m["reason"]
    doc = json.loads(report.stdout)
    assert doc["status"] == "failed" and doc["reason"] == m["reason"]


def test_an_error_while_the_program_runs_kills_it_and_fails_its_run(tmp_path):
    """`ProgramProcess` driven as `run_program` drives it, with the caller's block raising while the
    program sleeps: the program (and its process group) is gone and the manifest says why."""
    import io

    from tpudiag.capture.process import ChildSpec, ProgramProcess, child_env
    from tpudiag.capture.rundir import RunDir

    run = tmp_path / "run"
    out = io.BytesIO()
    with pytest.raises(RuntimeError, match="the caller failed"):
        with ProgramProcess(RunDir(run, "profile"), ChildSpec(PROGRAMS / "failing" / "sleeps.py"),
                            child_env(run, ENV), stdout=out, stderr=out) as proc:
            deadline = time.monotonic() + 120
            while b"ready" not in (run / "program.log").read_bytes() and proc.running():
                assert time.monotonic() < deadline, "the program never got ready"
                time.sleep(0.1)
            raise RuntimeError("the caller failed")
    assert _gone(proc.pid, within=1.0) and proc.popen.returncode == -signal.SIGKILL
    m = _manifest(run)
    assert (m["status"], m["exit_code"], m["reason"]) == ("failed", 1, "tpudiag failed: the caller failed")
    assert m["program_pid"] == proc.pid and b"ready" in out.getvalue()


def test_a_background_process_does_not_keep_tpudiag_waiting(tmp_path):
    run = tmp_path / "daemon"
    t0 = time.monotonic()
    proc = _start(run, PROGRAMS / "spawns_background.py", "--", "--seconds", "60")
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    m = _manifest(run)
    (daemon,) = m["left_running"]
    try:
        assert proc.returncode == 0, err.decode()
        assert f"background pid {daemon}".encode() in (run / "program.log").read_bytes()
        assert took < 50, "tpudiag finished with the program, not with its 60 s background process"
        doc = json.loads(subprocess.run([sys.executable, "-m", "tpudiag", "report", "--json", str(run)], env=ENV,
                                        cwd=ROOT, capture_output=True, text=True, timeout=120).stdout)
        assert any(f"background process(es) running (pid {daemon})" in w for w in doc["warnings"])
    finally:
        try:
            os.kill(daemon, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_standard_input_reaches_the_program(tmp_path):
    run = tmp_path / "stdin"
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--out", str(run),
                           str(PROGRAMS / "reads_stdin.py")], env=ENV, cwd=ROOT, input=b"hello tpu\n",
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"read: hello tpu (10)" in (run / "program.log").read_bytes()


def test_a_non_ascii_script_path_reads_back_as_written(tmp_path):
    where = tmp_path / "café"
    where.mkdir()
    shutil.copy(PROGRAMS / "mlp.py", where / "mlp.py")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--json", "--out", str(run),
                           str(where / "mlp.py"), "--", "--steps", "1"], env=ENV, cwd=ROOT, capture_output=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()
    sources = {o["source"] for o in json.loads(proc.stdout)["ops"] if o["source"]}
    assert sources and all("café/mlp.py:" in s for s in sources if "mlp.py" in s), sorted(sources)[:3]
    assert not any("\\303" in s for s in sources)


@pytest.mark.parametrize("text,expected", [(r"caf\303\251/x.py", "café/x.py"), (r"params[\'b1\']", "params['b1']"),
                                           (r"a\\b", "a\\b"), (r"\x41\n", "A\n"), ("plain", "plain")])
def test_xla_string_escapes_read_back(text, expected):
    from tpudiag.parse.hlo_text import unescape

    assert unescape(text) == expected


def test_ctrl_c_escalates_for_a_program_that_ignores_it(tmp_path):
    """First Ctrl-C: SIGINT (ignored); second: SIGTERM (ignored); third: SIGKILL."""
    run = tmp_path / "stubborn"
    proc = _start(run, PROGRAMS / "failing" / "ignores_sigint.py")
    program = _wait_until_ready(run, proc)
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
    out, err = proc.communicate(timeout=60)
    assert _gone(program, within=1.0)
    m = _manifest(run)
    assert m["status"] == "failed" and "SIGKILL" in m["reason"] and proc.returncode == 128 + signal.SIGKILL
    assert b"a third Ctrl-C kills the program" in err


def test_nohup_keeps_the_program_running_through_a_hangup(tmp_path):
    """`nohup tpudiag profile ...` starts tpudiag with SIGHUP ignored: the hangup changes nothing."""
    run = tmp_path / "nohup"
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "profile", "--out", str(run),
                             str(PROGRAMS / "failing" / "sleeps.py")], env=ENV, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    program = _wait_until_ready(run, proc)
    try:
        proc.send_signal(signal.SIGHUP)
        assert not _gone(program, within=1.0) and proc.poll() is None
        assert _manifest(run)["status"] == "running"
    finally:
        proc.send_signal(signal.SIGINT)  # end it as a user would
        proc.communicate(timeout=60)
    assert _manifest(run)["status"] == "failed" and "SIGINT" in _manifest(run)["reason"]
