"""The executed HLO work of a profile run (analyze/profile/work.py) and `compare`'s default on CPU
runs: figures that do not depend on the machine's speed. Real runs of real programs, one of them
with the machine loaded, one with an extra sort pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ARTIFACT_SETS, ROOT, profile_sized_mlp
from tpudiag import api
from tpudiag.analyze.compare.runs import compare_reports, default_metric
from tpudiag.analyze.profile.work import REFERENCE_CHIP
from tpudiag.analyze.hlo.cost import module_costs
from tpudiag.errors import UsageError
from tpudiag.parse.hlo import find_memory_reports, read_allocated_bytes
from tpudiag.targets import CHIPS

ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


@pytest.mark.parametrize("version", sorted(ARTIFACT_SETS))
def test_work_is_the_step_ops_costed_from_the_hlo_the_run_executed(version):
    run = ARTIFACT_SETS[version] / "mlp_steps8_a"
    report = api.load_report(run)
    w = report.work
    assert w.per == "step" and w.steps == 8 == report.steps.count
    assert w.setup_modules == ("jit_make_inputs",), "the input draw runs on into step 0; it is not step work"
    assert w.uncosted_ops == 0 and {o.module for o in w.ops} == {"jit_train_step"}
    # Every step runs the same ops once: whole executions per step, and the sums are the section's.
    assert all(o.executions == 1 for o in w.ops) and w.op_executions == len(w.ops)
    assert w.flops == sum(o.flops for o in w.ops) and w.bytes_accessed == sum(o.bytes_accessed for o in w.ops)
    assert w.roofline_s == pytest.approx(sum(o.roofline_s for o in w.ops), rel=1e-12)
    # Each op's figures are hlo_cost's for its instruction in the run's own optimized HLO.
    modules = api.hlo_modules(run / "hlo")
    pid = next(p for p, m in modules.items() if m.name == "jit_train_step")
    costs = module_costs(modules[pid])
    chip = CHIPS[REFERENCE_CHIP]
    for o in w.ops:
        c = costs[o.name]
        assert (o.flops, o.bytes_accessed) == (c.flops, c.bytes_accessed)
        assert o.roofline_s == pytest.approx(max(c.flops / chip.peak_bf16_flops_per_s,
                                                 c.bytes_accessed / chip.hbm_bytes_per_s), rel=1e-12)
    row = next(r for r in report.ops if r.module == "jit_train_step")
    assert (row.flops, row.bytes_accessed) == (costs[row.name].flops, costs[row.name].bytes_accessed)
    assert w.peak_allocation_bytes == read_allocated_bytes(find_memory_reports(run / "hlo")[pid])
    assert json.loads(json.dumps(report.to_dict()))["work"]["flops"] == w.flops


def test_two_runs_of_one_program_have_the_same_work_and_cpu_runs_gate_on_it():
    a, b = (api.load_report(ARTIFACT_SETS["jax-0.10"] / n) for n in ("mlp_steps8_a", "mlp_steps8_b"))
    assert a.work.to_dict() == b.work.to_dict()
    assert a.steps.median_s != b.steps.median_s, "the measured steps did differ"
    metric, why = default_metric(a, b)
    assert metric == "work" and why.startswith("CPU runs: measured time moves with the machine's load")
    c = compare_reports(a, b, None, 0.05)
    assert c.metric == "work" and c.metric_reason == why and c.headline.basis == "roofline_work_per_step"
    assert c.headline.verdict == "unchanged" and not c.regression
    assert [f.name for f in c.figures] == ["flops", "bytes_accessed", "op_executions", "peak_allocation_bytes"]
    assert all(f.delta == 0 and not f.flagged for f in c.figures)
    assert compare_reports(a, b, "device_time", 0.05).metric_reason == "asked for"


def test_four_times_the_width_is_a_work_regression_figure_by_figure():
    runs = ARTIFACT_SETS["jax-0.10"]
    c = compare_reports(api.load_report(runs / "sized_mlp_h1024"), api.load_report(runs / "sized_mlp_h4096"), None,
                        0.05)
    assert c.metric == "work" and c.regression and c.headline.delta_pct > 200
    flagged = {f.name for f in c.figures if f.flagged}
    assert flagged == {"flops", "bytes_accessed", "peak_allocation_bytes"}, "the op count did not grow"
    assert [r.kind for r in c.regressions][:1] == ["headline"] and "figure" in {r.kind for r in c.regressions}


def test_a_report_without_work_falls_back_to_measured_time_and_says_so():
    """A report.json written before tpudiag recorded the work (read as written, not re-analyzed)."""
    new = api.load_report(ARTIFACT_SETS["jax-0.10"] / "mlp_steps8_a")
    bare = type(new).from_dict({k: v for k, v in new.to_dict().items() if k != "work"}, "bare")
    assert bare.work is None
    metric, why = default_metric(new, bare)
    assert metric == "device_time" and "no executed-work figures" in why
    with pytest.raises(UsageError, match="bare: no executed-work figures"):
        compare_reports(new, bare, "work", 0.05, cur_path="bare")


def _gate(a, b, *opts):
    return subprocess.run([sys.executable, "-m", "tpudiag", "compare", "--max-regression", "5%", *opts, str(a), str(b)],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_default_gate_passes_a_loaded_rerun_and_fails_an_extra_sort_pass(tmp_path):
    base = profile_sized_mlp(tmp_path / "base")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the machine loaded during one run
    try:
        loaded = profile_sized_mlp(tmp_path / "loaded")
    finally:
        busy.kill()
        busy.wait()
    assert loaded["work"] == base["work"]
    same = _gate(tmp_path / "base", tmp_path / "loaded")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "metric work" in same.stdout and "no regression (unchanged)" in same.stdout
    profile_sized_mlp(tmp_path / "sorted", "--sort")
    worse = _gate(tmp_path / "base", tmp_path / "sorted", "--json")
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert worse.stderr.startswith("tpudiag: REGRESSION: roofline work per step")
    added = {r["name"] for r in json.loads(worse.stdout)["ops"] if r["status"] == "added" and r["flagged"]}
    assert any(name.startswith("sort") for name in added), added


def test_cli_work_metric_is_offered_and_refused_for_compile_runs(capsys):
    from tpudiag.cli import main

    runs = ARTIFACT_SETS["jax-0.10"]
    for args, code in (([str(runs / "mlp_steps8_a"), str(runs / "mlp_steps8_b")], 0),
                       ([str(runs / "compile_v5e_collective"), str(runs / "compile_v5e_collective")], 2)):
        with pytest.raises(SystemExit) as e:
            main(["compare", "--force", "--metric", "work", "--json", *args])
        out, err = capsys.readouterr()
        assert e.value.code == code, err
        if code == 0:
            assert json.loads(out)["metric_reason"] == "asked for"
        else:
            assert err.count("\n") == 1 and "work needs a profile run; this is a compile run" in err
