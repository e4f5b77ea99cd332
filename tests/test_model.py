"""The result models: every golden document reads back into its model and writes out byte for byte,
and a bad document is a one-line ParseError naming the file and the field."""

from __future__ import annotations

import json

import pytest

from tests.conftest import GOLDENS, ROOT
from tpudiag.results.profile import ProfileReport
from tpudiag.errors import ParseError
from tpudiag.report.json_report import render_json

PROFILE_GOLDENS = sorted(p for p in GOLDENS.glob("*/*/report.json") if "compile" not in p.parent.name)


def test_there_are_profile_goldens_from_both_jax_versions():
    assert {p.parent.parent.name for p in PROFILE_GOLDENS} == {"jax-0.10", "jax-0.12"} and len(PROFILE_GOLDENS) == 8


@pytest.mark.parametrize("path", PROFILE_GOLDENS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_profile_report_round_trips(path):
    text = path.read_text()
    report = ProfileReport.from_dict(json.loads(text), str(path))
    assert render_json(report.to_dict()) == text
    # Typed all the way down: the figures a consumer reads are attributes, not keys.
    assert report.steps.count == len(report.steps.rows) and report.breakdown.total_s == report.wall_s
    assert all(isinstance(o.self_s, (int, float)) and o.name for o in report.ops)


def test_profile_report_with_a_tpu_estimate_round_trips(in_root):
    from tpudiag import api

    from tpudiag.analyze.profile.tpu_estimate import build_tpu_estimate

    report = api.load_report(ROOT / "fixtures" / "artifacts" / "mlp")
    compiled = api.load_report(ROOT / "fixtures" / "artifacts" / "compile_v5e_collective")
    est = report.with_tpu_estimate(build_tpu_estimate(report.timeline, report.steps.count, compiled), "tpu")
    doc = est.to_dict()
    assert doc["tpu_estimate"]["target"]["topology"] == "v5e:2x4" and doc["artifacts"]["tpu_compile"] == "tpu"
    assert "tpu_estimate" not in report.to_dict(), "a section only some runs have is left out, not null"
    again = ProfileReport.from_dict(json.loads(render_json(doc)))
    assert again.to_dict() == doc and again.tpu_estimate.step.count == report.steps.count


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.pop("steps"), "report.json: steps: missing"),
    (lambda d: d["steps"]["rows"][1].update(duration_s="slow"),
     "report.json: steps.rows[1].duration_s: expected a number, got 'slow'"),
    (lambda d: d["ops"][0].update(program_id=1.5), "report.json: ops[0].program_id: expected an integer, got 1.5"),
    (lambda d: d.update(warnings="none"), "report.json: warnings: expected a list, got 'none'"),
    (lambda d: d.update(schema="tpudiag.report/9"), "report.json: schema 'tpudiag.report/9': expected 'tpudiag.report/1'"),
])
def test_bad_documents_name_the_field(edit, message):
    doc = json.loads((GOLDENS / "jax-0.10" / "mlp" / "report.json").read_text())
    edit(doc)
    with pytest.raises(ParseError) as e:
        ProfileReport.from_dict(doc, "report.json")
    assert str(e.value) == message


def test_comparison_round_trips_and_reads_typed(in_root):
    from tpudiag import api
    from tpudiag.results.compare import Comparison

    result = api.compare_runs(ROOT / "fixtures/artifacts/sized_mlp_h1024", ROOT / "fixtures/artifacts/sized_mlp_h4096")
    doc = json.loads(render_json(result.to_dict()))
    assert Comparison.from_dict(doc, "compare.json") == result
    assert result.regression and result.headline.verdict == "regression" and result.regressions[0].decides_exit
    assert {r.status for r in result.ops} <= {"added", "removed", "changed", "unchanged"}
    assert all(r.module for r in result.ops) and all(r.module is None for r in result.modules)
    assert "module" not in doc["modules"][0], "module rows have no module key"


@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_kernel_bench_results_round_trip(chip):
    """The bench documents recorded in bench/results/ (every bundled kernel, with and without JAX's
    own), each one `tpudiag kernels bench --json` as printed."""
    from tpudiag.results.kernels import KernelBench

    path = ROOT / "bench" / "results" / f"kernels-bench-{chip}.json"
    doc = json.loads(path.read_text())
    bench = KernelBench.from_dict(doc, str(path))
    assert bench.to_dict() == doc
    with_jax = [k for k in bench.kernels if k.jax_name]
    assert with_jax and all(k.jax_cycles is not None for k in with_jax)
    assert all("ratio_vs_jax" not in k for k in doc["kernels"] if "jax_name" not in k)
    assert bench.worst_ratio_vs_xla == max(k["ratio_vs_xla"] for k in doc["kernels"])
    from tpudiag.kernels.registry import MODULES

    assert [k.name for k in bench.kernels] == list(MODULES)
    for k in bench.kernels:  # the goal's rule, on the recorded figures
        assert k.meets_xla_goal == (k.ratio_vs_xla <= k.goal_vs_xla or k.kernel_vs_floor <= k.goal_vs_floor)


MANIFESTS = sorted({*ROOT.glob("fixtures/artifacts*/*/manifest.json"), *ROOT.glob("fixtures/old-runs/*/manifest.json"),
                    *ROOT.glob("fixtures/artifacts*/*/shadow/manifest.json"),
                    *ROOT.glob("fixtures/artifacts*/suggest/*/manifest.json")})


def test_every_fixture_manifest_reads_typed():
    from tpudiag.capture.rundir import read_manifest

    kinds = set()
    for path in MANIFESTS:
        m = read_manifest(path.parent)
        doc = json.loads(path.read_text())
        assert (m.kind, m.status, m.exit_code, m.program) == (doc["kind"], doc["status"], doc["exit_code"],
                                                              doc.get("program")), path
        kinds.add(m.kind)
    assert {"profile", "compile"} <= kinds and len(MANIFESTS) >= 20


def test_a_bad_manifest_names_its_field(tmp_path):
    from tpudiag.capture.rundir import read_manifest

    doc = json.loads((ROOT / "fixtures/artifacts/mlp/manifest.json").read_text())
    doc["steps_entered"] = "three"
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ParseError, match=r"manifest\.json: steps_entered: expected an integer or null, got 'three'"):
        read_manifest(tmp_path)


@pytest.mark.parametrize("artifact_set", ["jax-0.10", "jax-0.12"])
def test_compile_report_round_trips(artifact_set):
    from tpudiag.results.compile import CompileReport, ModuleTotals

    path = GOLDENS / artifact_set / "compile_v5e_collective" / "report.json"
    text = path.read_text()
    report = CompileReport.from_dict(json.loads(text), str(path))
    assert render_json(report.to_dict()) == text
    assert report.totals.modules == len(report.modules) and not report.failed_modules
    assert all(isinstance(m.totals, ModuleTotals) and m.fusions is not None for m in report.modules)
    assert any(o.modelled and o.bound_by == "ici" for m in report.modules for o in m.ops), "the all-reduce"


def test_a_module_that_did_not_fit_keeps_only_its_memory_figures():
    from tpudiag.results.compile import CompileReport, MemoryOnlyTotals

    doc = json.loads((GOLDENS / "jax-0.10" / "compile_v5e_collective" / "report.json").read_text())
    m = doc["modules"][0]
    m.update(status="failed", error="RESOURCE_EXHAUSTED", ops=[], findings=["needs 40 GiB"],
             totals={"memory": {"peak_hbm_bytes": 40 << 30, "hbm_capacity_bytes": 16 << 30, "fits": False}})
    del m["fusions"]
    report = CompileReport.from_dict(doc, "report.json")
    assert isinstance(report.modules[0].totals, MemoryOnlyTotals) and report.failed_modules[0].name == m["name"]
    assert report.to_dict() == doc


def test_fusion_list_round_trips_and_reads_typed(in_root):
    from tpudiag import api
    from tpudiag.results.fusions import FusionList

    result = api.fusions_list(ROOT / "fixtures/artifacts/mlp", "train_step")
    doc = json.loads(render_json(result.to_dict()))
    assert FusionList.from_dict(doc, "fusions.json") == result
    (report,) = result.modules
    assert report.totals.breaks == len(report.breaks) and report.totals.fusions == len(report.fusions)
    assert report.time_source == "measured" and all(b.reason == b.reasons[0] for b in report.breaks if b.reasons)


def test_hlo_diff_round_trips_and_reads_typed(in_root):
    from tpudiag import api
    from tpudiag.results.hlo_diff import HloDiff

    a, b = (ROOT / f"fixtures/artifacts/sized_mlp_h{h}" for h in (1024, 4096))
    diff = api.hlo_diff(a, b, "train_step")
    doc = json.loads(render_json(diff.to_dict()))
    assert HloDiff.from_dict(doc, "diff.json") == diff
    assert diff.has_changes and diff.summary.changed == sum(p.status == "changed" for p in diff.pairs)
    assert diff.a.module == diff.b.module == "jit_train_step"
