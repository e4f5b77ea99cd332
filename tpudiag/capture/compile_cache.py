"""A cache of TPU compiles: a module compiled once for a target is not compiled again.

An entry is a module directory as `tpu_compile` leaves it (result.json, module.json, XLA's HLO
dump, the LLO dump, the static cycle profile, compile.log), stored under a key made of everything
that decides what the compiler writes: the module's bytes, its kind, the topology, whether the
static profile was asked for, the dump flags, and the versions of libtpu, jaxlib and jax. Only
complete compiles are stored (status ok, the static profile `ok` or `off`): a profile dropped on a
timeout is retried next time, perhaps with a longer limit. The random-number and init modules
every script has are then compiled once per machine, not once per run.

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

# Bump when what an entry holds, or how its key is made, changes.
FORMAT = "tpudiag-compile-cache/1"
# Files of a module directory that belong to one run only (paths of that run): never cached.
_RUN_ONLY = frozenset({"spec.json"})
_COMPLETE = frozenset({"ok", "off"})  # static-profile outcomes worth keeping


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

    def key(self, input_path: Path, kind: str, topology: str, static_profile: bool, flags: str) -> str:
        h = hashlib.sha256()
        meta = {"format": FORMAT, "kind": kind, "topology": topology, "static_profile": static_profile,
                "flags": flags, "libtpu": _version("libtpu"), "jaxlib": _version("jaxlib"), "jax": _version("jax")}
        h.update(json.dumps(meta, sort_keys=True).encode())
        with open(input_path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()[:32]

    def fetch(self, key: str, mdir: Path) -> bool:
        """Copy entry `key` into the module directory `mdir`; False when there is none."""
        entry = self.root / key
        if not (entry / "module.json").is_file():
            return False
        for item in entry.iterdir():
            target = mdir / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target)
        return True

    def store(self, key: str, mdir: Path, status: str, static_profile: str) -> bool:
        """Keep a complete compile (status ok; static profile ok or off). Never raises: a cache that
        cannot be written costs the next run a compile, nothing else."""
        if status != "ok" or static_profile not in _COMPLETE or (self.root / key).exists():
            return False
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
            os.rename(tmp, self.root / key)  # atomic; fails if another writer got there first
            return True
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True) if "tmp" in locals() else None
            return False
