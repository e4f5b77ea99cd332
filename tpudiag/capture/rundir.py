"""The run directory: its layout, its manifest, and how to find what a capture left in it.

Reads and writes `manifest.json`; knows where the trace, the HLO and IR dumps and the
program's log live. It does not parse traces or HLO (that is `parse/`).

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
from pathlib import Path

from tpudiag.errors import InputError, ParseError

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
MANIFEST_SCHEMA = "tpudiag.manifest/1"


def default_run_dir(script: Path, root: Path = Path("tpudiag-runs"), now: _dt.datetime | None = None) -> Path:
    """`tpudiag-runs/<timestamp>-<script stem>`, with a numeric suffix if that name is taken."""
    now = now or _dt.datetime.now()
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", script.stem) or "program"
    base = root / f"{now:%Y%m%d-%H%M%S}-{stem}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


PROFILE_SUBDIRS = (TRACE_DIR, HLO_DIR, IR_DIR, CAPTURE_DIR)
COMPILE_SUBDIRS = ("modules",)


def create_run_dir(path: Path, subdirs: tuple[str, ...] = PROFILE_SUBDIRS) -> Path:
    """Create a fresh run directory. An existing non-empty directory is never reused (runs are never overwritten)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"{path}: already exists and is not empty; tpudiag never overwrites a run (choose another --out)")
    for sub in subdirs:
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


def read_manifest(run: Path) -> dict:
    path = run / MANIFEST
    if not path.is_file():
        raise InputError(f"{run}: not a tpudiag run directory (no {MANIFEST})")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ParseError(path, f"not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        raise ParseError(path, f"not a tpudiag manifest (expected schema {MANIFEST_SCHEMA!r})")
    return doc


def find_xplanes(trace_root: Path) -> list[Path]:
    """All `*.xplane.pb` under a trace directory, newest session last (xprof's layout)."""
    return sorted(trace_root.glob("plugins/profile/*/*.xplane.pb"))


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()
