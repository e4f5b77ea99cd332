"""The run directory: its layout, its manifest, and how to find what a capture left in it.

Reads and writes `manifest.json`; knows where the trace, the HLO and IR dumps and the
program's log live. `RunDir` is the one lifecycle every command that writes a run directory goes
through: created fresh (never over a non-empty directory), manifest `running` at once, then `ok` or
`failed` with the reason, also when an exception or SIGTERM escapes. It does not parse traces or
HLO (that is `parse/`).

Layout (documented in docs/run-directory.md):

    RUN/manifest.json              argv, env flags, versions, exit code, status, wall time
    RUN/report.json, report.md     the analysis (`tpudiag report RUN` re-renders it)
    RUN/program.log                the program's stdout and stderr, interleaved
    RUN/trace/plugins/profile/<session>/<host>.xplane.pb   (`xprof --logdir RUN/trace`)
    RUN/trace/plugins/profile/<session>/<host>.trace.json.gz   Chrome-trace JSON (Perfetto)
    RUN/hlo/                       XLA dumps (`--xla_dump_to`): HLO before/after optimizations
    RUN/ir/                        JAX IR dumps (`JAX_DUMP_IR_TO`): StableHLO per jitted computation
    RUN/capture/monitoring.jsonl   jax.monitoring events (tracing, lowering, compile, cache)
    RUN/capture/child.json         how the program ended, written by the child
    RUN/capture/spec.json          what the parent asked the child to run
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

from tpudiag.errors import InputError, ParseError, TpudiagError, one_line
from tpudiag.results.manifest import SCHEMA as MANIFEST_SCHEMA
from tpudiag.results.manifest import Manifest
from tpudiag.outputs import refuse_existing_run

MANIFEST = "manifest.json"
REPORT = "report.json"
REPORT_MD = "report.md"
PROGRAM_LOG = "program.log"
TRACE_DIR = "trace"
HLO_DIR = "hlo"
IR_DIR = "ir"
CAPTURE_DIR = "capture"
MONITORING = "capture/monitoring.jsonl"
CHILD_STATUS = "capture/child.json"
PROCESSES_DIR = "processes"  # a `profile --processes N` job: one process's run per `p<i>/`
TPU_DIR = "tpu"  # inside a profile run: the compile run of its own computations (`profile --target`)
# A compile run (`compile`, `profile --target`'s TPU_DIR, `kernels bench`, `estimate`):
MODULES_DIR = "modules"  # one directory per compiled module, `<NN>-<name>/`
MODULE_JSON = "module.json"  # in a module directory: how its compile ended
MODULE_RESULT = "result.json"  # in a module directory: the compile worker's figures
MODULE_HLO = "optimized.hlo.txt"  # in a module directory: the executable's optimized HLO
# in a module directory: the values of the small integer constants that Pallas kernels take as
# operands (a kernel's scalar-prefetched tables), which the optimized HLO prints as {...}
KERNEL_TABLES = "kernel_tables.json"
LLO_DIR = "llo"  # in a module directory: the final LLO bundles and their slot utilization
STATIC_PROFILE_DIR = "static_profile"  # in a module directory: the static cycle profile
SHADOW_DIR = "shadow"  # `compile SCRIPT.py`: the CPU run of the script that collected its computations
LOWERED_DIR = "lowered"  # `kernels bench`: each variant's StableHLO
KERNELS_COMPILE_REPORT = "compile-report.json"  # `kernels bench`: the compile report of every variant
ESTIMATE_DIR = "estimate"  # `estimate`: the lowered step and the lowering log
ESTIMATE_REPORT = "estimate.json"  # `estimate`: the estimate document (report.json is its compile report)
ESTIMATE_MD = "estimate.md"


def default_run_dir(script: Path, root: Path = Path("tpudiag-runs"), now: _dt.datetime | None = None) -> Path:
    """`tpudiag-runs/<timestamp>-<script stem>`, with a numeric suffix if that name is taken. The
    directory is claimed here, empty, by an atomic mkdir: runs started in the same second (a CI
    matrix) each get their own. Where it cannot be created, the name is returned unclaimed and
    `outputs.check_run_dir` says why."""
    now = now or _dt.datetime.now()
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", script.stem) or "program"
    base = root / f"{now:%Y%m%d-%H%M%S}-{stem}"
    made_root = not root.exists()
    n = 1
    while True:
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            candidate.mkdir(parents=True)
            _claim(candidate, root if made_root else None)
            return candidate
        except FileExistsError:
            n += 1
        except OSError:
            return candidate


# Default run directories claimed by this process and not yet entered by a `RunDir`, each with the
# tpudiag-runs directory the claim created (or None): a command refused after the claim (a script
# that does not exist, an estimate's FUNC the worker refuses, a Ctrl-C while it lowers) leaves
# nothing, not an empty directory (`release_unused_claims`, at exit and on tpudiag's error paths).
_CLAIMED: dict[Path, Path | None] = {}


def _claim(path: Path, made_root: Path | None) -> None:
    if not _CLAIMED:
        import atexit

        atexit.register(release_unused_claims)
    _CLAIMED[path] = made_root


def release_unused_claims() -> None:
    """Remove the claimed default run directories no run was written into (still empty)."""
    for path, made_root in list(_CLAIMED.items()):
        _CLAIMED.pop(path, None)
        for d in (path, made_root):
            try:
                if d is not None:
                    d.rmdir()  # only if empty: whatever is in it stays
            except OSError:
                pass


PROFILE_SUBDIRS = (TRACE_DIR, HLO_DIR, IR_DIR, CAPTURE_DIR)
COMPILE_SUBDIRS = (MODULES_DIR,)


def create_run_dir(path: Path, subdirs: tuple[str, ...] = PROFILE_SUBDIRS) -> Path:
    """Create a fresh run directory. An existing non-empty directory is never reused (runs are never
    overwritten). The run is claimed by an atomic mkdir of its first subdirectory: of two runs given
    the same --out at the same moment, both pass the emptiness check, and only one may write there."""
    refuse_existing_run(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        (path / subdirs[0]).mkdir()
    except FileExistsError:
        raise InputError(f"{path}: another run claimed this directory at the same moment; tpudiag never "
                         "shares a run (choose another --out)") from None
    for sub in subdirs[1:]:
        (path / sub).mkdir(parents=True, exist_ok=True)
    return path


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so a reader never sees half a document."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json_atomic(path: Path, doc: dict) -> None:
    write_text_atomic(path, json.dumps(doc, sort_keys=True, indent=2) + "\n")


def read_manifest(run: Path) -> Manifest:
    """The run's `manifest.json`, checked field by field (a bad one is a ParseError naming the field)."""
    path = run / MANIFEST
    if not path.is_file():
        raise InputError(f"{run}: not a tpudiag run directory (no {MANIFEST})")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ParseError(path, f"not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        raise ParseError(path, f"not a tpudiag manifest (expected schema {MANIFEST_SCHEMA!r})")
    manifest = Manifest.from_dict(doc, str(path))
    if _abandoned(manifest):
        # tpudiag was killed (SIGKILL, a closed terminal during the analysis, the machine): say so,
        # in the file too, so that every later reader sees the same thing.
        doc.update(status="failed", reason=f"tpudiag (pid {manifest.pid}) stopped before it finished this run "
                                           "(killed, or its terminal or machine went away)")
        write_json_atomic(path, doc)
        manifest = Manifest.from_dict(doc, str(path))
    return manifest


def _abandoned(manifest: Manifest) -> bool:
    """`running`, written on this host by a process that no longer exists."""
    if manifest.status != "running" or manifest.pid is None or manifest.host != socket.gethostname():
        return False
    try:
        os.kill(manifest.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def find_xplanes(trace_root: Path) -> list[Path]:
    """All `*.xplane.pb` under a trace directory, newest session last (xprof's layout)."""
    return sorted(trace_root.glob("plugins/profile/*/*.xplane.pb"))


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


class RunDir:
    """A run directory from creation to its final status, as a context manager:

        with RunDir(path, "compile", COMPILE_SUBDIRS, program=..., target=...) as rd:
            ...                       # manifest.json says "running" from the first moment
            rd.update(source=...)     # more manifest fields, written at once
            rd.finish(ok, exit_code=..., reason=...)

    On leaving, the manifest gets `wall_s` and a final `status`: what `finish` said; `failed` with
    the exception's one-line reason (and its `exit_code`, 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP) when one
    escapes (unless `finish` already recorded that tpudiag error); `ok` when the block ended without
    calling `finish`. SIGTERM is turned into the
    `Terminated` error while the block runs (main thread only), so a killed tpudiag still leaves a
    `failed` manifest instead of a `running` one. The exception is never swallowed.
    """

    def __init__(self, path: Path, kind: str, subdirs: tuple[str, ...] = PROFILE_SUBDIRS, **fields):
        self.path = Path(path)
        self.kind = kind
        self.subdirs = subdirs
        from tpudiag.capture.versions import tool_versions

        self.manifest: dict = {"schema": MANIFEST_SCHEMA, "kind": kind, "status": "running", **fields}
        self.manifest.setdefault("versions", tool_versions())
        # Who writes the run: a reader that finds it `running` with this process gone knows it never will.
        self.manifest.setdefault("pid", os.getpid())
        self.manifest.setdefault("host", socket.gethostname())
        self.manifest.setdefault("exit_code", None)
        self.manifest.setdefault("reason", None)
        self._t0 = 0.0
        self._finished = False
        self._previous_sigterm = None

    def __enter__(self) -> RunDir:
        create_run_dir(self.path, self.subdirs)
        _CLAIMED.pop(self.path, None)  # the claim is used
        self._t0 = time.perf_counter()
        self._write()
        from tpudiag.capture import workers

        workers.on_forced_stop(id(self), self._forced)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, workers.on_stop_signal)  # kills the workers too
        return self

    def update(self, **fields) -> None:
        self.manifest.update(fields)
        self._write()

    def finish(self, ok: bool, *, exit_code: int | None = None, reason: str | None = None, **fields) -> None:
        self.manifest.update(fields, status="ok" if ok else "failed",
                             exit_code=(0 if ok else 1) if exit_code is None else exit_code,
                             reason=None if ok else reason)
        self._finished = True

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        from tpudiag.capture import workers

        workers.on_forced_stop(id(self), None)
        stopped = workers.stopping()
        workers.reset()  # a stop inside the block has been handled: its workers are gone
        if exc is not None and not (self._finished and isinstance(exc, TpudiagError)):
            # An error the block already recorded with `finish` keeps that status and reason.
            if isinstance(exc, KeyboardInterrupt) and stopped and workers.stopped_by() in (signal.SIGTERM,
                                                                                           signal.SIGHUP):
                exc = workers.stop_exception()  # a thread's KeyboardInterrupt ended a SIGTERM's stop first
            self._fail(exc)
        elif not self._finished:
            self.manifest.update(status="ok", exit_code=0, reason=None)
        if self.manifest.get("wall_s") is None:  # a command may record a narrower wall time itself
            self.manifest["wall_s"] = round(time.perf_counter() - self._t0, 6)
        self._write()
        return False

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, KeyboardInterrupt):
            code, reason = 130, "interrupted (Ctrl-C)"
        else:
            code = getattr(exc, "exit_code", 1)
            reason = f"tpudiag failed: {one_line(exc, 284, typed=False)}"
        self.manifest.update(status="failed", exit_code=code, reason=reason)

    def _forced(self, stop: BaseException) -> None:
        """A stop the main thread could not raise in time (`workers.FORCE_AFTER_S`): recorded here, from
        the stop watch thread, as the block's end would have recorded it."""
        self._fail(stop)
        self.manifest["wall_s"] = round(time.perf_counter() - self._t0, 6)
        self._write()

    def write_json(self, name: str, doc: dict) -> Path:
        write_json_atomic(self.path / name, doc)
        return self.path / name

    def write_text(self, name: str, text: str) -> Path:
        write_text_atomic(self.path / name, text)
        return self.path / name

    def _write(self) -> None:
        write_json_atomic(self.path / MANIFEST, self.manifest)
