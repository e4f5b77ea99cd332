"""Golden outputs of `tpudiag report` on every fixture run: JSON, Markdown and terminal text.

The fixture artifacts are real captures (fixtures/artifacts/regenerate.py), so the reports are
deterministic. `pytest --update-goldens` rewrites them; review the diff.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACT_SETS, GOLDENS, SET_RUNS, check_golden
from tpudiag.cli import cli


@pytest.mark.parametrize("artifact_set,run", SET_RUNS)
@pytest.mark.parametrize("fmt,flags,suffix", [("json", ["--json"], "report.json"), ("md", ["--md"], "report.md"),
                                              ("text", ["--no-color", "--width", "120"], "report.txt")])
def test_report_golden(artifact_set, run, fmt, flags, suffix, in_root, update_goldens):
    """Each artifact set has its own goldens (the compilers' outputs differ); the fields are the same."""
    result = CliRunner().invoke(cli, ["report", *flags, str((ARTIFACT_SETS[artifact_set] / run).relative_to(in_root))])
    assert result.exit_code == 0, result.output
    if fmt == "json":
        doc = json.loads(result.output)
        assert doc["schema"] == "tpudiag.report/1"
    check_golden(GOLDENS / artifact_set / run / suffix, result.output, update_goldens)


@pytest.mark.parametrize("run", ["mlp", "decoder", "collective", "raises", "compile_v5e_collective"])
def test_both_jax_versions_give_the_same_report_fields(run, in_root):
    """One model for both ends of the jax range: every key path of one set's report exists in the
    other's, for profile and compile runs alike."""
    def paths(doc, prefix=""):
        if isinstance(doc, dict):
            return {p for k, v in doc.items() for p in {f"{prefix}/{k}"} | paths(v, f"{prefix}/{k}")}
        if isinstance(doc, list):
            return {p for item in doc for p in paths(item, prefix + "[]")}
        return set()

    docs = [json.loads(CliRunner().invoke(cli, ["report", "--json", str(root / run)]).output)
            for root in ARTIFACT_SETS.values()]
    assert paths(docs[0]) == paths(docs[1])
    assert docs[0]["schema"] == docs[1]["schema"]


def test_failed_run_report_says_so(in_root):
    doc = json.loads(CliRunner().invoke(cli, ["report", "--json", "fixtures/artifacts/raises"]).output)
    assert doc["status"] == "failed" and doc["exit_code"] == 1
    assert "boom from the program" in doc["reason"]
    assert doc["ops"], "what ran before the failure is still reported"


def test_terminal_renders_a_report_of_a_run_that_could_not_be_analyzed():
    """A failed program whose artifacts could not be read still renders (the artifacts table is partial)."""
    import io

    from rich.console import Console

    from tpudiag.api import empty_trace as _empty_trace
    from tpudiag.analyze.profile.report import build_profile_report
    from tpudiag.results.manifest import Manifest
    from tpudiag.parse import frames
    from tpudiag.report.terminal import render_terminal

    report = build_profile_report(_empty_trace(), {}, frames.empty_frame(frames.COMPILES), 0,
                                  Manifest(schema="tpudiag.manifest/1", kind="profile", status="failed",
                                           reason="killed by SIGKILL", exit_code=137),
                                  {"run_dir": "RUN"}, ["analysis failed: x"])
    out = io.StringIO()
    render_terminal(report, Console(file=out, width=100, no_color=True))
    assert "killed by SIGKILL" in out.getvalue() and "RUN" in out.getvalue()


def test_80_column_terminal_keeps_source_lines(in_root):
    """An 80-column terminal: names may be cut, the file:line of each top op may not, and a path
    longer than a line is on a line of its own, whole (copyable), the only line past 80 columns."""
    import re

    out = CliRunner().invoke(cli, ["report", "--no-color", "--width", "80", "fixtures/artifacts/decoder"]).output
    op_rows = [ln for ln in out.splitlines() if ln.count("│") == 5]  # op, category, count, self, share, source
    assert len(op_rows) == 15
    sources = [ln.rsplit("│", 1)[1].strip() for ln in op_rows]
    assert all(s == "" or re.fullmatch(r"[\w.-]+\.py:\d+", s) for s in sources), sources
    assert sum(bool(s) for s in sources) >= 10
    trace = "fixtures/artifacts/decoder/trace/plugins/profile/2026_11_30_05_29_31/vm.xplane.pb"
    assert [ln for ln in out.splitlines() if len(ln) > 80] == [trace]
