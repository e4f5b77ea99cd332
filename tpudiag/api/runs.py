"""What a path given to a command is: decided once, here, for every command that reads a run, a
file or a directory (`report`, `compare`, `suggest`, `fusions`, `hlo-diff`, `export`).

Reads a run directory's manifest (once: the handle carries it) and looks at the names and files
under a directory; returns a `RunHandle`. It parses no trace, HLO or report and builds nothing:
each workflow maps the kinds it takes to its own reading, and says in its own words why it
refuses the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpudiag.capture import rundir
from tpudiag.errors import InputError
from tpudiag.results.manifest import Manifest

PROFILE = "profile"  # a run directory of one process (`profile`; also a shadow run)
COMPILE = "compile"  # a compile run (`compile`, `tpudiag.compile(fn)`)
ESTIMATE = "estimate"  # a compile run that holds `tpudiag estimate`'s estimate.json
JOB = "job"  # a `profile --processes N` run: its manifest lists the processes
SEARCH = "search"  # a `kernels bench`, `kernels tune` or `plan` run: its report.json is the whole document
POD = "pod"  # a directory with several hosts' traces of one profiling session
XPLANE = "xplane"  # a `.xplane.pb` file (inside a tpudiag run or captured elsewhere)
FILE = "file"  # any other file: HLO text, a report JSON, ...
DIR = "dir"  # any other directory: an XLA dump, an xprof log directory with one trace, an empty one

RUN_KINDS = (PROFILE, COMPILE, ESTIMATE, JOB, SEARCH)
# The manifest kinds of SEARCH runs.
SEARCH_MANIFESTS = ("kernels-bench", "kernels-tune", "plan")


@dataclass(frozen=True)
class RunHandle:
    """A path and what it is. `manifest`: a run directory's, read once. `run`: for an XPLANE, the
    tpudiag run it sits in (None: captured elsewhere). `tpu`: for a PROFILE made with `--target`,
    its compile run. `hosts`: for a POD, the session's traces, one per host."""

    kind: str
    path: Path
    manifest: Manifest | None = None
    run: Path | None = None
    tpu: Path | None = None
    hosts: tuple[Path, ...] = ()

    @property
    def is_run(self) -> bool:
        """A tpudiag run directory (it has a manifest)."""
        return self.kind in RUN_KINDS

    @property
    def is_compile(self) -> bool:
        """A compile run, with or without an estimate."""
        return self.kind in (COMPILE, ESTIMATE)


def open_run(path) -> RunHandle:
    """What `path` is. A path that does not exist is a one-line InputError; a run directory whose
    manifest is unreadable is the manifest's ParseError."""
    if isinstance(path, RunHandle):
        return path
    path = Path(path)
    if rundir.is_run_dir(path):
        manifest = rundir.read_manifest(path)
        if manifest.processes is not None:
            return RunHandle(JOB, path, manifest)
        if manifest.kind in SEARCH_MANIFESTS:
            return RunHandle(SEARCH, path, manifest)
        if manifest.is_compile:
            kind = ESTIMATE if (path / rundir.ESTIMATE_REPORT).is_file() else COMPILE
            return RunHandle(kind, path, manifest)
        tpu = path / rundir.TPU_DIR
        return RunHandle(PROFILE, path, manifest, tpu=tpu if rundir.is_run_dir(tpu) else None)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        if path.name.endswith(".xplane.pb"):
            return RunHandle(XPLANE, path, run=_run_of_xplane(path))
        return RunHandle(FILE, path)
    hosts = session_xplanes(path)
    return RunHandle(POD, path, hosts=tuple(hosts)) if hosts else RunHandle(DIR, path)


def _run_of_xplane(xplane: Path) -> Path | None:
    """RUN for RUN/trace/plugins/profile/<session>/<host>.xplane.pb, if RUN is a tpudiag run."""
    parents = xplane.resolve().parents
    if len(parents) > 4 and rundir.is_run_dir(parents[4]):
        return parents[4]
    return None


def session_xplanes(path: Path) -> list[Path] | None:
    """The xplanes of one profiling session with several hosts under `path` (a session directory,
    an XProf log directory or `.../plugins/profile`), or None when it holds one trace or none. With
    several sessions, the newest (XProf names them by time)."""
    path = Path(path)
    for pattern in ("*.xplane.pb", "plugins/profile/*/*.xplane.pb", "*/*.xplane.pb"):
        found = sorted(path.glob(pattern))
        if found:
            newest = max(p.parent for p in found)
            hosts = [p for p in found if p.parent == newest]
            return hosts if len(hosts) > 1 else None
    return None


def refuse_job(run: RunHandle, command: str) -> None:
    """`command` reads one process's run: given a `profile --processes N` run, say which to give."""
    if run.kind == JOB and (run.path / rundir.PROCESSES_DIR).is_dir():
        raise InputError(f"{run.path}: a {run.manifest.num_processes}-process job; `tpudiag {command}` reads one "
                         f"process's run: tpudiag {command} {run.path}/{rundir.PROCESSES_DIR}/p0 (or p1, ...)")
