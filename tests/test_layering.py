"""Keeps the arrows of STYLE.md and docs/architecture.md honest: analyze/ does no I/O, imports neither
click nor rich, and neither captures nor renders; report/ computes nothing (no numpy/pandas, no
analyze/parse/capture, no config); kernels/ drives no capture; no private name crosses a package;
only `cli.main` calls sys.exit; no file passes 600 lines."""

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
        if path == PKG / "cli" / "__init__.py" or path.name == "child.py":  # main(); child.py *is* the program's exit
            continue
        assert "sys.exit" not in _calls(path), path


def _tpudiag_imports(path: Path) -> set[str]:
    """Modules of tpudiag a file imports, at module level or inside functions."""
    return {m for m in _imports(path) if m == "tpudiag" or m.startswith("tpudiag.")}


@pytest.mark.parametrize("path", sorted((PKG / "kernels").glob("*.py")), ids=lambda p: p.name)
def test_kernels_build_kernels_and_drive_no_capture(path):
    """kernels/ holds kernels, references and bench setups; compiling and benching them is api/."""
    assert not {m for m in _tpudiag_imports(path) if m.startswith(("tpudiag.capture", "tpudiag.api"))}


@pytest.mark.parametrize("path", sorted((PKG / "parity").glob("*.py")), ids=lambda p: p.name)
def test_parity_runs_functions_and_neither_captures_nor_renders(path):
    assert not {m for m in _tpudiag_imports(path) if m.startswith(("tpudiag.capture", "tpudiag.report",
                                                                    "tpudiag.api", "tpudiag.cli"))}


@pytest.mark.parametrize("path", sorted((PKG / "report").glob("*.py")), ids=lambda p: p.name)
def test_report_reads_no_configuration(path):
    """Renderers format what the models hold; thresholds and heuristics (config.py) are analyze/'s."""
    assert "tpudiag.config" not in _tpudiag_imports(path)


@pytest.mark.parametrize("path", sorted((PKG / "analyze").glob("*.py")), ids=lambda p: p.name)
def test_analyze_neither_captures_nor_renders(path):
    assert not {m for m in _tpudiag_imports(path) if m.startswith(("tpudiag.capture", "tpudiag.report",
                                                                    "tpudiag.api", "tpudiag.cli"))}


def _package(module: str) -> str:
    """tpudiag.report.markdown -> tpudiag.report; tpudiag.cli -> tpudiag.cli (a top-level module)."""
    parts = module.split(".")
    return ".".join(parts[:2])


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_no_private_name_crosses_a_package(path):
    """`from tpudiag.x.y import _z` only inside package x: a private name is not another package's API."""
    here = _package("tpudiag." + ".".join(path.relative_to(PKG).with_suffix("").parts))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpudiag"):
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            assert not private or _package(node.module) == here, (node.module, private)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and isinstance(node.value, ast.Name) and node.value.id == "api":
            raise AssertionError(f"api.{node.attr}: a private name of tpudiag.api")


# Kernel modules are long by nature (kernel, reference, wrapper, backward); each still stays near 600.
_LINE_LIMIT, _KERNEL_LINE_LIMIT = 600, 620


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_files_stay_short(path):
    limit = _KERNEL_LINE_LIMIT if path.parent.name == "kernels" else _LINE_LIMIT
    assert len(path.read_text().splitlines()) <= limit, f"{path.relative_to(PKG)}: split it"


@pytest.mark.parametrize("path", sorted([*(PKG / "capture").glob("*.py"), *(PKG / "parse").glob("*.py")]),
                         ids=lambda p: str(p.relative_to(PKG)))
def test_capture_and_parse_reach_no_further_down_the_flow(path):
    """capture/ runs and records, parse/ reads: neither analyzes, renders, nor calls back into api/cli."""
    assert not {m for m in _tpudiag_imports(path) if m.startswith(("tpudiag.analyze", "tpudiag.report",
                                                                    "tpudiag.api", "tpudiag.cli"))}
