"""`tpudiag kernels list/show/verify/bench` through the command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET

from click.testing import CliRunner

from tpudiag.cli import cli, main
from tpudiag.kernels.registry import MODULES, all_specs

ISSUE_KERNELS = {"flash_attention", "paged_attention", "rmsnorm", "cross_entropy", "rope", "sampling",
                 "int8_matmul", "grouped_matmul", "w8a8_matmul", "int4_matmul", "mla_decode", "ragged_paged_attention",
                 "fused_moe"}


def _run(*args):
    return CliRunner().invoke(cli, list(args))


def test_list_has_every_kernel_the_issue_names():
    res = _run("kernels", "list", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    names = {k["name"] for k in doc["kernels"]}
    assert doc["schema"] == "tpudiag.kernels/1" and ISSUE_KERNELS <= names
    for k in doc["kernels"]:
        assert k["replaces"] and k["signature"] and k["tuned_for"] and k["usage"] and k["tolerances"]
        assert all(t["reason"] for t in k["tolerances"].values())
    text = _run("kernels", "list", "--no-color", "--width", "160").output
    assert all(n in text for n in ISSUE_KERNELS)


def test_every_kernel_module_and_spec_is_listed_once():
    assert len(MODULES) == len(set(MODULES))
    names = [s.name for s in all_specs()]
    assert len(names) == len(set(names))


def test_show_prints_the_card():
    res = _run("kernels", "show", "rmsnorm", "--no-color", "--width", "140")
    assert res.exit_code == 0
    for word in ("replaces:", "signature:", "tuned for:", "usage:", "tolerances:"):
        assert word in res.output


def test_the_chip_figure_of_a_kernel_is_cut_not_rounded_up():
    """The stored chip row of ragged paged attention (668.3 µs floor over 816.0 µs: 81.9%) reads 81%,
    as 79.9% reads 79% and not the 80% goal."""
    from tpudiag.kernels.measured import raw_table

    chip = raw_table("v5e")["ragged_paged_attention"]
    pct = 100 * chip["floor_us"] / chip["kernel"]["min_us"]
    res = _run("kernels", "show", "ragged_paged_attention", "--no-color", "--width", "400")
    assert res.exit_code == 0, res.output
    assert f"{math.floor(pct)}% of its" in res.output
    assert round(pct) == math.floor(pct) or f"{round(pct)}% of its" not in res.output


def test_an_unknown_kernel_is_a_one_line_error(capsys):
    try:
        main(["kernels", "show", "softmaxx"])
    except SystemExit as e:
        assert e.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no bundled kernel named 'softmaxx'" in err and "rmsnorm" in err


def test_verify_json_and_junit(tmp_path):
    junit = tmp_path / "verify.xml"
    res = _run("kernels", "verify", "rmsnorm", "--seed", "7", "--json", "--junit", str(junit))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["ok"] and doc["seed"] == 7 and {c["kernel"] for c in doc["cases"]} == {"rmsnorm"}
    root = ET.parse(junit).getroot()
    assert int(root.get("tests")) == len(doc["cases"]) and root.get("failures") == "0"


def test_bench_rejects_a_bad_target_before_any_work(tmp_path, capsys):
    try:
        main(["kernels", "bench", "rmsnorm", "--target", "v9", "--out", str(tmp_path / "run")])
    except SystemExit as e:
        assert e.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "valid targets" in err
    assert not (tmp_path / "run").exists()


def test_bench_end_to_end_in_a_subprocess(tmp_path):
    """The real command at the production shape, without the (slow) static profile."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "kernels", "bench", "rmsnorm", "--target", "v5e",
                           "--no-static-profile", "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    (row,) = doc["kernels"]
    assert row["name"] == "rmsnorm" and row["kernel_cycles"] > 0 and row["xla_cycles"] > 0
    assert doc["static_profile"] is False and (out / "report.json").is_file()
    md = subprocess.run([sys.executable, "-m", "tpudiag", "kernels", "bench", "rmsnorm", "--target", "v5e",
                         "--no-static-profile", "--md", "--out", str(tmp_path / "run2")],
                        capture_output=True, text=True, timeout=600)
    assert md.returncode == 0 and "| rmsnorm |" in md.stdout


def test_verify_exits_1_and_names_the_failure_when_a_kernel_is_wrong(monkeypatch, capsys, tmp_path):
    """A real kernel made 2% wrong (registered under its own name) must fail verify through the CLI."""
    import dataclasses

    import jax.numpy as jnp

    from tpudiag.kernels import registry, rmsnorm

    def wrong(*args, **kw):
        normed, resid = rmsnorm.SPEC.kernel(*args, **kw)
        return normed * jnp.asarray(1.02, normed.dtype), resid

    bad = dataclasses.replace(rmsnorm.SPEC, kernel=wrong, cases=lambda: rmsnorm.SPEC.cases()[:1])
    monkeypatch.setattr(registry, "get_spec", lambda name: bad)
    junit = tmp_path / "v.xml"
    try:
        main(["kernels", "verify", "rmsnorm", "--seed", "1", "--no-color", "--junit", str(junit)])
    except SystemExit as e:
        assert e.code == 1
    out, err = capsys.readouterr()
    assert "FAIL rmsnorm" in out and "kernel vs reference" in out
    assert err.strip().count("\n") == 0 and "1 of 1 case(s) failed (seed 1)" in err
    assert ET.parse(junit).getroot().get("failures") == "1"


def test_verify_on_chip_without_a_tpu_is_one_line(capsys):
    from tests.conftest import run_main

    rc, out, err = run_main(["kernels", "verify", "--on-chip", "rmsnorm"], capsys)
    assert (rc, out) == (2, "")
    assert err == ("tpudiag: error: kernels verify --on-chip: no TPU is attached to this machine (jax's devices are "
                   "not TPUs; another program holding the chip shows the same)\n")
