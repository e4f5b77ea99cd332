"""Finds the computations to compile for a TPU: from a JAX IR dump, a .mlir file or an HLO text file.

Returns `ModuleInput`s (name, path, kind); one per distinct computation (a jitted function that
ran several times with the same shapes is dumped once per compile, and identical dumps are
compiled once). It reads file names and bytes only; it does not parse the IR.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tpudiag.capture.tpu_compile import ModuleInput
from tpudiag.errors import InputError

# JAX_DUMP_IR_TO names: jax_ir0003_jit_train_step_compile.mlir
_IR_NAME = re.compile(r"^jax_ir(\d+)_(.+?)(?:_compile)?\.mlir$")
_HLO_SUFFIXES = (".hlo", ".txt", ".hlo.txt")


def _name_of(path: Path) -> str:
    m = _IR_NAME.match(path.name)
    if m:
        return m.group(2)
    name = path.name
    for suffix in (".mlir", ".hlo.txt", ".hlo", ".txt"):
        if name.endswith(suffix):
            return name[: -len(suffix)] or "module"
    return path.stem


# MLIR bytecode starts with these bytes; MLIR text has a top-level `module` (after `#loc` aliases
# and comments). Checked before a run directory exists, as HLO text is, so garbage is exit 2 either way.
_MLIR_BYTECODE = b"ML\xefR"
_MLIR_MODULE = re.compile(r"^\s*module\b", re.M)


def _kind_of(path: Path) -> str:
    if path.name.endswith(".mlir") or path.name.endswith(".mlirbc"):
        with open(path, "rb") as f:
            head = f.read(1 << 16)
        if not head.startswith(_MLIR_BYTECODE) and not _MLIR_MODULE.search(head.decode("utf-8", "replace")):
            raise InputError(f"{path}: not a StableHLO module (neither MLIR bytecode nor text with a top-level "
                             "`module`)")
        return "mlir"
    if path.name.endswith(_HLO_SUFFIXES):
        head = path.read_text(errors="replace")[:4096]
        if "HloModule" not in head:
            raise InputError(f"{path}: not an HLO text module (no `HloModule` header) and not a .mlir file")
        return "hlo"
    raise InputError(f"{path}: unsupported input (give a .py script, a .mlir file or JAX IR dump directory, "
                     "or an HLO text file)")


def ir_dump_modules(ir_dir: Path) -> list[ModuleInput]:
    """Every distinct computation in a JAX_DUMP_IR_TO directory, in the order JAX compiled them."""
    files = sorted(ir_dir.glob("*.mlir"), key=lambda p: (int(_IR_NAME.match(p.name).group(1))
                                                           if _IR_NAME.match(p.name) else 1 << 30, p.name))
    seen: set[str] = set()
    out = []
    for p in files:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        out.append(ModuleInput(name=_name_of(p), path=p, kind="mlir"))
    return out


def file_inputs(path: Path) -> list[ModuleInput]:
    """A .mlir / HLO text file, or a directory of .mlir files (a JAX IR dump)."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir():
        found = ir_dump_modules(path)
        if not found:
            raise InputError(f"{path}: no .mlir files in this directory (expected a JAX_DUMP_IR_TO dump)")
        return found
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")
    return [ModuleInput(name=_name_of(path), path=path, kind=_kind_of(path))]
