"""The terminal reports at a fixed width and piped (report/fit.py, cli.common.console): tables fit
100 columns by leaving columns out with a legend, never by clipping a figure; a name or a path is
never split across lines; piped output is plain text at its natural width. Real fixture runs
through the real command line; the layout rules on their own with names longer than any fixture's."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from rich.console import Console

from tests.conftest import ARTIFACTS, ROOT
from tpudiag.cli import cli
from tpudiag.report.fit import Col, say, table

_TABLE_GLYPHS = re.compile("[┃│━╇]")
# A figure as the renderers print it: a time, a size, a share, a count, a bandwidth, or "-".
_FIGURE = re.compile(r"-|[\d.,]+( ?(ns|us|ms|s|%|B|KiB|MiB|GiB|[kMGT]?B/s))?( x\d+)?")


def _report(*args) -> str:
    result = CliRunner().invoke(cli, ["report", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _rows(text: str, header: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and the rows of the table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split("┃")[0].strip() == header and "┃" in ln)
    rows = []
    for ln in lines[start + 2:]:
        if "│" not in ln:
            break
        rows.append([c.strip() for c in ln.split("│")])
    return [c.strip() for c in lines[start].split("┃")], rows


@pytest.mark.parametrize("run", ["decoder", "compile_v5e_collective", "compile_v5e_fsdp_async", "dp_train_2p",
                                 "ep_moe_4p", "tp_mlp_4p"])
def test_every_table_fits_100_columns(run, in_root):
    out = _report("--no-color", "--width", "100", f"fixtures/artifacts/{run}")
    wide = [ln for ln in out.splitlines() if _TABLE_GLYPHS.search(ln) and len(ln) > 100]
    assert wide == []
    assert "…" not in "".join(ln for ln in out.splitlines() if _TABLE_GLYPHS.search(ln)), "nothing was cut"


def test_the_distributed_report_leaves_columns_out_and_says_so(in_root):
    """At 100 columns it clipped its last columns (`ove`, `96.0`); now every figure is whole, a
    column with one value in every row goes into the legend and a left-out column is named."""
    out = _report("--no-color", "--width", "100", "fixtures/artifacts/ep_moe_4p")
    header, rows = _rows(out, "proc")
    assert header[-1] == "overlap" and len(rows) == 4
    assert all(_FIGURE.fullmatch(c) for r in rows for c in r[1:]), rows
    assert "in every row: host vm" in out
    header, rows = _rows(out, "step")
    assert header[-4:] == ["p0 waited", "p1 waited", "p2 waited", "p3 waited"]
    assert all(_FIGURE.fullmatch(c) for r in rows for c in r[-4:]), rows
    assert "left out to fit 100 columns: communication (a wider --width, or --json, has them)" in out


def test_compile_op_names_are_whole_at_100_columns(in_root):
    """`multiply_dynamic-update-slice_fusion` was folded over three lines."""
    out = _report("--no-color", "--width", "100", "fixtures/artifacts/compile_v5e_collective")
    name = "multiply_dynamic-update-slice_fusion"
    (line,) = [ln for ln in out.splitlines() if name in ln]
    assert line.startswith(f" {name} │ 855 ns │")
    assert "left out to fit 100 columns: busiest slots, cycles" in out


def test_piped_output_is_plain_and_at_its_natural_width():
    """stdout a pipe, no --width: no colour, no line wrapped at 80, the trace path whole."""
    p = subprocess.run([sys.executable, "-m", "tpudiag", "report", "fixtures/artifacts/decoder"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout
    lines = p.stdout.splitlines()
    trace = next((ARTIFACTS / "decoder" / "trace").rglob("*.xplane.pb")).relative_to(ROOT)
    assert f"  trace          {trace}" in lines
    assert ("jit_train_step: 75 fusions; 134 fusion breaks round-trip 50.3 MiB (50.3 MiB in default memory), "
            "13 with no inferable reason") in lines
    # Every table as the 120-column golden has it: nothing was fitted to a terminal.
    golden = (ROOT / "tests/goldens/jax-0.10/decoder/report.txt").read_text().splitlines()
    assert [ln for ln in lines if "│" in ln] == [ln for ln in golden if "│" in ln]


def test_piped_distributed_and_compile_reports_leave_nothing_out(in_root):
    for run in ("ep_moe_4p", "compile_v5e_fsdp_async"):
        out = _report(f"fixtures/artifacts/{run}")  # CliRunner: stdout is not a terminal
        assert "left out to fit" not in out and "in every row" not in out


def _render(width: int, fn) -> list[str]:
    console = Console(file=io.StringIO(), width=width, no_color=True)
    fn(console)
    return console.file.getvalue().splitlines()


LONG_OP = "multiply_dynamic-update-slice_bitcast_reduce_window_convert_transpose_fusion.12"  # 80 characters
LONG_PATH = "/data/experiments/2026-11-30/very_long_run_name_from_a_sweep/trace/plugins/profile/host.xplane.pb"


@pytest.mark.parametrize("width", [60, 100, 160])
def test_a_long_name_is_never_split_and_a_figure_never_cut(width):
    cols = [Col("op", "name", "left", most=96), Col("time"), Col("bytes"), Col("limit", "text", "left"),
            Col("source", justify="left", drop=1)]
    rows = [[LONG_OP, "12.34 ms", "1.0 MiB", "ICI, 3.58 KB/device (model)", "model.py:80"],
            ["add.4", "0 ns", "12 B", "HBM, 12 B", "model.py:81"]]
    lines = _render(width, lambda c: table(c, cols, rows, title="Top ops"))
    body = [ln for ln in lines if "│" in ln]
    first = [ln for ln in body if "12.34 ms" in ln]
    assert len(first) == 1 and "1.0 MiB" in first[0]
    shown = first[0].split("│")[0].strip()
    assert shown == LONG_OP or (shown.endswith("…") and LONG_OP.startswith(shown[:-1]))
    continuation = [ln.split("│")[0].strip() for ln in body if "ms" not in ln and "add.4" not in ln]
    assert all(c == "" for c in continuation), "no piece of the name on a line of its own"
    assert all(len(ln) <= width for ln in lines if _TABLE_GLYPHS.search(ln))
    # The source column is left out before the name is cut; the name is cut only where it must be.
    assert (shown == LONG_OP) == (width == 160)
    assert any(ln.startswith(f"left out to fit {width} columns: source") for ln in lines) == (width < 160)


def test_prose_wraps_at_spaces_and_a_path_keeps_a_line_of_its_own():
    lines = _render(60, lambda c: say(c, f"  trace          {LONG_PATH} (open with xprof)"))
    assert LONG_PATH in lines
    assert all(len(ln) <= 60 for ln in lines if ln != LONG_PATH)
    assert " ".join(ln.strip() for ln in lines) == f"trace {LONG_PATH} (open with xprof)"
