"""Finds the computations to compile for a TPU: from a JAX IR dump, a .mlir file or an HLO text file.

Returns `ModuleInput`s (name, path, kind); one per distinct computation (a jitted function that
ran several times with the same shapes is dumped once per compile, and identical dumps are
compiled once). A file the user names (`file_inputs`) is parsed here, in this process, by the
parsers the compile worker uses (MLIR's for StableHLO, XLA's for HLO text), so that a module they
reject is a one-line error before any run directory exists; the modules a shadow run dumped
(`ir_dump_modules`) are jax's own and are not parsed twice. Nothing here compiles.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tpudiag.capture.tpu_compile import ModuleInput
from tpudiag.errors import InputError, one_line
from tpudiag.text import printable

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


# `loc("-":3:10)`: where the MLIR parser stopped (line 0 in bytecode, which has no lines).
_MLIR_LOC = re.compile(r':(\d+):(\d+)\)$')
# `was parsing 5:19: error: expects opcode but sees: addd, error: Unknown opcode: addd`
_HLO_ERROR = re.compile(r"was parsing (\d+):(\d+): error: ([^\n]*)")


def _where(path: Path, line: str | None, col: str | None) -> str:
    return f"{path}:{line}:{col}" if line and line != "0" else str(path)


def check_parses(inp: ModuleInput) -> None:
    """`inp` is read by the parser the TPU compile worker uses (`tpu_worker._load_module_text`), or
    an `InputError` names the file, the line and column, and the parser's first message."""
    if inp.kind == "hlo":
        from jaxlib import _hlo

        try:
            _hlo.hlo_module_from_text(inp.path.read_text(errors="replace"))
        except Exception as e:  # XLA's parser raises a bare RuntimeError (XlaRuntimeError) with its status
            m = _HLO_ERROR.search(str(e))
            problem = m.group(3).replace(", error: ", "; ") if m else one_line(e, typed=False)
            raise InputError(f"{_where(inp.path, *(m.groups()[:2] if m else (None, None)))}: not a valid HLO "
                             f"module: {printable(problem)} (XLA's HLO parser)") from None
        return
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context():
        try:
            ir.Module.parse(inp.path.read_bytes())
        except ir.MLIRError as e:
            diags = list(e.error_diagnostics)
            first = diags[0] if diags else None
            m = _MLIR_LOC.search(str(first.location)) if first else None
            problem = first.message if first else one_line(e, typed=False)
            raise InputError(f"{_where(inp.path, *(m.groups() if m else (None, None)))}: not a valid StableHLO "
                             f"module: {printable(problem)} (MLIR parser)") from None


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
    """A .mlir / HLO text file, or a directory of .mlir files (a JAX IR dump), each checked by its
    parser (`check_parses`)."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir():
        found = ir_dump_modules(path)
        if not found:
            raise InputError(f"{path}: no .mlir files in this directory (expected a JAX_DUMP_IR_TO dump)")
    elif path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")
    else:
        found = [ModuleInput(name=_name_of(path), path=path, kind=_kind_of(path))]
    for inp in found:
        check_parses(inp)
    return found
