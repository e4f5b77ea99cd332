"""Grade a solution file on a task: the static integrity check here (integrity.py), everything that
runs the solution in child processes under a time limit (child.py: correctness, determinism and
the dynamic integrity checks; speed.py: the speed figures), then the score by the rubric
(task.RUBRIC, task.SPEED_RULE). Returns a `ChallengeResult`; writes only temporary files the
children answer in."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from tpudiag.challenge.integrity import check_source
from tpudiag.challenge.task import RUBRIC, SPEED_RULE, TIME_LIMIT_S, SpeedRule, Task
from tpudiag.errors import InputError
from tpudiag.results.challenge import SCHEMA, ChallengeResult, Criterion, Speed, SpeedFigure

_GATES = ("correctness", "integrity")  # speed is measured only for a solution that passes these


def grade(task: Task, solution, *, seed: int | None = None, time_limit_s: float = TIME_LIMIT_S,
          speed: bool = True) -> ChallengeResult:
    """`speed=False` (`--no-speed`): the speed criterion is not scored and its points are left out of
    the maximum."""
    solution = Path(solution)
    if not solution.is_file():
        raise InputError(f"{solution}: no such solution file")
    seed = secrets.randbelow(2**31 - 2) if seed is None else seed
    static = check_source(solution, reference_file=task.reference_path, reference_function=task.reference_function,
                          forbidden=task.forbidden)
    doc, error = _run_child("tpudiag.challenge.child", [task.directory, solution.resolve(), seed], time_limit_s)
    error = error or doc.get("load_error")
    criteria = []
    for name, points, _ in RUBRIC:
        if name == "speed":
            continue
        if error is not None:
            criteria.append(Criterion(name, points, 0, "fail", error))
            continue
        got = dict(doc["criteria"].get(name) or {"ok": False, "why": "not judged"})
        if name == "integrity" and static:
            got = {"ok": False, "why": "; ".join(static) + ("" if got["ok"] else f"; {got['why']}")}
        criteria.append(Criterion(name, points, points if got["ok"] else 0, "pass" if got["ok"] else "fail",
                                  got["why"]))
    points = dict((name, p) for name, p, _ in RUBRIC)["speed"]
    if not speed:
        criteria.append(Criterion("speed", points, 0, "not scored", "not measured (--no-speed)"))
    else:
        criteria.append(_speed(task, solution, seed, time_limit_s, points, error, criteria))
    return ChallengeResult(schema=SCHEMA, task=task.name, solution=str(solution), seed=seed,
                           score=sum(c.awarded for c in criteria),
                           max_score=sum(c.points for c in criteria if c.status != "not scored"),
                           error=error, criteria=tuple(criteria))


def _run_child(module: str, args: list, time_limit_s: float, env: dict | None = None) -> tuple[dict, str | None]:
    """The child's JSON document, or (empty, why it gave none)."""
    with tempfile.TemporaryDirectory(prefix="tpudiag-challenge-") as tmp:
        out = Path(tmp) / "out.json"
        if env is None:
            env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
        cmd = [sys.executable, "-m", module, *map(str, args[:3]), str(out), *map(str, args[3:])]
        try:
            proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            return {}, f"the solution did not finish within {time_limit_s:g} s (a hang, or far too slow)"
        if not out.is_file():
            tail = " ".join((proc.stderr or "").strip().splitlines()[-1:])[:300]
            return {}, f"the grading process ended with code {proc.returncode} before grading finished ({tail})"
        return json.loads(out.read_text()), None


def _speed(task: Task, solution: Path, seed: int, time_limit_s: float, points: int, error: str | None,
           criteria: list[Criterion]) -> Criterion:
    """The speed criterion: measured (on the chip where a TPU is attached, else statically) only for
    a solution that passed the gates."""
    failed = [c.name for c in criteria if c.name in _GATES and c.status != "pass"]
    if error is not None or failed:
        return Criterion("speed", points, 0, "fail",
                         f"not measured: the solution {'failed to grade' if error else 'fails ' + ' and '.join(failed)}"
                         " (the speed of a wrong or dishonest answer is no figure of merit)")
    from tpudiag.capture.process import tpu_attached

    args = [task.directory, solution.resolve(), seed]
    chip, chip_error = None, None
    if tpu_attached():
        env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # the TPU backend
        chip, chip_error = _run_child("tpudiag.challenge.speed", args + ["chip"], time_limit_s, env)
        chip_error = chip_error or chip.get("error")
    static, static_error = _run_child("tpudiag.challenge.speed", args + ["static"], time_limit_s)
    static_error = static_error or static.get("error")
    figures = _merge(chip.get("figures", []) if chip else [], static.get("figures", []))
    measured = speed_figures(task, chip.get("target") if chip and not chip_error else None,
                             static.get("target") or "v5e", static.get("inputs") or task.speed or task.public, figures)
    if measured is None:
        why = "; ".join(w for w in (chip_error and f"on the chip: {chip_error}", static_error) if w)
        return Criterion("speed", points, 0, "not scored", f"not measured: {why or 'no figures'}")
    awarded, status, why = speed_verdict(measured, points, bool(task.ground_truth))
    if chip_error:
        why += f" (not timed on the attached TPU: {chip_error})"
    return Criterion("speed", points, awarded, status, why, measured)


def _merge(chip: list[dict], static: list[dict]) -> tuple[SpeedFigure, ...]:
    """One figure per variant: its chip times and its static cycles and floor."""
    by = {}
    for row in static + chip:
        old = by.get(row["variant"])
        if old is None:
            by[row["variant"]] = dict(row)
            continue
        for k in ("min_us", "median_us"):
            old[k] = row[k]
        if row["status"] != "ok":  # a chip failure speaks for the variant where the chip is the basis
            old["status"], old["error"] = row["status"], row["error"]
    return tuple(SpeedFigure.from_dict(v, "speed", v["variant"]) for v in by.values())


def speed_figures(task: Task, chip_target: str | None, static_target: str, inputs: str,
                  figures: tuple[SpeedFigure, ...]) -> Speed | None:
    """The `Speed` of a grade from its figures: the chip basis where the solution was timed on the
    chip, else the static one; None where the solution has no figure at all."""
    from tpudiag.targets import resolve_target

    by = {f.variant: f for f in figures}
    sol = by.get("solution")
    if sol is None or (sol.min_us is None and sol.cycles is None):
        return None
    chip = chip_target is not None and sol.min_us is not None
    floors = [f.floor_cycles for f in figures if f.floor_cycles]
    floor = min(floors) if floors else None

    def value(name):
        f = by.get(name)
        return None if f is None else (f.min_us if chip else f.cycles)

    if chip and floor is not None:
        floor = round(floor / resolve_target(static_target).chip.clock_hz * 1e6, 3)
    s, g, r = value("solution"), value("ground_truth"), value("reference")

    def ratio(a, b):
        return None if not a or not b else round(a / b, 4)

    return Speed(basis="chip" if chip else "static", target=chip_target if chip else static_target, inputs=inputs,
                 unit="us" if chip else "cycles", solution=s, ground_truth=g, reference=r, floor=floor,
                 vs_reference=ratio(s, r), vs_ground_truth=ratio(s, g), of_floor=ratio(floor, s), figures=figures)


def speed_verdict(m: Speed, points: int, has_ground_truth: bool, rule: SpeedRule = SPEED_RULE) -> tuple[int, str, str]:
    """(points awarded, status, why) by `rule`: part for no slower than XLA's version (or than the
    ground truth, where even it is slower than XLA), the rest for `rule.of_ground_truth` of the
    ground truth's speed; a task without a ground truth puts every point on the first bar."""
    tol = rule.chip_noise if m.basis == "chip" else 1.0
    fmt = (lambda v: f"{v:,.1f} us") if m.unit == "us" else (lambda v: f"{v:,.0f} cycles")
    head = (f"{'on the chip (' + m.target + ')' if m.basis == 'chip' else 'static profile, ' + m.target} at "
            f"{m.inputs}: solution {fmt(m.solution)}")
    parts = []
    errors = {f.variant: f.error for f in m.figures if f.status != "ok"}
    for label, variant, v, r in (("XLA reference", "reference", m.reference, m.vs_reference),
                                 ("ground truth", "ground_truth", m.ground_truth, m.vs_ground_truth)):
        if v:
            parts.append(f"{label} {fmt(v)} (solution {r:.2f}x its time)")
        elif variant in errors:
            parts.append(f"{label}: {errors[variant]}")
    if m.floor and m.of_floor > 1:  # the compiler's byte counts overstate what the fastest variant moved
        parts.append(f"roofline floor {fmt(m.floor)} from the compiler's byte counts, which the solution beat: "
                     "no bound here")
    elif m.floor:
        parts.append(f"roofline floor {fmt(m.floor)} (solution at {100 * m.of_floor:.0f}% of it)")
    bars = [v for v in (m.reference, m.ground_truth) if v]
    if not bars:
        return 0, "not scored", head + "; nothing to compare it with: " + "; ".join(parts)
    xla_pts = round(points * rule.xla_share) if has_ground_truth and m.ground_truth else points
    xla_bar = max(bars)
    xla_ok = m.solution <= xla_bar * tol
    which = "XLA" if m.reference and xla_bar == m.reference else "the ground truth (slower than XLA here)"
    verdicts = [f"no slower than {which}: {xla_pts if xla_ok else 0}/{xla_pts}"]
    awarded = xla_pts if xla_ok else 0
    if xla_pts < points:
        gt_pts = points - xla_pts
        gt_ok = m.ground_truth / m.solution >= rule.of_ground_truth / tol
        verdicts.append(f"{100 * rule.of_ground_truth:.0f}% of the ground truth's speed: {gt_pts if gt_ok else 0}"
                        f"/{gt_pts}")
        awarded += gt_pts if gt_ok else 0
    status = "pass" if awarded == points else ("partial" if awarded else "fail")
    return awarded, status, f"{head}; {'; '.join(parts)}; {'; '.join(verdicts)}"
