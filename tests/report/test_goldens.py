"""Golden outputs of `tpudiag report` on every fixture run: JSON, Markdown and terminal text.

The fixture artifacts are real captures (fixtures/artifacts/regenerate.py), so the reports are
deterministic. `pytest --update-goldens` rewrites them; review the diff.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.conftest import GOLDENS, RUNS, check_golden
from tpudiag.cli import cli


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("fmt,flags,suffix", [("json", ["--json"], "report.json"), ("md", ["--md"], "report.md"),
                                              ("text", ["--no-color", "--width", "120"], "report.txt")])
def test_report_golden(run, fmt, flags, suffix, in_root, update_goldens):
    result = CliRunner().invoke(cli, ["report", *flags, f"fixtures/artifacts/{run}"])
    assert result.exit_code == 0, result.output
    if fmt == "json":
        doc = json.loads(result.output)
        assert doc["schema"] == "tpudiag.report/1"
    check_golden(GOLDENS / run / suffix, result.output, update_goldens)


def test_failed_run_report_says_so(in_root):
    doc = json.loads(CliRunner().invoke(cli, ["report", "--json", "fixtures/artifacts/raises"]).output)
    assert doc["status"] == "failed" and doc["exit_code"] == 1
    assert "boom from the program" in doc["reason"]
    assert doc["ops"], "what ran before the failure is still reported"
