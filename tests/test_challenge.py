"""`tpudiag challenge`: every bundled ground truth scores full marks; each planted wrong solution
(tests/challenge_planted/) loses exactly the points of the criterion it breaks; speed from the
static profile ranks a planted slow solution below the ground truth and is not measured for a wrong
one; bad solutions (no import, wrong signature, a hang) fail the grade with the reason; `challenge
new` scaffolds a task that `list` shows and `grade` grades. Real grades in child processes, no
mocks; no wall-clock figure is asserted (static cycles are deterministic)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tpudiag.challenge.grade import grade
from tpudiag.challenge.integrity import check_source
from tpudiag.challenge.task import RUBRIC, bundled_names, find_task
from tpudiag.cli import main

PLANTED = Path(__file__).parent / "challenge_planted"
POINTS = {name: points for name, points, _ in RUBRIC}
FULL = sum(POINTS.values())
NO_SPEED = FULL - POINTS["speed"]  # `--no-speed`: speed is not scored and its points are left out


def run_main(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    return e.value.code, out, err


# Grades run without speed (the static compiles have their own tests below). The first three run on
# both jax legs; the others alternate between them (a grade takes 10-45 s on a 2-core runner), so
# every task is graded once in CI and the legs take about as long as each other.
GROUND_TRUTHS = {"int8_matmul": None, "rmsnorm_residual": None, "rope": None, "sampling": "oldest_leg",
                 "cross_entropy": "newest_leg", "flash_attention": "oldest_leg", "int4_matmul": "newest_leg",
                 "fp8_matmul": "oldest_leg", "grouped_matmul": "newest_leg", "rope_interleaved": "oldest_leg",
                 "cross_entropy_zloss": "newest_leg", "sliding_window_attention": "newest_leg",
                 "qwen3_moe": "oldest_leg", "mla_decode": "newest_leg", "ragged_paged_attention": "oldest_leg",
                 "flash_attention_bwd": "newest_leg"}


@pytest.mark.parametrize("name", sorted(GROUND_TRUTHS))
def test_each_ground_truth_scores_full_marks(name, request):
    if GROUND_TRUTHS[name]:
        request.getfixturevalue(GROUND_TRUTHS[name])
    task = find_task(name)
    result = grade(task, task.function_of(task.ground_truth)[0], speed=False)
    assert result.error is None
    assert result.score == result.max_score == NO_SPEED, [c.to_dict() for c in result.criteria]
    assert result.criterion("speed").status == "not scored" and "--no-speed" in result.criterion("speed").why


def test_every_bundled_task_has_a_ground_truth_that_is_graded():
    assert sorted(GROUND_TRUTHS) == bundled_names() and len(bundled_names()) >= 13
    for name in bundled_names():
        task = find_task(name)
        assert task.ground_truth and task.function_of(task.ground_truth)[0].is_file()
        assert task.speed and task.hidden and task.attribution


@pytest.mark.parametrize("task, planted, broken", [
    ("rmsnorm_residual", "scale_off", "correctness"),
    ("int8_matmul", "bf16_accumulate", "correctness"),
    ("rmsnorm_residual", "calls_reference", "integrity"),
    ("rmsnorm_residual", "cached", "integrity"),
    ("rmsnorm_residual", "shape_specialised", "correctness"),
    ("rmsnorm_residual", "nan_zero_rows", "correctness"),
    ("flash_attention", "causal_dropped", "correctness"),
])
def test_a_planted_solution_loses_exactly_its_criterion(task, planted, broken):
    result = grade(find_task(task), PLANTED / f"{planted}.py", speed=False)
    assert result.error is None
    assert result.failed == (broken,), [c.to_dict() for c in result.criteria]
    assert result.score == NO_SPEED - POINTS[broken]
    assert all(c.status in ("pass", "not scored") for c in result.criteria if c.name != broken)


def test_why_names_what_broke():
    shaped = grade(find_task("rmsnorm_residual"), PLANTED / "shape_specialised.py", seed=5, speed=False)
    why = shaped.criterion("correctness").why
    assert "hidden" in why and "public [" not in why  # the public shape passes; only the hidden ones fail
    zero = grade(find_task("rmsnorm_residual"), PLANTED / "nan_zero_rows.py", seed=5, speed=False)
    assert "[zero_rows]" in zero.criterion("correctness").why
    cached = grade(find_task("rmsnorm_residual"), PLANTED / "cached.py", seed=5)  # speed asked for: not measured
    assert "state kept between calls" in cached.criterion("integrity").why
    assert cached.failed == ("integrity", "speed") and cached.max_score == FULL
    assert "not measured: the solution fails integrity" in cached.criterion("speed").why


def test_an_independent_correct_solution_scores_full_marks():
    assert grade(find_task("rmsnorm_residual"), PLANTED / "good_jnp.py", speed=False).score == NO_SPEED


@pytest.mark.parametrize("planted, why", [("wrong_signature", "wrong signature: rmsnorm_residual(x, weight)"),
                                          ("no_import", "does not import: ModuleNotFoundError")])
def test_a_solution_that_cannot_run_fails_the_grade(planted, why, capsys):
    result = grade(find_task("rmsnorm_residual"), PLANTED / f"{planted}.py")
    assert result.score == 0 and why in result.error
    rc, out, err = run_main(["challenge", "grade", "--json", "rmsnorm_residual", str(PLANTED / f"{planted}.py")],
                            capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["schema"] == "tpudiag.challenge/2" and why in doc["error"]
    assert err.count("\n") == 1 and "0 of 100 points" in err


def test_a_hanging_solution_fails_on_the_time_limit():
    result = grade(find_task("rmsnorm_residual"), PLANTED / "hangs.py", time_limit_s=8)
    assert result.score == 0 and "did not finish within 8 s" in result.error


def test_list_show_and_unknown_names(capsys):
    rc, out, _ = run_main(["challenge", "list", "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["schema"] == "tpudiag.challenge-tasks/1"
    assert [t["name"] for t in doc["tasks"]] == bundled_names() and len(bundled_names()) >= 13
    rc, out, _ = run_main(["challenge", "list", "--width", "80"], capsys)  # wrapped to the width asked
    assert rc == 0 and max(map(len, out.splitlines())) <= 80 and "sliding_window_attention" in out
    rc, out, _ = run_main(["challenge", "show", "rope"], capsys)
    assert rc == 0 and "attribution:" in out and "q=f32[2,32,4,128]" in out and "correctness   60 points" in out
    assert "speed at:" in out and "q=f32[1,1024,16,128]" in out
    assert "[1,37,3,96]" not in out  # hidden shapes stay hidden
    rc, out, _ = run_main(["challenge", "show", "--json", "rope"], capsys)
    doc = json.loads(out)
    assert doc["task"]["hidden_sets"] == 2 and "[1,37,3,96]" not in out
    assert [r["points"] for r in doc["rubric"]] == [60, 10, 20, 10]
    rc, _, err = run_main(["challenge", "show", "nope"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "rmsnorm_residual, rope, rope_interleaved" in err
    rc, _, err = run_main(["challenge", "grade", "--time-limit", "nan", "rope", "x.py"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "'nan' is not a finite number" in err


def test_a_task_without_its_reference_is_one_line_exit_2(tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(find_task("rope").directory, broken)
    (broken / "reference.py").unlink()
    rc, _, err = run_main(["challenge", "grade", str(broken), str(broken / "ground_truth.py")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "reference" in err and "missing" in err


def test_grade_table_and_json(capsys):
    task = find_task("rope")
    rc, out, _ = run_main(["challenge", "grade", "--no-color", "--width", "200", "--seed", "7", "--no-speed",
                           "rope", str(task.function_of(task.ground_truth)[0])], capsys)
    assert rc == 0 and f"rope: {NO_SPEED} of {NO_SPEED} points" in out and "not measured (--no-speed)" in out
    for name in POINTS:
        assert name in out


def test_new_scaffolds_a_task_that_list_shows_and_grade_grades(tmp_path, capsys):
    ref = tmp_path / "mine.py"
    ref.write_text("import jax.numpy as jnp\n\n\ndef scaled_softplus(x, w):\n"
                   "    return jnp.logaddexp(x, 0.0) * w\n")
    root = tmp_path / "tasks"
    rc, out, _ = run_main(["challenge", "new", str(root / "softplus"), "--reference", f"{ref}:scaled_softplus",
                           "--shapes", "x=f32[8,256] w=f32[256]", "--hidden", "x=f32[5,200] w=f32[200]"], capsys)
    assert rc == 0 and (root / "softplus" / "task.json").is_file()
    rc, out, _ = run_main(["challenge", "list", "--json", "--tasks", str(root)], capsys)
    assert rc == 0 and "softplus" in [t["name"] for t in json.loads(out)["tasks"]]
    rc, out, err = run_main(["challenge", "grade", "--json", "--no-speed", "--tasks", str(root), "softplus",
                             str(root / "softplus" / "solution.py")], capsys)
    doc = json.loads(out)
    failed = [c["name"] for c in doc["criteria"] if c["status"] == "fail"]
    assert rc == 1 and failed == ["integrity"] and "imports the reference" in doc["criteria"][2]["why"]
    assert doc["score"] == NO_SPEED - POINTS["integrity"] and doc["schema"] == "tpudiag.challenge/2"


def test_integrity_reads_the_source(tmp_path):
    task = find_task("rmsnorm_residual")

    def findings(source):
        path = tmp_path / "s.py"
        path.write_text(source)
        return check_source(path, reference_file=task.reference_path, reference_function=task.reference_function,
                            forbidden=task.forbidden)

    assert findings("import jax\ndef f(x):\n    return jax.pure_callback(g, x, x)\n")
    assert findings("def f(x):\n    return open('answer.npy').read()\n")
    assert findings("from tpudiag.kernels.rmsnorm import reference as r\n")
    assert findings("import importlib\nm = importlib.import_module('reference')\n")
    assert findings("from pathlib import Path\nd = Path('a').read_bytes()\n")
    # a local called `compile` or `reference` is not the builtin or the reference; the kernel module is allowed
    assert findings("from tpudiag.kernels.rmsnorm import rmsnorm_residual\n"
                    "def f(x, compile=1):\n    reference = x\n    return reference + compile\n") == []
