"""`tpudiag compare`: compare_reports on real fixture runs, its renderers, and the CLI gate.

Fixtures (fixtures/artifacts/regenerate.py): mlp_steps8_a and mlp_steps8_b are two separate runs
of `mlp.py --steps 8` (no regression); sized_mlp_h1024 and sized_mlp_h4096 are one program at two
hidden widths (a real regression); compile_v5e_collective is a compile run. No capture runs here.
"""

from __future__ import annotations

import copy
import json
import re
import statistics
from functools import lru_cache

import pytest
from click.testing import CliRunner
from rich.console import Console

from tests.conftest import ARTIFACTS
from tpudiag import api
from tpudiag.analyze.compare.runs import SCHEMA, default_metric, parse_max_regression
from tpudiag.analyze.compare.runs import compare_reports as _compare_reports
from tpudiag.results.compare import Comparison
from tpudiag.cli import cli, main
from tpudiag.errors import InputError, ParseError, UsageError
from tpudiag.report.compare_render import render_compare_markdown, render_compare_terminal, render_compare_verdict
from tpudiag.report.json_report import render_json


load_for_compare = api.load_for_compare


def compare_reports(*args, **kwargs) -> dict:
    """The comparison as its document: the tests read the JSON every consumer sees."""
    return _compare_reports(*args, **kwargs).to_dict()


@lru_cache(maxsize=None)
def _loaded(name: str) -> str:
    return json.dumps(load_for_compare(ARTIFACTS / name).to_dict())


def doc(name: str) -> dict:
    """A fresh copy of a fixture run's report (analyzed once per session)."""
    return json.loads(_loaded(name))


def comparison(base: str, cur: str, metric="device_time", max_regression=0.05, force=False) -> Comparison:
    """Two fixture runs compared, as the model the renderers take (measured time unless asked:
    test_work.py has the machine-independent default)."""
    return _compare_reports(doc(base), doc(cur), metric, max_regression, force,
                            base_path=f"fixtures/artifacts/{base}", cur_path=f"fixtures/artifacts/{cur}")


def compare(base: str, cur: str, metric="device_time", max_regression=0.05, force=False) -> dict:
    return comparison(base, cur, metric, max_regression, force).to_dict()


def _steps(name: str) -> list[float]:
    return [r["duration_s"] for r in doc(name)["steps"]["rows"]]


# -- no regression ---------------------------------------------------------------------------------


def test_two_runs_of_one_program_are_not_a_regression_though_the_median_moved_past_the_threshold():
    d = compare("mlp_steps8_a", "mlp_steps8_b")
    h = d["headline"]
    assert d["schema"] == SCHEMA and d["metric"] == "device_time" and d["unit"] == "s"
    assert h["basis"] == "median_step"
    assert h["base"] == pytest.approx(statistics.median(_steps("mlp_steps8_a")), abs=1e-12)
    assert h["cur"] == pytest.approx(statistics.median(_steps("mlp_steps8_b")), abs=1e-12)
    # The medians of these two captures differ by more than 5%, but less than the runs' own spread:
    # the noise band is what keeps this from failing CI (fixture figures; regenerate -> recheck).
    assert h["delta_pct"] > 5 and 0 < h["delta"] < h["spread"]
    assert h["verdict"] == "within_noise" and h["regression"] is False and d["regression"] is False
    assert d["regressions"] == [] and not any(r["flagged"] for r in d["modules"] + d["ops"])
    assert d["differences"] == [] and d["forced"] is False and d["warnings"] == []


def test_spread_is_the_robust_sigma_of_each_run_summed():
    d = compare("mlp_steps8_a", "mlp_steps8_b")
    for side in ("base", "cur"):
        steps = _steps(f"mlp_steps8_{'a' if side == 'base' else 'b'}")
        med = statistics.median(steps)
        sigma = 1.4826 * statistics.median(abs(s - med) for s in steps)
        assert d["headline"][f"{side}_spread"] == pytest.approx(sigma, abs=1e-12)
        # The first step holds the XLA compile; a p90 band would be swallowed by it, the MAD is not.
        assert steps[0] > 10 * med and sigma < med
    h = d["headline"]
    assert h["spread"] == pytest.approx(h["base_spread"] + h["cur_spread"], abs=1e-12)


def test_a_run_against_itself_is_unchanged_row_by_row():
    d = compare("mlp_steps8_a", "mlp_steps8_a")
    assert d["headline"]["delta"] == 0 and d["headline"]["verdict"] == "unchanged" and not d["regression"]
    assert d["ops"] and all(r["status"] == "unchanged" and r["delta"] == 0 for r in d["ops"] + d["modules"])
    assert len(d["ops"]) == len({(o["module"], o["name"]) for o in doc("mlp_steps8_a")["ops"]})


def test_rows_are_matched_by_module_and_name_and_carry_each_sides_self_time():
    d = compare("mlp_steps8_a", "mlp_steps8_b")
    sums, counts = {}, {}
    for side, name in (("base", "mlp_steps8_a"), ("cur", "mlp_steps8_b")):
        for o in doc(name)["ops"]:
            key = (o["module"], o["name"], side)
            sums[key] = sums.get(key, 0) + o["self_s"]
            counts[key] = counts.get(key, 0) + o["occurrences"]
    for r in d["ops"]:
        assert r["base"] == pytest.approx(sums.get((r["module"], r["name"], "base"), 0), abs=1e-9)
        assert r["cur"] == pytest.approx(sums.get((r["module"], r["name"], "cur"), 0), abs=1e-9)
        assert r["occurrences_base"] == counts.get((r["module"], r["name"], "base"))
        assert r["occurrences_cur"] == counts.get((r["module"], r["name"], "cur"))
    assert {r["occurrences_base"] for r in d["ops"] if r["module"] == "jit_train_step"} == {8}  # once a step
    deltas = [abs(r["delta"]) for r in d["ops"]]
    assert deltas == sorted(deltas, reverse=True)
    module_sum = sum(r["base"] for r in d["ops"] if r["module"] == "jit_train_step")
    assert next(r for r in d["modules"] if r["name"] == "jit_train_step")["base"] == pytest.approx(module_sum)


# -- a real regression -----------------------------------------------------------------------------


def test_four_times_the_hidden_width_is_a_regression():
    d = compare("sized_mlp_h1024", "sized_mlp_h4096")
    h = d["headline"]
    assert h["basis"] == "median_step" and h["delta"] > h["spread"] > 0 and h["delta_pct"] > 5
    assert h["verdict"] == "regression" and d["regression"] is True
    assert d["regressions"][0] == {"kind": "headline", "name": "median_step", "base": h["base"], "cur": h["cur"],
                                   "delta": h["delta"], "delta_pct": h["delta_pct"], "decides_exit": True}
    # Only the headline decides; device_time rows carry no noise band, so none is flagged.
    assert [r["kind"] for r in d["regressions"]] == ["headline"]
    train = next(r for r in d["modules"] if r["name"] == "jit_train_step")
    assert train["delta"] > 0 and train["status"] == "changed"


def test_the_same_pair_reversed_is_an_improvement_and_a_loose_threshold_passes():
    d = compare("sized_mlp_h4096", "sized_mlp_h1024")
    assert d["headline"]["verdict"] == "improvement" and not d["regression"] and d["regressions"] == []
    loose = compare("sized_mlp_h1024", "sized_mlp_h4096", max_regression=5.0)  # 500%
    assert loose["headline"]["verdict"] == "within_threshold" and not loose["regression"]
    assert loose["max_regression_pct"] == 500


def test_fewer_than_three_steps_compares_total_op_time_without_a_noise_estimate():
    d = compare("decoder", "decoder")  # captured with --steps 2
    h = d["headline"]
    assert h["basis"] == "total_op_time" and h["spread"] is None
    assert h["base"] == pytest.approx(doc("decoder")["totals"]["op_self_s"])
    assert any("fewer than 3" in w for w in d["warnings"])


def test_different_step_counts_warn_that_rows_are_run_totals():
    d = compare("mlp", "mlp_steps8_a")  # 3 steps vs 8
    assert d["headline"]["basis"] == "median_step"
    assert any("3 steps and cur 8" in w for w in d["warnings"])


# -- refusals --------------------------------------------------------------------------------------


def test_different_programs_are_refused_naming_both_files_and_the_difference():
    with pytest.raises(UsageError) as e:
        compare("mlp_steps8_a", "sized_mlp_h1024")
    msg = str(e.value)
    assert "fixtures/artifacts/mlp_steps8_a" in msg and "fixtures/artifacts/sized_mlp_h1024" in msg
    assert "program mlp.py vs sized_mlp.py" in msg and "--force" in msg and "\n" not in msg


def test_force_compares_different_programs_with_a_warning():
    d = compare("mlp_steps8_a", "sized_mlp_h1024", force=True)
    assert d["forced"] and d["differences"] == ["program mlp.py vs sized_mlp.py"]
    assert d["warnings"][0] == "compared despite: program mlp.py vs sized_mlp.py"
    assert d["headline"]["basis"] == "median_step"


def test_a_profile_and_a_compile_run_are_refused_and_forcing_needs_a_metric_both_have():
    with pytest.raises(UsageError, match="a profile run vs a compile run; program mlp.py vs collective.py"):
        compare("mlp_steps8_a", "compile_v5e_collective")
    with pytest.raises(UsageError, match="compile_v5e_collective: device_time needs a profile run"):
        compare("mlp_steps8_a", "compile_v5e_collective", force=True)


def test_different_targets_are_refused():
    # The target field of the real compile report, changed: stands for the same program compiled for
    # another topology (the identity check reads only this field).
    other = doc("compile_v5e_collective")
    other["target"] = copy.deepcopy(other["target"]) | {"topology": "v5e:2x2", "chips": 4}
    with pytest.raises(UsageError, match=r"^refusing to compare base with cur: target v5e:2x4 vs v5e:2x2 "):
        compare_reports(doc("compile_v5e_collective"), other, "tpu_time", 0.05, base_path="base", cur_path="cur")


def test_a_metric_a_side_lacks_is_a_usage_error_naming_the_file():
    with pytest.raises(UsageError, match="fixtures/artifacts/mlp_steps8_a: no TPU estimate"):
        compare("mlp_steps8_a", "mlp_steps8_b", metric="tpu_time")
    with pytest.raises(UsageError, match="peak_memory needs a compile run"):
        compare("mlp_steps8_a", "mlp_steps8_b", metric="peak_memory")
    with pytest.raises(UsageError, match="unknown metric 'wall'"):
        compare("mlp_steps8_a", "mlp_steps8_b", metric="wall")


# -- compile runs ----------------------------------------------------------------------------------


def test_compile_run_against_itself_on_estimated_time_and_peak_memory():
    c = doc("compile_v5e_collective")
    assert default_metric(c)[0] == "tpu_time"
    t = compare("compile_v5e_collective", "compile_v5e_collective", metric=None)
    assert t["metric"] == "tpu_time" and t["headline"]["basis"] == "tpu_total_estimate"
    assert t["headline"]["base"] == pytest.approx(c["totals"]["estimated_s"], abs=1e-12)
    assert t["headline"]["spread"] == 0 and t["headline"]["verdict"] == "unchanged" and not t["regression"]
    assert len(t["ops"]) == len({(m["name"], o["name"]) for m in c["modules"] for o in m["ops"]})
    m = compare("compile_v5e_collective", "compile_v5e_collective", metric="peak_memory")
    assert m["unit"] == "bytes" and m["ops"] == []
    assert m["headline"]["base"] == max(x["totals"]["memory"]["peak_hbm_bytes"] for x in c["modules"])
    assert {r["name"] for r in m["modules"]} == {x["name"] for x in c["modules"]}


def test_a_static_metric_flags_rows_that_grew_and_the_headline_decides():
    # Two real compile reports of the same target: the current one with jit_step's figures taken
    # from jit__normal, the largest module, as if the step had grown into it.
    cur = doc("compile_v5e_collective")
    step = next(m for m in cur["modules"] if m["name"] == "jit_step")
    normal = next(m for m in cur["modules"] if m["name"] == "jit__normal")
    step["totals"] = copy.deepcopy(normal["totals"])
    d = compare_reports(doc("compile_v5e_collective"), cur, "tpu_time", 0.05, base_path="a", cur_path="b")
    flagged = [r["name"] for r in d["modules"] if r["flagged"]]
    assert flagged == ["jit_step"]
    assert d["headline"]["regression"] and d["regressions"][0]["kind"] == "headline"
    assert [r["kind"] for r in d["regressions"][1:]] == ["module"]
    assert not d["regressions"][1]["decides_exit"]


# -- inputs ----------------------------------------------------------------------------------------


def test_a_report_json_file_compares_like_its_run_directory(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(render_json(doc("mlp_steps8_b")))
    from_file = compare_reports(doc("mlp_steps8_a"), load_for_compare(path), "device_time", 0.05, base_path="a",
                                cur_path="b")
    assert from_file == compare("mlp_steps8_a", "mlp_steps8_b") | {
        "base": from_file["base"], "cur": from_file["cur"]}


@pytest.mark.parametrize("content, error, needle", [
    ('{"schema": "tpudiag.report/1", "ops": [', ParseError, "not a JSON report"),
    (b'{"schema": "\xc3\x28"}', ParseError, "not UTF-8"),
    ("", ParseError, "not a JSON report"),
    ('{"schema": "tpudiag.manifest/1"}', InputError, "not a tpudiag profile or compile report"),
])
def test_a_corrupt_report_file_is_a_typed_error_naming_it(tmp_path, content, error, needle):
    path = tmp_path / "report.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(error) as e:
        load_for_compare(path)
    assert str(path) in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)


def test_a_truncated_document_is_a_parse_error_naming_the_missing_field():
    broken = doc("mlp_steps8_b")
    del broken["steps"]["rows"]
    with pytest.raises(ParseError, match=r"^cur\.json: steps\.rows: missing$"):
        compare_reports(doc("mlp_steps8_a"), broken, None, 0.05, base_path="a", cur_path="cur.json")
    broken = doc("mlp_steps8_b")
    broken["ops"][0]["self_s"] = "fast"
    with pytest.raises(ParseError, match=r"^cur\.json: ops\[0\]\.self_s: expected a number, got 'fast'$"):
        compare_reports(doc("mlp_steps8_a"), broken, None, 0.05, base_path="a", cur_path="cur.json")


def test_missing_path_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_for_compare(tmp_path / "nope")


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("0%", 0.0), (" 12.5% ", 0.125)])
def test_max_regression_parses_percent_and_fractions(text, value):
    assert parse_max_regression(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "abc", "-1%", "nan%", "inf", "nan", "-0.05", "inf%", "1e400", "150", ""])
def test_max_regression_refuses_ambiguous_or_bad_values_and_suggests_only_valid_ones(text):
    with pytest.raises(UsageError, match="--max-regression") as e:
        parse_max_regression(text)
    message = str(e.value)
    assert len(message.splitlines()) == 1
    suggested = re.findall(r"(?:write|such as|the fraction) ([0-9][0-9.e+]*%?)", message)
    assert suggested, message
    for value in suggested:  # every value the message offers is one this parser accepts
        parse_max_regression(value)


def test_cli_max_regression_inf_is_a_usage_error_with_a_valid_example(capsys):
    rc, out, err = run_main(["compare", "--max-regression", "inf", "fixtures/artifacts/mlp_steps8_a",
                             "fixtures/artifacts/mlp_steps8_b"], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "5%" in err and "0.05" in err and "inf%" not in err


# -- rendering -------------------------------------------------------------------------------------


def test_json_rendering_round_trips_and_is_sorted():
    d = compare("sized_mlp_h1024", "sized_mlp_h4096")
    text = render_json(d)
    assert json.loads(text) == d and text == json.dumps(d, sort_keys=True, indent=2) + "\n"


def test_markdown_shows_the_verdict_headline_and_top_ops():
    c = comparison("sized_mlp_h1024", "sized_mlp_h4096")
    d = c.to_dict()
    md = render_compare_markdown(c, top=3)
    assert md.startswith("## tpudiag compare: **REGRESSION**")
    assert "| median step time | 3.09 ms | 10.28 ms | +7.19 ms | +232.7% | 1.72 ms |" in md
    assert f"`{d['ops'][0]['name']}` | {d['ops'][0]['module']}" in md and f"{len(d['ops']) - 3} more" in md
    assert "only the headline decides the exit code" in md
    ok = render_compare_markdown(comparison("mlp_steps8_a", "mlp_steps8_b"))
    assert ok.startswith("## tpudiag compare: no regression (within the measured spread)")


def test_terminal_and_verdict_line():
    c = comparison("mlp_steps8_a", "sized_mlp_h1024", force=True)
    console = Console(no_color=True, width=120, highlight=False, soft_wrap=False, record=True)
    render_compare_terminal(c, console, top=5)
    text = console.export_text()
    assert "tpudiag compare" in text and "forced" in text and "Ops by change (5 of" in text
    assert "warning: compared despite: program mlp.py vs sized_mlp.py" in text
    line = render_compare_verdict(comparison("sized_mlp_h1024", "sized_mlp_h4096"))
    assert line == ("REGRESSION: median step time 3.09 ms -> 10.28 ms (+7.19 ms, +232.7%); max regression 5%, "
                    "spread 1.72 ms")


# -- the command line (active once `tpudiag compare` is in cli.py) ----------------------------------



def run_main(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_cli_exit_codes(capsys, in_root):
    a, b = "fixtures/artifacts/mlp_steps8_a", "fixtures/artifacts/mlp_steps8_b"
    rc, out, err = run_main(["compare", "--no-color", "--width", "120", a, b], capsys)
    assert rc == 0 and "no regression" in out and err == ""
    rc, out, err = run_main(["compare", "--json", "--metric", "device_time", "fixtures/artifacts/sized_mlp_h1024",
                             "fixtures/artifacts/sized_mlp_h4096"], capsys)
    assert rc == 1 and json.loads(out)["regression"] is True
    assert err.startswith("tpudiag: REGRESSION: median step time") and len(err.strip().splitlines()) == 1
    rc, out, err = run_main(["compare", "--max-regression", "500%", "--metric", "device_time",
                             "fixtures/artifacts/sized_mlp_h1024",
                             "fixtures/artifacts/sized_mlp_h4096"], capsys)
    assert rc == 0


def test_cli_refusal_and_bad_input_are_one_line_errors(tmp_path, capsys, in_root):
    rc, out, err = run_main(["compare", "fixtures/artifacts/mlp_steps8_a", "fixtures/artifacts/sized_mlp_h1024"],
                            capsys)
    assert rc == 2 and out == "" and "program mlp.py vs sized_mlp.py" in err and len(err.strip().splitlines()) == 1
    rc, out, _ = run_main(["compare", "--force", "--md", "fixtures/artifacts/mlp_steps8_a",
                           "fixtures/artifacts/sized_mlp_h1024"], capsys)
    assert rc in (0, 1) and out.startswith("## tpudiag compare")
    bad = tmp_path / "report.json"
    bad.write_text('{"schema": "tpudiag.report/1", ')
    rc, _, err = run_main(["compare", "fixtures/artifacts/mlp_steps8_a", str(bad)], capsys)
    assert rc == 3 and str(bad) in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_main(["compare", "fixtures/artifacts/mlp_steps8_a", str(tmp_path / "nope")], capsys)
    assert rc == 2 and "no such file" in err
    rc, _, err = run_main(["compare", "--max-regression", "5", "fixtures/artifacts/mlp_steps8_a",
                           "fixtures/artifacts/mlp_steps8_b"], capsys)
    assert rc == 2 and "5%" in err


def test_cli_md_for_the_step_summary():
    result = CliRunner().invoke(cli, ["compare", "--md", str(ARTIFACTS / "mlp_steps8_a"),
                                      str(ARTIFACTS / "mlp_steps8_b")])
    assert result.exit_code == 0 and result.output.startswith("## tpudiag compare: no regression")


def test_runs_made_by_different_jax_versions_compare_with_a_warning(in_root):
    """Profiling before and after a jax upgrade is a comparison users make: it runs, and says so."""
    from tests.conftest import ARTIFACT_SETS

    base, cur = (str((ARTIFACT_SETS[s] / "mlp_steps8_a").relative_to(in_root)) for s in ("jax-0.10", "jax-0.12"))
    doc = compare_reports(load_for_compare(base), load_for_compare(cur), None, 0.05, base_path=base, cur_path=cur)
    assert ("different tool versions (jax 0.10.2 vs 0.12.0.1; jaxlib 0.10.2 vs 0.12.0.1; libtpu 0.0.42.1 vs "
            "0.0.50.1): compiler changes are part of the difference") in doc["warnings"]
    same = compare_reports(load_for_compare(base), load_for_compare(base), None, 0.05)
    assert not any("tool versions" in w for w in same["warnings"])


def test_a_saved_report_with_a_bad_field_is_refused_where_it_is_read(tmp_path, capsys):
    broken = doc("mlp_steps8_b")
    broken["steps"]["rows"][0]["duration_s"] = None
    path = tmp_path / "report.json"
    path.write_text(render_json(broken))
    with pytest.raises(ParseError, match=r"report\.json: steps\.rows\[0\]\.duration_s: expected a number, got None$"):
        load_for_compare(path)
    rc, out, err = run_main(["compare", str(ARTIFACTS / "mlp_steps8_a"), str(path)], capsys)
    assert rc == 3 and not out and err.count("\n") == 1 and "steps.rows[0].duration_s" in err


def test_a_failed_run_fails_the_gate_with_its_own_exit_code(capsys):
    # `raises` is a real run whose program raised after its first computation: compared (with
    # --force: another program) it fails the gate, exit 5, whatever the figures say.
    rc, out, err = run_main(["compare", "--force", str(ARTIFACTS / "mlp"), str(ARTIFACTS / "raises")], capsys)
    assert rc == 5
    assert "FAILED RUN: CUR" in out and "ValueError" in out
    assert err.count("\n") == 1 and err.startswith("tpudiag: compare: CUR ") and "a failed run passes no gate" in err
    rc, out, err = run_main(["compare", "--force", "--json", str(ARTIFACTS / "raises"), str(ARTIFACTS / "mlp")], capsys)
    doc = json.loads(out)
    assert rc == 5 and doc["run_failed"].startswith("BASE ") and Comparison.from_dict(doc).run_failed
    rc, out, _ = run_main(["compare", "--json", str(ARTIFACTS / "mlp_steps8_a"), str(ARTIFACTS / "mlp_steps8_b")], capsys)
    assert rc == 0 and "run_failed" not in json.loads(out)


def test_the_same_run_twice_is_refused(capsys, tmp_path):
    run = ARTIFACTS / "mlp_steps8_a"
    rc, out, err = run_main(["compare", str(run), str(run) + "/"], capsys)
    assert (rc, out) == (2, "") and "BASE and CUR are the same run" in err and err.count("\n") == 1
    rc, out, _ = run_main(["compare", "--force", "--json", str(run), str(run)], capsys)
    assert rc == 0 and json.loads(out)["headline"]["verdict"] != "regression"


def test_a_cur_that_crashed_at_import_fails_the_gate_and_a_runs_report_or_copy_is_the_same_run(tmp_path, capsys):
    """A real run of a program that failed before jax started (so it records no backend and no
    devices): compared with a good run of a program of the same name it was refused as "backend cpu
    vs unknown; 1 vs 0 devices (--force compares them anyway)", exit 2; its failure is the verdict
    (exit 5). The run against its own report.json passed (exit 0), and against a copy of itself."""
    import shutil
    import subprocess
    import sys

    (tmp_path / "mlp.py").write_text("import nosuch_module_for_compare  # noqa: F401\n")
    run = tmp_path / "crashed"
    p = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--out", str(run), str(tmp_path / "mlp.py")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and json.loads((run / "manifest.json").read_text())["status"] == "failed", p.stderr
    rc, out, err = run_main(["compare", str(ARTIFACTS / "mlp"), str(run)], capsys)
    assert rc == 5 and err.count("\n") == 1 and f"CUR {run} is a failed run" in err, err
    assert "ModuleNotFoundError" in err and "FAILED RUN: CUR" in out
    shutil.copytree(run, tmp_path / "copy")
    for cur in (run / "report.json", tmp_path / "copy"):
        rc, out, err = run_main(["compare", str(run), str(cur)], capsys)
        assert (rc, out) == (2, "") and "BASE and CUR are the same run" in err and err.count("\n") == 1, err
    rc, out, err = run_main(["compare", "--force", "--json", str(run), str(tmp_path / "copy")], capsys)
    assert rc == 5 and json.loads(out)["run_failed"]
