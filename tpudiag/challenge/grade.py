"""Grade a solution file on a task: the static integrity check here (integrity.py), everything that
runs the solution in a child process (child.py) under a time limit, then the score by the rubric
(task.RUBRIC). Returns a `ChallengeResult`; writes only a temporary file the child answers in."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from tpudiag.challenge.integrity import check_source
from tpudiag.results.challenge import SCHEMA, ChallengeResult, Criterion
from tpudiag.challenge.task import RUBRIC, TIME_LIMIT_S, Task
from tpudiag.errors import InputError


def grade(task: Task, solution, *, seed: int | None = None, time_limit_s: float = TIME_LIMIT_S) -> ChallengeResult:
    solution = Path(solution)
    if not solution.is_file():
        raise InputError(f"{solution}: no such solution file")
    seed = secrets.randbelow(2**31 - 2) if seed is None else seed
    static = check_source(solution, reference_file=task.reference_path, reference_function=task.reference_function,
                          forbidden=task.forbidden)
    doc, error = _run_child(task, solution, seed, time_limit_s)
    criteria = []
    for name, points, what in RUBRIC:
        if name == "speed":
            criteria.append(Criterion(name, points, 0, "not scored",
                                      "not timed (no TPU): a CPU runs Pallas in interpret mode, whose time says "
                                      "nothing of the kernel's"))
            continue
        if error is not None:
            criteria.append(Criterion(name, points, 0, "fail", error))
            continue
        got = dict(doc["criteria"].get(name) or {"ok": False, "why": "not judged"})
        if name == "integrity" and static:
            got = {"ok": False, "why": "; ".join(static) + ("" if got["ok"] else f"; {got['why']}")}
        criteria.append(Criterion(name, points, points if got["ok"] else 0, "pass" if got["ok"] else "fail",
                                  got["why"]))
    return ChallengeResult(schema=SCHEMA, task=task.name, solution=str(solution), seed=seed,
                           score=sum(c.awarded for c in criteria), max_score=sum(p for _, p, _ in RUBRIC),
                           error=error, criteria=tuple(criteria))


def _run_child(task: Task, solution: Path, seed: int, time_limit_s: float) -> tuple[dict, str | None]:
    """The child's document, or (empty, why it gave none)."""
    with tempfile.TemporaryDirectory(prefix="tpudiag-challenge-") as tmp:
        out = Path(tmp) / "grade.json"
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
        cmd = [sys.executable, "-m", "tpudiag.challenge.child", str(task.directory), str(solution.resolve()),
               str(seed), str(out)]
        try:
            proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            return {}, f"the solution did not finish within {time_limit_s:g} s (a hang, or far too slow)"
        if not out.is_file():
            tail = " ".join((proc.stderr or "").strip().splitlines()[-1:])[:300]
            return {}, f"the grading process ended with code {proc.returncode} before grading finished ({tail})"
        doc = json.loads(out.read_text())
    return doc, doc.get("load_error")
