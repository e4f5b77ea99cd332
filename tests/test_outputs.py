"""Every output path is checked before any work (tpudiag/outputs.py): a run directory (`--out`), and
the `--html`, `--perfetto`, `--junit` and `hlo-diff --html` files. Real directories and files only.

The tests run as root, where a 0o500 directory is still writable; an unwritable parent is therefore
a path under a regular file or a missing directory, and a real "Permission denied" is checked by
running tpudiag as an unprivileged user (or, for a non-root run, with a 0o500 directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS, PROGRAMS, ROOT, file_tree, run_main
from tpudiag import api
from tpudiag.errors import InputError
from tpudiag.outputs import check_output_file, check_run_dir

MLP = str(PROGRAMS / "mlp.py")


# ------------------------------------------------------------------ the check itself


def test_a_file_under_a_regular_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError) as e:
        check_output_file(tmp_path / "afile" / "x.html")
    assert str(e.value) == f"{tmp_path / 'afile' / 'x.html'}: {tmp_path / 'afile'} is not a directory"


def test_a_file_in_a_missing_directory_is_refused_and_nothing_is_created(tmp_path):
    with pytest.raises(InputError) as e:
        check_output_file(tmp_path / "missing" / "x.html")
    assert str(e.value) == f"{tmp_path / 'missing' / 'x.html'}: the directory {tmp_path / 'missing'} does not exist"
    assert file_tree(tmp_path) == []


def test_a_directory_is_not_a_file_name(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        check_output_file(tmp_path)


def test_a_writable_file_path_passes_and_is_not_created(tmp_path, monkeypatch):
    assert check_output_file(tmp_path / "p.html") == tmp_path / "p.html"
    monkeypatch.chdir(tmp_path)
    assert str(check_output_file("p.html")) == "p.html"  # a bare name: the current directory
    assert file_tree(tmp_path) == []


def test_run_directory_rules(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=f"{tmp_path / 'afile'} is not a directory"):
        check_run_dir(tmp_path / "afile" / "deeper" / "run")
    full = tmp_path / "full"
    full.mkdir()
    (full / "manifest.json").write_text("{}")
    with pytest.raises(InputError, match="never overwrites a run"):
        check_run_dir(full)
    with pytest.raises(InputError, match="afile: is a file, not a directory"):  # even an empty one
        check_run_dir(tmp_path / "afile")
    (tmp_path / "empty_file").write_text("")
    with pytest.raises(InputError, match="empty_file: is a file, not a directory"):
        check_run_dir(tmp_path / "empty_file")
    # Missing parents are created with the run; an existing empty directory is used as it is.
    assert check_run_dir(tmp_path / "a" / "b" / "run") == tmp_path / "a" / "b" / "run"
    (tmp_path / "empty").mkdir()
    check_run_dir(tmp_path / "empty")
    assert file_tree(tmp_path) == ["afile", "empty", "empty_file", "full", "full/manifest.json"], "the check created nothing"


def _read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    return d


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o500 directory; see the setpriv test")
def test_a_read_only_directory_is_permission_denied(tmp_path):
    d = _read_only_dir(tmp_path)
    with pytest.raises(InputError, match=r"cannot write here \(Permission denied\)$"):
        check_output_file(d / "p.html")
    with pytest.raises(InputError, match=r"cannot write here \(Permission denied\)$"):
        check_run_dir(d / "run")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_permission_denied_for_an_unprivileged_user(tmp_path):
    """The real kernel answer: tpudiag run as `nobody` against a root-owned 0o555 directory."""
    import tempfile

    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    probe = subprocess.run([*as_nobody, "-c", "import tpudiag"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:  # e.g. a pyenv Python under /root, which nobody may not read
        pytest.skip(f"this Python does not run as nobody: {probe.stderr.strip().splitlines()[-1][:120]}")
    d = tempfile.mkdtemp(prefix="tpudiag-ro-")  # /tmp/pytest-of-root is not searchable by nobody
    try:
        os.chmod(d, 0o555)
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "tpudiag",
               "profile", "--html", f"{d}/p.html", MLP]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        assert p.returncode == 2, p.stderr
        assert p.stderr == f"tpudiag: error: {d}/p.html: cannot write here (Permission denied)\n"
        assert p.stdout == "" and os.listdir(d) == []
    finally:
        os.chmod(d, 0o700)
        shutil.rmtree(d)


# ------------------------------------------------------------------ before any work, in every command


def test_profile_html_in_a_missing_directory_fails_before_the_program_runs(tmp_path):
    bad = tmp_path / "missing" / "p.html"
    p = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--html", str(bad), MLP], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr == f"tpudiag: error: {bad}: the directory {bad.parent} does not exist\n"
    assert "mlp: steps=" not in p.stdout + p.stderr, "the program never ran"
    assert file_tree(tmp_path) == [], "no run directory (tpudiag-runs/...) was created"


@pytest.mark.parametrize("option", ["--out", "--html"])
def test_profile_unwritable_output_is_one_line_and_no_run(tmp_path, capsys, option):
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / ("run" if option == "--out" else "p.html")
    args = ["profile", option, str(bad), MLP]
    if option == "--html":
        args[1:1] = ["--out", str(tmp_path / "run")]
    rc, out, err = run_main(args, capsys)
    assert rc == 2 and out == ""
    assert err == f"tpudiag: error: {bad}: {tmp_path / 'afile'} is not a directory\n"
    assert file_tree(tmp_path) == ["afile"]


def test_compile_unwritable_out_fails_before_the_script_runs(tmp_path, capsys):
    rc, out, err = run_main(["compile", "--target", "v5e", "--out", str(tmp_path / "missing" / "x" / "run"),
                             "--html", str(tmp_path / "missing" / "c.html"), MLP], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'missing' / 'c.html'}: the directory {tmp_path / 'missing'} does not exist" in err
    assert file_tree(tmp_path) == []


def test_kernels_verify_junit_fails_before_any_case_runs(tmp_path, capsys):
    bad = tmp_path / "missing" / "j.xml"
    rc, out, err = run_main(["kernels", "verify", "rmsnorm", "--seed", "1", "--junit", str(bad)], capsys)
    assert rc == 2
    assert out == "", "no case ran, so no result was printed"
    assert err == f"tpudiag: error: {bad}: the directory {bad.parent} does not exist\n"


def test_kernels_bench_unwritable_out(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    rc, out, err = run_main(["kernels", "bench", "rmsnorm", "--target", "v5e", "--out",
                             str(tmp_path / "afile" / "run")], capsys)
    assert rc == 2 and out == "" and "is not a directory" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command,name", [
    (["report", "--html", "{bad}", "{mlp}"], "out.html"),
    (["export", "--perfetto", "{bad}", "{mlp}"], "out.json"),
    (["hlo-diff", "--html", "{bad}", "{mlp}", "{mlp}"], "out.html"),
])
def test_read_commands_refuse_an_unwritable_file(tmp_path, capsys, command, name):
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / name
    args = [a.format(bad=bad, mlp=ARTIFACTS / "mlp") for a in command]
    rc, out, err = run_main(args, capsys)
    assert rc == 2 and out == ""
    assert err == f"tpudiag: error: {bad}: {tmp_path / 'afile'} is not a directory\n"


# ------------------------------------------------------------------ the api gives notebooks the same error


def test_api_functions_check_their_output_paths(tmp_path):
    missing = tmp_path / "missing"
    report = api.load_report(ARTIFACTS / "mlp")
    with pytest.raises(InputError, match="does not exist"):
        api.write_html(report, missing / "p.html")
    with pytest.raises(InputError, match="does not exist"):
        api.perfetto_export(ARTIFACTS / "mlp", missing / "t.json")
    with pytest.raises(InputError, match="does not exist"):
        api.kernels_verify(["rmsnorm"], 1, junit_path=missing / "j.xml")
    with pytest.raises(InputError, match="does not exist"):
        api.write_diff_html(api.hlo_diff(ARTIFACTS / "mlp", ARTIFACTS / "mlp", "jit_train_step"),
                             missing / "d.html")
    assert file_tree(tmp_path) == []
    # A good path still gets the page.
    assert api.write_html(report, tmp_path / "p.html").read_text().startswith("<!DOCTYPE html>")


def test_an_html_file_inside_the_new_run_directory_is_fine(tmp_path, capsys):
    """`--out RUN --html RUN/p.html`: RUN does not exist yet, but the run creates it first."""
    run = tmp_path / "run"
    rc, out, err = run_main(["profile", "--out", str(run), "--html", str(run / "p.html"), "--md", MLP], capsys)
    assert rc == 0, err
    assert out.startswith("## tpudiag profile") and (run / "p.html").read_text().startswith("<!DOCTYPE html>")


def _claim(args):
    import datetime

    from tpudiag.capture.rundir import default_run_dir

    from tpudiag.capture import rundir

    root, stamp = args
    path = default_run_dir(Path("small.py"), Path(root), datetime.datetime.fromisoformat(stamp))
    # A run would now enter it; this worker only names it. Dropping the claim keeps a worker that
    # exits normally (a spawned process runs its atexit hooks) from removing the empty directory.
    rundir._CLAIMED.pop(path, None)
    return str(path)


def test_runs_started_in_the_same_second_each_claim_their_own_directory(tmp_path):
    # Six processes name a run in the same second: each mkdir either claims a name or moves on.
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(6) as pool:
        dirs = pool.map(_claim, [(str(tmp_path / "tpudiag-runs"), "2026-12-06T11:47:50")] * 6)
    assert len(set(dirs)) == 6
    assert sorted(Path(d).name for d in dirs) == ["20261206-114750-small"] + [f"20261206-114750-small-{n}"
                                                                               for n in range(2, 7)]
    assert all(Path(d).is_dir() and not any(Path(d).iterdir()) for d in dirs)
    check_run_dir(dirs[0])  # a claimed, empty directory is a valid run directory
