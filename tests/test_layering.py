"""Keeps the arrows of STYLE.md honest: analyze/ does no I/O and imports neither click nor rich;
report/ computes nothing (no numpy/pandas, no analyze/parse); only cli.py calls sys.exit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tpudiag"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def _calls(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                out.add(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Name):
                out.add(f.id)
    return out


@pytest.mark.parametrize("path", sorted((PKG / "analyze").glob("*.py")), ids=lambda p: p.name)
def test_analyze_is_pure(path):
    imports = _imports(path)
    assert not {m for m in imports if m.split(".")[0] in {"click", "rich", "subprocess", "os", "shutil"}}
    assert not {"open", "Path.read_text"} & _calls(path)


@pytest.mark.parametrize("path", sorted((PKG / "report").glob("*.py")), ids=lambda p: p.name)
def test_report_computes_nothing(path):
    bad = {m for m in _imports(path) if m.split(".")[0] in {"numpy", "pandas"}
           or m.startswith(("tpudiag.analyze", "tpudiag.parse", "tpudiag.capture"))}
    assert not bad


def test_only_cli_exits():
    for path in PKG.rglob("*.py"):
        if path.name in ("cli.py", "child.py"):  # child.py *is* the profiled program's exit
            continue
        assert "sys.exit" not in _calls(path), path
