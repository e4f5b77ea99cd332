"""A challenge task: its directory (task.json, the reference file, the ground truth file) read into
a `Task`, and the rubric every task is graded by. Reads task directories; runs nothing.

task.json keys: name, title, function (the name a solution defines), statement, reference
(`FILE.py:FUNC` in the directory), attribution, ground_truth (`FILE.py:FUNC`, optional), public (an
input spec, as `tpudiag validate --inputs`), hidden (a list of specs, used only at grading), dtypes,
forbidden (dotted names a solution may not import or use besides the reference file), grad
(optional, false: true grades the gradients of every floating input too), regimes (optional: the
correctness regimes, `REGIMES` by default; a task that replaces one says why in its statement),
speed (optional: the input spec speed is measured at; the public one by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tpudiag.errors import InputError
from tpudiag.parity import inputs as inp

TASKS_DIR = Path(__file__).parent / "tasks"

# Every criterion, its points, and what it checks.
RUBRIC = (
    ("correctness", 60, "the parity rule of `tpudiag validate` (float64 truth, the reference's own error as the "
                        "yardstick) on fresh seeds, at the public and the hidden shapes, regimes normal, "
                        "large_logits, tiny and zero_rows (a task may replace one; `show` says), gradients too "
                        "where the task has them"),
    ("determinism", 10, "two calls on the same input, each from a freshly loaded module, return the same bits"),
    ("integrity", 20, "the source neither imports nor calls the reference nor reads files nor calls back to the "
                      "host; no state kept between calls (A, B, A from one module); the output changes when the "
                      "input does"),
    ("speed", 10, "on the TPU when one is attached, else the static profile of an AOT compile for v5e: half for "
                  "no slower than XLA's version (the reference jitted), half for 80% of the ground truth's speed; "
                  "measured only for a solution that passes correctness and integrity"),
)


@dataclass(frozen=True)
class SpeedRule:
    """How the speed criterion's points are earned (docs/challenges.md, "Speed")."""

    # The share of the points for being no slower than XLA's version of the task (the reference
    # jitted). Where even the ground truth is slower than XLA at the measured shapes (small shapes,
    # a kernel's fixed costs), the bar is the ground truth's time: what has been reached.
    xla_share: float = 0.5
    # The rest for reaching this share of the ground truth's speed (its time / the solution's).
    of_ground_truth: float = 0.8
    # Chip times move by a few percent between runs of the same executable (the fastest of 20
    # calls); a solution within this factor of a bar meets it. Static cycles are deterministic.
    chip_noise: float = 1.05


SPEED_RULE = SpeedRule()

# Regimes of the correctness check: large magnitudes, a scale that changes from row to row, rows of
# zeros (an eps in the wrong place divides by zero there), and the baseline.
REGIMES = ("normal", "large_logits", "tiny", "zero_rows")
TIME_LIMIT_S = 600  # the solution's whole grading process; a hang past it fails the grade


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    function: str
    statement: str
    reference: str  # FILE.py:FUNC, relative to the directory
    attribution: str
    ground_truth: str | None
    public: str
    hidden: tuple[str, ...]
    dtypes: tuple[str, ...]
    forbidden: tuple[str, ...]
    directory: Path
    grad: bool = False  # the gradients of every floating input are graded too (validate --grad)
    regimes: tuple[str, ...] = REGIMES
    speed: str | None = None  # the input spec speed is measured at (None: the public one)

    @property
    def reference_path(self) -> Path:
        return self.directory / self.reference.partition(":")[0]

    @property
    def reference_function(self) -> str:
        return self.reference.partition(":")[2]

    def function_of(self, text: str) -> tuple[Path, str]:
        """`FILE.py:FUNC` of this directory -> (its path, FUNC)."""
        file, _, func = text.partition(":")
        return self.directory / file, func


def task_doc(task: Task) -> dict:
    """A task as `challenge list --json` and `show --json` print it: its statement and sources, the
    number of hidden shape sets (never the shapes)."""
    return {"name": task.name, "title": task.title, "function": task.function, "statement": task.statement,
            "reference": task.reference, "attribution": task.attribution, "ground_truth": task.ground_truth,
            "public": task.public, "hidden_sets": len(task.hidden), "dtypes": list(task.dtypes),
            "regimes": list(task.regimes), "grad": task.grad, "speed": task.speed or task.public,
            "directory": str(task.directory)}


def task_card(task: Task) -> dict:
    """`challenge show --json`: the task (`task_doc`) and the rubric it is graded by."""
    rubric = [{"criterion": c, "points": p, "what": w} for c, p, w in RUBRIC]
    return {"schema": "tpudiag.challenge-task/1", "task": task_doc(task), "rubric": rubric}


def bundled_names() -> list[str]:
    return sorted(p.parent.name for p in TASKS_DIR.glob("*/task.json"))


def find_task(name_or_dir: str | Path, extra_dirs=()) -> Task:
    """A bundled task by name, a task directory, or a task named NAME under one of `extra_dirs`;
    else an InputError with the known names (one line, exit 2)."""
    path = Path(name_or_dir)
    if (path / "task.json").is_file():
        return load_task(path)
    for root in (TASKS_DIR, *map(Path, extra_dirs)):
        if (root / str(name_or_dir) / "task.json").is_file():
            return load_task(root / str(name_or_dir))
    known = [t.name for t in list_tasks(extra_dirs)]
    raise InputError(f"unknown task {str(name_or_dir)!r}; the tasks are {', '.join(known)}")


def list_tasks(extra_dirs=()) -> list[Task]:
    """The bundled tasks, then those under each of `extra_dirs` (a task directory or a folder of them)."""
    out = [load_task(TASKS_DIR / n) for n in bundled_names()]
    for d in map(Path, extra_dirs):
        if (d / "task.json").is_file():
            out.append(load_task(d))
        else:
            out += [load_task(p.parent) for p in sorted(d.glob("*/task.json"))]
    return out


def load_task(directory: Path) -> Task:
    directory = Path(directory)
    source = directory / "task.json"
    try:
        doc = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{source}: not a task file ({e})") from None
    missing = [k for k in ("name", "function", "statement", "reference", "public") if not doc.get(k)]
    if missing:
        raise InputError(f"{source}: missing {', '.join(missing)}")
    task = Task(name=doc["name"], title=doc.get("title", doc["name"]), function=doc["function"],
                statement=doc["statement"], reference=doc["reference"], attribution=doc.get("attribution", ""),
                ground_truth=doc.get("ground_truth"), public=doc["public"], hidden=tuple(doc.get("hidden", ())),
                dtypes=tuple(doc.get("dtypes", ())), forbidden=tuple(doc.get("forbidden", ())),
                directory=directory.resolve(), grad=bool(doc.get("grad", False)),
                regimes=tuple(doc.get("regimes") or REGIMES), speed=doc.get("speed"))
    unknown = [r for r in task.regimes if r not in ("zero_rows", *inp.REGIMES)]
    if unknown:
        raise InputError(f"{source}: unknown regime {', '.join(unknown)}")
    if task.speed:
        inp.parse_spec(task.speed)
    if ":" not in task.reference or not task.reference_path.is_file():
        raise InputError(f"{directory}: the reference {task.reference} is missing")
    return task
