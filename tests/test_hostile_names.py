"""Names a program chooses are shown as text, never read as markup or sent raw to the terminal.

Real runs in real subprocesses (`python -m tpudiag`): `fixtures/programs/hostile_names.py` jits
functions named `step[/bold]` (rich raised MarkupError on it: exit 70), `[bold red]X[/bold red]`
(rich drew it red) and `esc\\x1b[31mred` (a raw ESC reached the terminal, even with --no-color).
The same program copied to `exp[v2]/train[bold].py` gives source lines and paths that rich cut
to `train.py`. Each run is profiled, then re-rendered by `tpudiag report` as text, Markdown,
HTML and JSON, and through `fusions`, `compare` and `hlo-diff`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import PROGRAMS, ROOT

PROGRAM = PROGRAMS / "hostile_names.py"
NAMES = ("step[/bold]", "[bold red]X[/bold red]", "esc\x1b[31mred")
# How each name is shown: control characters as their escape, everything else as it is.
SHOWN = ("step[/bold]", "[bold red]X[/bold red]", "esc\\x1b[31mred")
ESC = "\x1b"


def _tpudiag(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, p.stderr
    assert ESC not in p.stdout and ESC not in p.stderr, "a raw ESC reached the terminal"
    return p.stdout


def _line_of(needle: str) -> int:
    """The 1-based line of the program that holds `needle` (the op's source line)."""
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`hostile_names.py` profiled once; its run directory and what `profile` printed."""
    out = tmp_path_factory.mktemp("hostile") / "run"
    printed = _ok(_tpudiag("profile", "--no-color", "--width", "160", "--out", str(out), str(PROGRAM)))
    return out, printed


@pytest.fixture(scope="module")
def bracketed(tmp_path_factory):
    """The same program as `exp[v2]/train[bold].py`, profiled into `exp[v2]/run[bold]` from their parent."""
    base = tmp_path_factory.mktemp("bracketed")
    (base / "exp[v2]").mkdir()
    shutil.copy(PROGRAM, base / "exp[v2]" / "train[bold].py")
    printed = _ok(_tpudiag("profile", "--no-color", "--width", "160", "--out", "exp[v2]/run[bold]",
                           "exp[v2]/train[bold].py", cwd=base))
    return base, printed


def test_profile_prints_the_function_names_as_text(run):
    _, printed = run
    for shown in SHOWN:
        assert shown in printed


def test_report_text_shows_names_literally_and_colour_is_off(run):
    out = _ok(_tpudiag("report", "--no-color", "--width", "160", str(run[0])))
    compile_rows = [line for line in out.splitlines() if "│" in line and any(s in line for s in SHOWN)]
    for shown in SHOWN:
        assert any(line.split("│")[0].strip() == shown for line in compile_rows), (shown, out)


def test_report_markdown_puts_names_in_code_spans(run):
    out = _ok(_tpudiag("report", "--md", str(run[0])))
    for shown in SHOWN:
        assert f"| `{shown}` |" in out
    assert "## tpudiag profile: `" in out


def test_report_html_escapes_names_and_control_characters(run, tmp_path):
    page = tmp_path / "report.html"
    printed = _ok(_tpudiag("report", "--no-color", "--html", str(page), str(run[0])))
    assert "step[/bold]" in printed
    text = page.read_text()
    assert ESC not in text and not any(ord(c) < 0x20 and c not in "\n" for c in text)
    for shown in SHOWN:
        assert f"<code>{shown}</code>" in text


def test_report_json_keeps_the_names_exactly(run):
    out = _ok(_tpudiag("report", "--json", str(run[0])))
    doc = json.loads(out)
    assert set(NAMES) <= {c["function"] for c in doc["compile"]}


def test_bracketed_source_paths_are_shown_whole(bracketed):
    base, printed = bracketed
    line = _line_of("return jnp.tanh")
    assert f"train[bold].py:{line}" in printed  # the terminal's short form (last path part)
    assert "exp[v2]/train[bold].py" in printed  # the program, in the header
    text = _ok(_tpudiag("report", "--no-color", "--width", "160", "exp[v2]/run[bold]", cwd=base))
    assert f"train[bold].py:{line}" in text and "exp[v2]/run[bold]" in text
    md = _ok(_tpudiag("report", "--md", "exp[v2]/run[bold]", cwd=base))
    # Outside code spans `[` and `]` are escaped, so GitHub shows them and opens no link.
    assert f"| exp\\[v2\\]/train\\[bold\\].py:{line} |" in md
    assert "## tpudiag profile: `exp[v2]/train[bold].py`" in md
    _ok(_tpudiag("report", "--no-color", "--html", "page.html", "exp[v2]/run[bold]", cwd=base))
    assert f"exp[v2]/train[bold].py:{line}" in (base / "page.html").read_text()


def test_bracketed_paths_in_fusions_compare_and_hlo_diff(bracketed):
    base, _ = bracketed
    run = "exp[v2]/run[bold]"
    fusions = _ok(_tpudiag("fusions", "--no-color", "--width", "200", "--module", "step__bold", run, cwd=base))
    assert "tpudiag fusions: jit_step__bold" in fusions and f"{run}/hlo/" in fusions
    assert f"train[bold].py:{_line_of('return jnp.tanh')}" in fusions
    compared = _ok(_tpudiag("compare", "--force", "--no-color", "--width", "200", run, run, cwd=base))
    assert f"base  {run}  exp[v2]/train[bold].py  (cpu" in compared
    compared_md = _ok(_tpudiag("compare", "--force", "--md", run, run, cwd=base))
    assert f"**Base:** `{run}  exp[v2]/train[bold].py  (cpu" in compared_md
    diff = _ok(_tpudiag("hlo-diff", "--module", "step__bold", run, run, cwd=base))
    assert f"A jit_step__bold ({run}/hlo/" in diff and "no change" in diff
