"""The run-directory lifecycle (`capture.rundir.RunDir`): fresh directory, manifest `running` at once,
then `ok`/`failed` with a reason, also when an exception, Ctrl-C or SIGTERM escapes; claimed by one
run only; and a real `tpudiag compile` stopped by a signal in the middle of its work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS, ROOT, as_in_a_terminal
from tpudiag.capture import rundir
from tpudiag.capture.rundir import RunDir
from tpudiag.errors import InputError, ProgramFailed, Terminated


def _manifest(path):
    return json.loads((path / rundir.MANIFEST).read_text())


def test_running_at_once_then_ok_with_the_fields_given(tmp_path):
    run = tmp_path / "run"
    with RunDir(run, "compile", rundir.COMPILE_SUBDIRS, program="x.py", target={"topology": "v5e:2x2"}) as rd:
        m = _manifest(run)
        assert (m["schema"], m["kind"], m["status"], m["program"]) == (rundir.MANIFEST_SCHEMA, "compile", "running",
                                                                         "x.py")
        assert m["versions"]["tpudiag"] and m["exit_code"] is None and (run / "modules").is_dir()
        rd.update(source={"kind": "script"})
        assert _manifest(run)["source"] == {"kind": "script"}, "update is written at once"
    m = _manifest(run)
    assert (m["status"], m["exit_code"], m["reason"]) == ("ok", 0, None) and m["wall_s"] >= 0


def test_finish_records_a_failure_without_an_exception(tmp_path):
    with RunDir(tmp_path / "run", "compile") as rd:
        rd.finish(False, exit_code=3, reason="2 module(s) failed to compile", extra=1)
    m = _manifest(tmp_path / "run")
    assert (m["status"], m["exit_code"], m["reason"], m["extra"]) == ("failed", 3, "2 module(s) failed to compile", 1)


def test_an_escaping_exception_marks_the_run_failed_and_is_not_swallowed(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with RunDir(tmp_path / "a", "compile"):
            1 / 0
    m = _manifest(tmp_path / "a")
    assert (m["status"], m["exit_code"], m["reason"]) == ("failed", 1, "tpudiag failed: division by zero")
    with pytest.raises(KeyboardInterrupt):
        with RunDir(tmp_path / "b", "compile"):
            raise KeyboardInterrupt
    assert (_manifest(tmp_path / "b")["status"], _manifest(tmp_path / "b")["exit_code"]) == ("failed", 130)
    # A tpudiag error the block already recorded keeps its own status and reason.
    with pytest.raises(ProgramFailed):
        with RunDir(tmp_path / "c", "compile") as rd:
            rd.finish(False, exit_code=4, reason="the program exited with code 4")
            raise ProgramFailed("the program failed", 4)
    assert _manifest(tmp_path / "c")["reason"] == "the program exited with code 4"


def test_sigterm_inside_the_block_becomes_a_failed_run(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with RunDir(tmp_path / "run", "kernels-bench"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
    m = _manifest(tmp_path / "run")
    assert (m["status"], m["exit_code"], m["reason"]) == ("failed", 143, "tpudiag failed: terminated by signal SIGTERM")
    assert signal.getsignal(signal.SIGTERM) is previous, "the handler is restored"


def test_never_over_an_existing_run(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="already exists and is not empty"):
        with RunDir(tmp_path / "run", "compile"):
            pass
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine" and not (tmp_path / "run" / rundir.MANIFEST).exists()


def _claim(path: Path, start, results) -> None:
    start.wait()
    try:
        rundir.create_run_dir(path, rundir.PROFILE_SUBDIRS)
        results.put("claimed")
    except InputError as e:
        results.put(str(e))


def test_runs_given_one_out_at_the_same_moment_get_it_once(tmp_path):
    """Eight processes released at once create one --out: exactly one gets it, the others are told in
    one line. Both passed the emptiness check before (it and the subdirectories' mkdir were not one
    step), so two runs could write one directory."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(tmp_path / "run", start, results)) for _ in range(8)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    got = sorted(results.get(timeout=10) for _ in procs)
    assert got.count("claimed") == 1, got
    assert all("already exists" in g or "claimed this directory" in g for g in got if g != "claimed"), got


def _workers_of(run) -> list[int]:
    """Live processes whose command line names the run directory (its compile workers)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "tpudiag.capture.tpu_worker" in cmd and str(run) in cmd:
                pids.append(int(d.name))
    return pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_real_compile_stopped_by_a_signal_ends_its_workers_and_says_so(tmp_path, signum):
    """`tpudiag compile` of a JAX IR dump (four modules, one compile worker at a time): SIGTERM,
    Ctrl-C or SIGHUP (a closed terminal) while a TPU compile worker runs. The worker is killed with
    tpudiag (none is left), the run says `failed` with the signal instead of staying `running` (with
    SIGHUP it did: Python's default killed tpudiag on the spot), and no module is reported as a
    compiler abort."""
    run = tmp_path / "run"
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "compile", "--target", "v5e", "--jobs", "1", "--out",
                             str(run), str(ARTIFACTS / "decoder" / "ir")], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=as_in_a_terminal)
    deadline = time.monotonic() + 120
    while not _workers_of(run) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)  # a compile worker is running
    assert _workers_of(run) and _manifest(run)["status"] == "running"
    started = sorted(d.name for d in (run / "modules").iterdir())
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    m = _manifest(run)
    code = 130 if signum == signal.SIGINT else 128 + signum
    assert proc.returncode == code and m["status"] == "failed" and m["exit_code"] == code, err.decode()
    if signum != signal.SIGINT:
        name = signal.Signals(signum).name
        assert m["reason"] == f"tpudiag failed: terminated by signal {name}"
        assert err.decode().strip().splitlines()[-1] == f"tpudiag: error: terminated by signal {name}"
    else:
        assert m["reason"] == "interrupted (Ctrl-C)"
        assert err.decode().strip().splitlines()[-1] == "tpudiag: interrupted"
    assert "aborted" not in err.decode()
    assert _workers_of(run) == []  # killed with tpudiag, not left running
    # The module compiling when the signal came never finished, and no module started after it.
    assert sorted(d.name for d in (run / "modules").iterdir()) == started
    assert not (run / "modules" / started[-1] / rundir.MODULE_RESULT).exists()
