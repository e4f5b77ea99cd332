"""Can tpudiag write where it was told to? One check, run before any work, for every output path a
command or an api function will write: a run directory (`--out`, or the default one) and a single
file (`--html`, `--perfetto`, `--junit`, `hlo-diff --html`).

Reads only the file system's metadata (`os.access`, `statvfs`); creates nothing. A path it refuses
is an `InputError` (exit 2) whose one line names the path and the reason, so that a run of several
minutes does not end in a PermissionError after the work. It does not guard against a directory
that changes between the check and the write (that stays an error at the write).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from tpudiag.errors import InputError


def _why_not_writable(directory: Path) -> str | None:
    """None if files can be created in the existing `directory`, else the reason (as the OS says it)."""
    if not directory.is_dir():
        return f"{directory} is not a directory"
    # os.access asks the kernel with the real uid: it honours modes, ACLs and read-only mounts (for
    # root only the last). W_OK to create the entry, X_OK to reach it.
    if os.access(directory, os.W_OK | os.X_OK):
        return None
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "cannot write here (Read-only file system)"
    except OSError:
        pass
    return "cannot write here (Permission denied)"


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (`.` for a relative path that has none)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def check_output_file(path) -> Path:
    """`path` may be written as one file: its directory exists and is writable, and `path` is not a
    directory. Returns `path`."""
    path = Path(path)
    with _unreachable_is_refused(path):
        _check_file(path)
    return path


def check_run_dir(path) -> Path:
    """`path` may become a fresh run directory: it does not exist, or is an empty directory (a run is
    never overwritten), and it can be created there (its nearest existing ancestor is a writable
    directory). Returns `path`."""
    path = Path(path)
    with _unreachable_is_refused(path):
        _check_run_dir(path)
    return path


@contextmanager
def _unreachable_is_refused(path: Path):
    # A directory on the way that this user may not search makes stat() itself fail (EACCES).
    try:
        yield
    except OSError as e:
        raise InputError(f"{path}: cannot write here ({e.strerror or type(e).__name__})") from None


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise InputError(f"{path}: is a directory (give a file name)")
    parent = path.parent
    if not parent.exists():
        raise InputError(f"{path}: the directory {parent} does not exist")
    why = _why_not_writable(parent)
    if why:
        raise InputError(f"{path}: {why}")


def refuse_existing_run(path: Path) -> None:
    """The never-overwrite rule: an existing file or non-empty directory is not a new run. Checked
    before any work here, and again by `capture.rundir.create_run_dir` when the run is created."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"{path}: already exists and is not empty; tpudiag never overwrites a run "
                         "(choose another --out)")


def _check_run_dir(path: Path) -> None:
    refuse_existing_run(path)
    if path.exists():
        why = _why_not_writable(path)
    else:
        why = _why_not_writable(_nearest_existing(path.parent))
    if why:
        raise InputError(f"{path}: {why}")
