"""The static half of the integrity criterion: a solution's source, read with `ast`, may not import
or use the task's reference (its file, its function, the names in the task's `forbidden`), call back
to the host, read files or import code by a computed name. Returns the findings as lines; runs
nothing of the solution."""

from __future__ import annotations

import ast
from pathlib import Path

# Names whose use lets a solution compute off the device or fetch an answer: host callbacks (the
# reference could run there), file and pickle reads (a stored answer), dynamic imports and exec (a
# way round every other rule here).
BANNED = ("jax.pure_callback", "jax.experimental.io_callback", "jax.experimental.host_callback",
          "jax.debug.callback", "open", "io.open", "builtins.open", "eval", "exec", "compile", "__import__",
          "importlib", "pickle", "numpy.load", "numpy.fromfile", "numpy.loadtxt", "numpy.memmap", "subprocess",
          "os.system", "ctypes", "sys.modules", "tpudiag.challenge")
BANNED_ATTRS = ("read_text", "read_bytes", "pure_callback", "io_callback", "host_callback")


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = ("." * node.level) + (node.module or "")
            for a in node.names:
                names[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
    return names


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = names.get(node.id, node.id)
    return ".".join([head, *reversed(parts)])


def _hits(name: str, banned: tuple[str, ...]) -> str | None:
    for b in banned:
        if name == b or name.startswith(b + "."):
            return b
    return None


def check_source(path: Path, *, reference_file: Path, reference_function: str, forbidden=()) -> list[str]:
    """What in the solution at `path` breaks the rules, one line each (empty: nothing)."""
    try:
        source = Path(path).read_text()
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, ValueError) as e:
        return [f"cannot read the source: {e}"]
    names = _imports(tree)
    ref_module = Path(reference_file).stem
    local = _assigned(tree) - set(names)
    found = []

    def flag(line: int, what: str) -> None:
        text = f"line {line}: {what}"
        if text not in found:
            found.append(text)

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            for m in mods:
                last = m.split(".")[-1] if m else ""
                if last == ref_module or _hits(m, tuple(forbidden)):
                    flag(line, f"imports the reference ({m})")
                elif _hits(m, BANNED):
                    flag(line, f"imports {m}, which is not allowed")
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = _dotted(node, names)
            if name is None:
                if isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
                    flag(line, f"uses .{node.attr}")
                continue
            head = name.split(".")[0]
            imported = _head(node) in names
            if imported and (head == ref_module or _hits(name, tuple(forbidden))):
                flag(line, f"uses the reference ({name})")
            elif (imported or _head(node) not in local) and _hits(name, BANNED):
                flag(line, f"uses {name}, which is not allowed")
            elif isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
                flag(line, f"uses .{node.attr}")
    if reference_function and f"{ref_module}.{reference_function}" in source:
        flag(0, f"names the reference {ref_module}.{reference_function}")
    return found


def _head(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _assigned(tree: ast.AST) -> set[str]:
    """Names the module binds itself (a parameter or a local called `compile` is not the builtin)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
    return out
