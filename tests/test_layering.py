"""Keeps the arrows of STYLE.md and docs/architecture.md honest, in every sub-package: analyze/ does
no I/O, imports neither click nor rich, and neither captures nor renders; each analyze/ workflow
imports only the shared `analyze/hlo/` besides itself; results/ holds models only; report/ computes
nothing (no numpy/pandas, no analyze/parse/capture, no config); kernels/ drives no capture; no
private name crosses a package; no two modules of tpudiag/ import each other in a circle (imports
inside functions included); only `cli.main` calls sys.exit; no file passes 600 lines; analyze/ keeps
at most a dozen entries at its top level."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tpudiag"


def _rel(path: Path) -> str:
    return str(path.relative_to(PKG))


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


@pytest.mark.parametrize("path", sorted((PKG / "analyze").rglob("*.py")), ids=_rel)
def test_analyze_is_pure(path):
    imports = _imports(path)
    assert not {m for m in imports if m.split(".")[0] in {"click", "rich", "subprocess", "os", "shutil"}}
    assert not {"open", "Path.read_text"} & _calls(path)


@pytest.mark.parametrize("path", sorted((PKG / "report").rglob("*.py")), ids=_rel)
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


@pytest.mark.parametrize("path", sorted((PKG / "kernels").rglob("*.py")), ids=_rel)
def test_kernels_build_kernels_and_drive_no_capture(path):
    """kernels/ holds kernels, references and bench setups, on jax alone: verifying them is parity/'s
    (parity/kernel_cases.py), timing them on a chip capture/'s (capture/chip_bench.py)."""
    allowed = ("tpudiag.kernels", "tpudiag.errors", "tpudiag.targets")
    assert not {m for m in _tpudiag_imports(path) if not m.startswith(allowed)}


@pytest.mark.parametrize("path", sorted((PKG / "parity").rglob("*.py")), ids=_rel)
def test_parity_runs_functions_and_neither_captures_nor_renders(path):
    assert not {m for m in _tpudiag_imports(path) if m.startswith(("tpudiag.capture", "tpudiag.report",
                                                                    "tpudiag.api", "tpudiag.cli"))}


@pytest.mark.parametrize("path", sorted((PKG / "report").rglob("*.py")), ids=_rel)
def test_report_reads_no_configuration(path):
    """Renderers format what the models hold; thresholds and heuristics (config.py) are analyze/'s."""
    assert "tpudiag.config" not in _tpudiag_imports(path)


@pytest.mark.parametrize("path", sorted((PKG / "analyze").rglob("*.py")), ids=_rel)
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


@pytest.mark.parametrize("path", sorted([*(PKG / "capture").rglob("*.py"), *(PKG / "parse").rglob("*.py")]),
                         ids=lambda p: str(p.relative_to(PKG)))
def test_capture_and_parse_reach_no_further_down_the_flow(path):
    """capture/ runs and records, parse/ reads: neither analyzes, renders, nor calls back into api/cli."""
    assert not {m for m in _tpudiag_imports(path) if m.startswith(("tpudiag.analyze", "tpudiag.report",
                                                                    "tpudiag.api", "tpudiag.cli"))}


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _edges(path: Path) -> set[str]:
    """The tpudiag modules a file imports, anywhere in it: `from tpudiag.a import b` is an edge to
    `tpudiag.a.b` where that is a module, else to `tpudiag.a`."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tpudiag":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in _MODULES else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "tpudiag"}
    return {m for m in out if m in _MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_circles():
    graph = {m: _edges(p) for m, p in _MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


_SHARED_ANALYSIS = "tpudiag.analyze.hlo"


@pytest.mark.parametrize("path", sorted((PKG / "analyze").rglob("*.py")), ids=_rel)
def test_each_analyze_workflow_imports_only_the_shared_hlo_package(path):
    """analyze/<workflow>/ may use analyze/hlo/ and itself; the workflows meet in api/, not here."""
    mine = _module(path).split(".")[:3]
    for m in _tpudiag_imports(path):
        if m.startswith("tpudiag.analyze."):
            theirs = m.split(".")[:3]
            assert theirs == mine or ".".join(theirs) == _SHARED_ANALYSIS, (m, "imported by", _module(path))


@pytest.mark.parametrize("path", sorted((PKG / "results").rglob("*.py")), ids=_rel)
def test_results_hold_models_only(path):
    """Document models import the Model base, each other and small pure helpers; nothing that reads,
    runs, analyzes or renders."""
    allowed = ("tpudiag.model", "tpudiag.results", "tpudiag.text")
    assert not {m for m in _tpudiag_imports(path) if not m.startswith(allowed)}
    assert not {m for m in _imports(path) if m.split(".")[0] in {"jax", "numpy", "click", "rich", "subprocess", "os"}}


def test_analyze_has_at_most_a_dozen_entries_at_its_top_level():
    entries = [p for p in (PKG / "analyze").iterdir()
               if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()]
    assert len(entries) <= 12, sorted(p.name for p in entries)
