"""The renderer registry (tpudiag/report/registry.py): which formats each result kind has, the errors
for a missing one, JSON exactly as report.json holds it, and no renderer module (nor rich) imported
before a format other than JSON is asked for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import GOLDENS
from tpudiag.cli.common import emit
from tpudiag.errors import UsageError
from tpudiag.report import registry
from tpudiag.results.profile import ProfileReport

# Every kind a command prints or a run directory holds, and its formats. A new format for a result
# is one `@renders(kind, fmt)`; this table is where a test notices it.
EXPECTED = {
    "tpudiag.report": ("terminal", "md", "json", "html"),
    "tpudiag.compile": ("terminal", "md", "json", "html"),
    "tpudiag.distributed": ("terminal", "md", "json", "html"),
    "tpudiag.fusions": ("terminal", "md", "json"),
    "tpudiag.fusions_list": ("terminal", "md", "json"),
    "tpudiag.hlo_diff": ("terminal", "md", "json", "html"),
    "tpudiag.compare": ("terminal", "md", "json"),
    "tpudiag.suggest": ("terminal", "md", "json"),
    "tpudiag.estimate": ("terminal", "md", "json"),
    "tpudiag.validate": ("terminal", "md", "json", "junit"),
    "tpudiag.kernels": ("terminal", "json"),
    "tpudiag.kernels-verify": ("terminal", "json", "junit"),
    "tpudiag.kernels-bench": ("terminal", "md", "json"),
    "tpudiag.kernels-tune": ("terminal", "md", "json"),
    "tpudiag.plan": ("terminal", "md", "json"),
    "tpudiag.targets": ("terminal", "json"),
    "tpudiag.calibration": ("terminal", "md", "json"),
    "tpudiag.challenge": ("terminal", "md", "json"),
    "tpudiag.challenge-tasks": ("terminal", "md", "json"),
    "tpudiag.challenge-task": ("terminal", "md", "json"),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_kind_has_its_formats(kind):
    assert registry.formats({"schema": f"{kind}/1"}) == EXPECTED[kind]


def test_the_registry_knows_no_other_kind():
    registry.formats({"schema": "tpudiag.report/1"})  # loads every renderer module
    assert {kind for kind, _ in registry._TABLE} == set(EXPECTED)


def test_a_missing_format_and_an_unknown_kind_are_usage_errors():
    with pytest.raises(UsageError, match=r"^tpudiag.kernels-verify/1 has no Markdown form$"):
        registry.renderer({"schema": "tpudiag.kernels-verify/1"}, "md")
    with pytest.raises(UsageError, match=r"^tpudiag.compare/1 has no JUnit form$"):
        registry.renderer({"schema": "tpudiag.compare/1"}, "junit")
    with pytest.raises(UsageError, match=r"^no renderer for schema 'tpudiag.nothing/1'$"):
        registry.renderer({"schema": "tpudiag.nothing/1"}, "md")
    # JSON is every document's, known kind or not.
    assert registry.render({"schema": "tpudiag.nothing/1", "b": 1, "a": [2]}, "json") == \
        '{\n  "a": [\n    2\n  ],\n  "b": 1,\n  "schema": "tpudiag.nothing/1"\n}\n'


def test_a_kind_gets_one_renderer_per_format():
    registry.formats({"schema": "tpudiag.report/1"})
    with pytest.raises(ValueError, match="two md renderers for tpudiag.report"):
        registry.renders("tpudiag.report", "md")(lambda result: "")
    with pytest.raises(ValueError, match="unknown format 'pdf'"):
        registry.renders("tpudiag.report", "pdf")


def test_a_new_format_is_one_registration(capsys):
    """Registered once, a renderer is what `emit` prints for that kind and format."""
    fn = registry.renders("tpudiag.test-only", "md")(lambda result, top=1: f"{result['schema']} top {top}\n")
    try:
        emit({"schema": "tpudiag.test-only/1"}, "md", top=3)
        assert capsys.readouterr().out == "tpudiag.test-only/1 top 3\n"
        assert registry.renderer({"schema": "tpudiag.test-only/7"}, "md") is fn
    finally:
        del registry._TABLE["tpudiag.test-only", "md"]


@pytest.mark.parametrize("artifact_set", sorted(p.name for p in GOLDENS.iterdir()))
def test_json_is_the_report_json_bytes(artifact_set):
    """The JSON renderer of a model gives back its saved document byte for byte (keys sorted,
    two-space indent, a final newline)."""
    text = (GOLDENS / artifact_set / "mlp" / "report.json").read_text()
    report = ProfileReport.from_dict(json.loads(text))
    assert registry.render(report, "json") == text
    assert registry.render(json.loads(text), "json") == text


def test_json_and_the_registry_import_no_renderer_module():
    """`tpudiag --help` and `--json` pay for no rich: renderer modules load at the first other format."""
    probe = ("import sys\n"
             "from tpudiag.report.registry import render\n"
             "render({'schema': 'tpudiag.report/1'}, 'json')\n"
             "loaded = sorted(m for m in sys.modules if m == 'rich' or m.startswith(('rich.', 'tpudiag.report.')))\n"
             "assert loaded == ['tpudiag.report.json_report', 'tpudiag.report.registry'], loaded\n")
    subprocess.run([sys.executable, "-c", probe], check=True)
