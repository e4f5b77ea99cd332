"""`tpudiag fusions` and `tpudiag hlo-diff` through the CLI, on real fixture HLO and runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACTS, ROOT
from tpudiag.cli import cli, main

BEFORE = ARTIFACTS / "mlp" / "hlo" / "module_0006.jit_train_step.before_optimizations.txt"
AFTER = ARTIFACTS / "mlp" / "hlo" / "module_0006.jit_train_step.cpu_after_optimizations.txt"


def run_main(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_fusions_of_a_compile_run_carry_estimated_times():
    out = CliRunner().invoke(cli, ["fusions", "--json", "--module", "jit_step",
                                   str(ARTIFACTS / "compile_v5e_collective")]).output
    (doc,) = json.loads(out)["modules"]
    assert doc["schema"] == "tpudiag.fusions/1" and doc["time_source"] == "estimated"
    assert doc["fusions"] and all(f["time_s"] is not None for f in doc["fusions"])
    assert any(b["reason"] == "collective boundary" for b in doc["breaks"])


def test_fusions_of_a_profile_run_carry_measured_times():
    out = CliRunner().invoke(cli, ["fusions", "--json", "--module", "train_step", str(ARTIFACTS / "mlp")]).output
    (doc,) = json.loads(out)["modules"]
    assert doc["time_source"] == "measured"
    assert sum(f["time_s"] or 0 for f in doc["fusions"]) > 0


def test_fusions_markdown_and_terminal():
    md = CliRunner().invoke(cli, ["fusions", "--md", str(AFTER)]).output
    assert "jit_train_step" in md and "|" in md
    text = CliRunner().invoke(cli, ["fusions", "--no-color", "--width", "120", str(AFTER)]).output
    assert "Fusion breaks" in text


def test_fusions_unknown_module_lists_the_modules(capsys):
    rc, _, err = run_main(["fusions", "--module", "nope", str(ARTIFACTS / "mlp")], capsys)
    assert rc == 2 and "jit_train_step" in err and len(err.strip().splitlines()) == 1


def test_self_diff_is_no_change_and_passes_the_gate(capsys):
    rc, out, _ = run_main(["hlo-diff", "--fail-on-change", "--module", "train_step", str(ARTIFACTS / "mlp"),
                           str(ARTIFACTS / "mlp")], capsys)
    assert rc == 0 and "no change" in out


def test_before_and_after_optimization_moves_ops_into_fusions(tmp_path, capsys):
    html = tmp_path / "diff.html"
    rc, out, err = run_main(["hlo-diff", "--json", "--fail-on-change", "--html", str(html), str(BEFORE), str(AFTER)],
                            capsys)
    assert rc == 1 and "HLO changed" in err
    doc = json.loads(out)
    assert doc["summary"]["moved"] > 0 and doc["summary"]["moved_into_fusions"] > 0
    assert doc["a"]["fusions"] == 0 and doc["b"]["fusions"] > 0
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()


def test_diff_needs_a_module_when_a_side_has_several(capsys):
    rc, _, err = run_main(["hlo-diff", str(ARTIFACTS / "mlp"), str(ARTIFACTS / "mlp")], capsys)
    assert rc == 2 and "pick one with --module" in err


@pytest.mark.parametrize("content,needle", [("", "empty file"), ("HloModule m\n\nENTRY %main () -> f32[] {\n", "not closed")])
def test_bad_hlo_is_one_line(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.hlo"
    bad.write_text(content)
    rc, _, err = run_main(["hlo-diff", str(bad), str(AFTER)], capsys)
    assert rc == 3 and needle in err and "bad.hlo" in err and len(err.strip().splitlines()) == 1


def test_hlo_diff_as_a_real_subprocess():
    p = subprocess.run([sys.executable, "-m", "tpudiag", "hlo-diff", "--md", str(BEFORE), str(AFTER)], cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("#")


def test_modules_are_picked_by_number_name_or_function(capsys):
    """`--module INDEX` names a compile run's module by its directory number, `--function` by its
    jitted function, on fusions, hlo-diff and suggest alike; a pick of nothing lists the modules."""
    run = str(ARTIFACTS / "compile_v5e_collective")
    by = {}
    for opts in (["--module", "8"], ["--function", "step"], ["--module", "jit_step"]):
        code, out, _ = run_main(["fusions", "--json", *opts, run], capsys)
        assert code == 0
        by[tuple(opts)] = [m["module"]["name"] for m in json.loads(out)["modules"]]
    assert set(map(tuple, by.values())) == {("jit_step",)}
    code, out, _ = run_main(["fusions", "--json", "--module", "0", "--module", "4", run], capsys)
    assert code == 0 and [m["module"]["name"] for m in json.loads(out)["modules"]] == ["jit_stage", "jit__normal"]
    code, _, err = run_main(["hlo-diff", run, run], capsys)
    assert code == 2 and "pick one with --module NAME|INDEX or --function NAME" in err
    assert "00 jit_stage, 01 jit__threefry_seed" in err and "08 jit_step" in err
    code, _, err = run_main(["hlo-diff", "--function", "stepp", run, run], capsys)
    assert code == 2 and "no module for function 'stepp'" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run_main(["hlo-diff", "--json", "--module", "8", run, run], capsys)
    assert code == 0 and json.loads(out)["summary"]["changed"] == 0
    code, out, _ = run_main(["suggest", "--json", "--no-static-profile", "--module", "8", run], capsys)
    assert code == 0, out
    assert {s["module"] for s in json.loads(out)["suggestions"]} <= {"jit_step"}
