"""Can tpudiag write where it was told to? One check, run before any work, for every output path a
command or an api function will write: a run directory (`--out`, or the default one) and a single
file (`--html`, `--perfetto`, `--junit`, `hlo-diff --html`).

Reads the file system's metadata (`os.access`, `statvfs`) and, where those say yes, asks the file
system itself: it creates one uniquely named probe entry in the directory and removes it at once,
because `os.access` answers for modes only (root may "write" into /proc, where nothing can be
created). A path it refuses is an `InputError` (exit 2) whose one line names the path and the
reason, so that a run of several minutes does not end in an OSError after the work. For a single
file the command line also asks for the extension of its format and refuses to replace an existing
file unless told to (`--force`); the api functions, called from a notebook, overwrite as `open`
does. It does not guard against a directory that changes between the check and the write (that
stays an error at the write).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tpudiag.errors import InputError

# The extensions each single-file output is written with (what a browser, Perfetto or a CI test
# reporter opens by its name). Perfetto reads the JSON trace plain or gzip-compressed
# (report/perfetto.py compresses when the name ends in .gz).
FILE_KINDS = {
    "html": ("HTML page", (".html", ".htm")),
    "perfetto": ("Chrome JSON trace", (".json", ".json.gz")),
    "junit": ("JUnit XML", (".xml",)),
}


def _why_not_writable(directory: Path, probe: str = "file") -> str | None:
    """None if a `probe` ("file" or "directory") can be created in the existing `directory`, else
    the reason (as the OS says it)."""
    if not directory.is_dir():
        return f"{directory} is not a directory"
    # os.access asks the kernel with the real uid: it honours modes, ACLs and read-only mounts (for
    # root only the last). W_OK to create the entry, X_OK to reach it.
    if not os.access(directory, os.W_OK | os.X_OK):
        try:
            if os.statvfs(directory).f_flag & os.ST_RDONLY:
                return "cannot write here (Read-only file system)"
        except OSError:
            pass
        return "cannot write here (Permission denied)"
    return _probe(directory, probe)


def _probe(directory: Path, kind: str) -> str | None:
    """Create and remove one entry of `kind` in `directory`: the file system's own answer (a pseudo
    file system such as /proc or /sys refuses root too, a full disk refuses everyone)."""
    try:
        if kind == "directory":
            os.rmdir(tempfile.mkdtemp(prefix=".tpudiag-probe-", dir=directory))
        else:
            fd, name = tempfile.mkstemp(prefix=".tpudiag-probe-", dir=directory)
            os.close(fd)
            os.unlink(name)
    except OSError as e:
        return f"cannot create a {kind} in {directory} ({e.strerror or type(e).__name__})"
    return None


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (`.` for a relative path that has none)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def check_output_file(path, kind: str | None = None, *, overwrite: bool = True) -> Path:
    """`path` may be written as one file: its directory exists and is writable, and `path` is not a
    directory. With `kind` (a key of `FILE_KINDS`) its name must end in that format's extension;
    with `overwrite=False` it must not exist yet. Returns `path`."""
    path = Path(path)
    if kind is not None:
        check_extension(path, kind)
    with _unreachable_is_refused(path):
        _check_file(path, overwrite)
    return path


def check_extension(path, kind: str) -> None:
    """The name of a `kind` output (`FILE_KINDS`) ends in one of its extensions (any case)."""
    what, suffixes = FILE_KINDS[kind]
    if not str(path).lower().endswith(suffixes):
        raise InputError(f"{path}: expected a file name ending in {' or '.join(suffixes)} (the {what})")


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


def _check_file(path: Path, overwrite: bool) -> None:
    if path.is_dir():
        raise InputError(f"{path}: is a directory (give a file name)")
    if not overwrite and (path.exists() or path.is_symlink()):
        raise InputError(f"{path}: already exists (--force replaces it; or give another name)")
    parent = path.parent
    if not parent.exists():
        raise InputError(f"{path}: the directory {parent} does not exist")
    why = _why_not_writable(parent)
    if why:
        raise InputError(f"{path}: {why}")


def refuse_existing_run(path: Path) -> None:
    """The never-overwrite rule: an existing file or non-empty directory is not a new run. Checked
    before any work here, and again by `capture.rundir.create_run_dir` when the run is created."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: is a file, not a directory; a run is a directory (choose another --out)")
    if path.exists() and any(path.iterdir()):
        raise InputError(f"{path}: already exists and is not empty; tpudiag never overwrites a run "
                         "(choose another --out)")


def _check_run_dir(path: Path) -> None:
    refuse_existing_run(path)
    if path.exists():
        why = _why_not_writable(path, "directory")
    else:
        why = _why_not_writable(_nearest_existing(path.parent), "directory")
    if why:
        raise InputError(f"{path}: {why}")
