"""A cache of TPU compiles: a module compiled once for a target is not compiled again.

An entry is a module directory as `tpu_compile` leaves it (result.json, module.json, XLA's HLO
dump, the LLO dump, the static cycle profile, the kernels' tables, compile.log), stored under a key
made of everything that decides what the compiler writes: the module's bytes, its kind, the
topology, whether the static profile was asked for, the dump flags, and the versions of libtpu,
jaxlib and jax. Compiles that succeeded are stored. One whose static profile was dropped is stored
with the limits it was dropped under and reused only under the same or smaller limits: retrying it
could only end the same way, while a longer `--timeout` compiles it again (and a complete result
then replaces the entry). The random-number and init modules every script has are compiled once per
machine, not once per run.
The CPU run that collects a script's computations keeps JAX's own CPU compile cache in `jax-cpu/`.

Where: `$TPUDIAG_CACHE_DIR`, else `$XDG_CACHE_HOME/tpudiag/compile`, else
`~/.cache/tpudiag/compile`; `TPUDIAG_NO_CACHE=1` turns it off (the CLI's `--cache-dir` and
`--no-cache` set these). Entries are written to a temporary folder and renamed into place, so a
reader never sees half an entry and two writers of one key do not collide. It parses nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import tempfile
from pathlib import Path

from tpudiag.capture import rundir

# Bump when what an entry holds, or how its key is made, changes.
FORMAT = "tpudiag-compile-cache/2"  # /2: module directories hold kernel_tables.json
# Files of a module directory that belong to one run only (paths of that run): never cached.
_RUN_ONLY = frozenset({"spec.json"})
_COMPLETE = frozenset({"ok", "off"})  # static-profile outcomes that no limit changes
_LIMITS = "limits.json"  # in an entry whose static profile was dropped: the limits it was dropped under


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


class CompileCache:
    def __init__(self, root: Path):
        self.root = Path(root)

    @classmethod
    def from_env(cls) -> CompileCache | None:
        """The cache the environment asks for, or None when it is turned off."""
        if os.environ.get("TPUDIAG_NO_CACHE") == "1":
            return None
        if os.environ.get("TPUDIAG_CACHE_DIR"):
            return cls(Path(os.environ["TPUDIAG_CACHE_DIR"]))
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cls(base / "tpudiag" / "compile")

    def jax_cpu_env(self, env: dict) -> dict:
        """`env` with JAX's own persistent compilation cache turned on under `<root>/jax-cpu`, for the CPU
        run of a script that `tpudiag compile` makes to collect its computations: a second compile of
        the same script skips XLA's CPU compiles too. A cache the user set up is left alone."""
        if env.get("JAX_COMPILATION_CACHE_DIR"):
            return env
        return {**env, "JAX_COMPILATION_CACHE_DIR": str(self.root / "jax-cpu"),
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}

    def key(self, input_path: Path, kind: str, topology: str, static_profile: bool, flags: str) -> str:
        h = hashlib.sha256()
        meta = {"format": FORMAT, "kind": kind, "topology": topology, "static_profile": static_profile,
                "flags": flags, "libtpu": _version("libtpu"), "jaxlib": _version("jaxlib"), "jax": _version("jax")}
        h.update(json.dumps(meta, sort_keys=True).encode())
        with open(input_path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()[:32]

    def fetch(self, key: str, mdir: Path, static_timeout_s: float = 0.0, memory_bytes: int = 0) -> bool:
        """Copy entry `key` into the module directory `mdir`; False when there is none, or when its
        static profile was dropped under limits smaller than these (a retry might finish)."""
        entry = self.root / key
        if not (entry / rundir.MODULE_JSON).is_file():
            return False
        if (entry / _LIMITS).is_file():
            was = json.loads((entry / _LIMITS).read_text())
            if static_timeout_s > was.get("static_timeout_s", 0) or memory_bytes > was.get("memory_bytes", 0):
                return False
        for item in entry.iterdir():
            if item.name == _LIMITS:
                continue
            target = mdir / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target)
        return True

    def store(self, key: str, mdir: Path, status: str, static_profile: str, static_timeout_s: float = 0.0,
              memory_bytes: int = 0) -> bool:
        """Keep a compile that succeeded: complete, or with its static profile dropped under these
        limits. A complete one replaces a dropped one. Never raises: a cache that cannot be written
        costs the next run a compile, nothing else."""
        complete = static_profile in _COMPLETE
        entry = self.root / key
        if status != "ok" or (entry.exists() and (not complete or not (entry / _LIMITS).is_file())):
            return False
        tmp = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
            for item in mdir.iterdir():
                if item.name in _RUN_ONLY:
                    continue
                if item.is_dir():
                    shutil.copytree(item, tmp / item.name)
                else:
                    shutil.copy2(item, tmp / item.name)
            if not complete:
                (tmp / _LIMITS).write_text(json.dumps({"static_timeout_s": static_timeout_s,
                                                       "memory_bytes": memory_bytes}))
            if entry.exists():  # a complete compile replaces the dropped one
                old = Path(tempfile.mkdtemp(prefix=f".{key}-old-", dir=self.root))
                os.rename(entry, old / "entry")
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, entry)  # atomic; fails if another writer got there first
            return True
        except OSError:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            return False
