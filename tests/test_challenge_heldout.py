"""The held-out solutions (tests/challenge_heldout/, kept apart from the planted ones and from the
ground truths) are graded as they should be: `right_*` score full marks by a route other than the
ground truth's; `wrong_*` (a convention swapped, a window bound off by one, a z-loss sign, Mixtral's
routing for Qwen3's, a backward without the softmax's own term) lose correctness alone, for the
reason their docstring gives. Real grades in child processes, speed off (tests/test_challenge_speed.py
has it); the grades alternate between CI's jax legs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpudiag.challenge.grade import grade
from tpudiag.challenge.task import RUBRIC, find_task

HELDOUT = Path(__file__).parent / "challenge_heldout"
POINTS = {name: points for name, points, _ in RUBRIC}
NO_SPEED = sum(POINTS.values()) - POINTS["speed"]

# (task, file, the text the correctness reason must hold (None: full marks), jax leg)
CASES = [
    ("rope_interleaved", "right_rope_interleaved_complex", None, "oldest_leg"),
    ("rope_interleaved", "wrong_rotate_half", "candidate vs float64", "newest_leg"),
    ("cross_entropy_zloss", "right_zloss_online", None, "newest_leg"),
    ("cross_entropy_zloss", "wrong_zloss_sign", "public [normal]", "oldest_leg"),
    ("qwen3_moe", "right_moe_ragged_dot", None, "newest_leg"),
    ("qwen3_moe", "wrong_moe_no_renorm", "candidate vs float64", "oldest_leg"),
    ("sliding_window_attention", "wrong_window_off_by_one", "candidate vs float64", "oldest_leg"),
    ("flash_attention_bwd", "wrong_flash_bwd_no_delta", "grad[q]", "newest_leg"),
]


def test_every_heldout_file_is_graded():
    assert sorted(f"{c[1]}.py" for c in CASES) == sorted(p.name for p in HELDOUT.glob("*.py"))


@pytest.mark.parametrize("task, name, why, leg", CASES, ids=[c[1] for c in CASES])
def test_a_heldout_solution_is_graded_as_it_should_be(task, name, why, leg, request):
    request.getfixturevalue(leg)
    result = grade(find_task(task), HELDOUT / f"{name}.py", speed=False)
    assert result.error is None
    if why is None:
        assert result.score == result.max_score == NO_SPEED, [c.to_dict() for c in result.criteria]
    else:
        assert result.failed == ("correctness",), [c.to_dict() for c in result.criteria]
        assert result.score == NO_SPEED - POINTS["correctness"] and why in result.criterion("correctness").why
