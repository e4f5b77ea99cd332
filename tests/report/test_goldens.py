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


def test_terminal_renders_a_report_of_a_run_that_could_not_be_analyzed():
    """A failed program whose artifacts could not be read still renders (the artifacts table is partial)."""
    import io

    from rich.console import Console

    from tpudiag.api import _empty_trace
    from tpudiag.analyze.profile_report import build_profile_report
    from tpudiag.config import DEFAULT_CONFIG
    from tpudiag.parse import frames
    from tpudiag.report.terminal import render_terminal

    doc = build_profile_report(_empty_trace("x"), {}, frames.empty_frame(frames.COMPILES), 0,
                               {"status": "failed", "reason": "killed by SIGKILL", "exit_code": 137},
                               {"run_dir": "RUN"}, DEFAULT_CONFIG, ["analysis failed: x"]).to_dict()
    out = io.StringIO()
    render_terminal(doc, Console(file=out, width=100, no_color=True))
    assert "killed by SIGKILL" in out.getvalue() and "RUN" in out.getvalue()
