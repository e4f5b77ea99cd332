"""`tpudiag challenge list|show|grade|new`: kernel-port tasks graded for correctness, determinism,
integrity and speed (tpudiag/challenge/). Options in, one challenge call, a renderer out; a grade short of
full marks is `GateFailed` (exit 1). docs/challenges.md."""

from __future__ import annotations

from pathlib import Path

import click

from tpudiag.cli.common import FiniteFloat, emit, output_format, output_options
from tpudiag.cli.group import cli
from tpudiag.errors import GateFailed

_TASKS_OPTION = click.option("--tasks", "task_dirs", multiple=True, type=click.Path(path_type=Path, file_okay=False),
                             help="Also a task directory (or a folder of them) besides the bundled tasks.")


@cli.group()
def challenge():
    """Kernel-port tasks: a statement, a reference, public and hidden shapes, and a grader."""


@challenge.command("list")
@_TASKS_OPTION
@output_options("tpudiag.challenge-tasks/1")
def list_(task_dirs, as_json, as_md, no_color, width):
    """The tasks, one row each."""
    from tpudiag.challenge.task import list_tasks, task_doc

    doc = {"schema": "tpudiag.challenge-tasks/1", "tasks": [task_doc(t) for t in list_tasks(task_dirs)]}
    emit(doc, output_format(as_json, as_md), no_color=no_color, width=width)


@challenge.command()
@_TASKS_OPTION
@output_options("tpudiag.challenge-task/1")
@click.argument("name")
def show(task_dirs, as_json, as_md, no_color, width, name):
    """NAME's statement, reference (with attribution), public shapes, dtypes and rubric."""
    from tpudiag.challenge.task import find_task, task_card

    emit(task_card(find_task(name, task_dirs)), output_format(as_json, as_md), no_color=no_color, width=width)


@challenge.command()
@_TASKS_OPTION
@click.option("--seed", type=int, default=None, help="Seed of the inputs (default: a fresh one, printed).")
@click.option("--time-limit", "time_limit_s", type=FiniteFloat(1, None), default=None,
              help="Seconds the solution's grading may take (default 600); past it the grade fails.")
@click.option("--no-speed", "no_speed", is_flag=True,
              help="Do not measure speed (quick grading): it is not scored and its points are left out.")
@output_options("tpudiag.challenge/2")
@click.argument("name")
@click.argument("solution", type=click.Path(path_type=Path, dir_okay=False))
def grade(task_dirs, seed, time_limit_s, no_speed, as_json, as_md, no_color, width, name, solution):
    """Grade SOLUTION.py on task NAME (a bundled name or a task directory). Exit 1 short of full marks.
    Speed is timed on the TPU when one is attached, else read from the static profile of an AOT
    compile for v5e."""
    from tpudiag.challenge.grade import grade as run_grade
    from tpudiag.challenge.task import TIME_LIMIT_S, find_task

    task = find_task(name, task_dirs)
    result = run_grade(task, solution, seed=seed, time_limit_s=time_limit_s or TIME_LIMIT_S, speed=not no_speed)
    emit(result, output_format(as_json, as_md), no_color=no_color, width=width)
    if not result.ok:
        why = result.error or f"failed: {', '.join(result.failed)}"
        raise GateFailed(f"challenge {task.name}: {result.score} of {result.max_score} points ({why})")


@challenge.command()
@click.option("--reference", required=True, metavar="FILE.py:FUNC", help="The reference function.")
@click.option("--shapes", required=True, metavar="SPEC", help='The public inputs, e.g. "x=f32[8,512] w=f32[512]".')
@click.option("--hidden", multiple=True, metavar="SPEC", help="Hidden inputs, used only at grading (repeatable).")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
def new(reference, shapes, hidden, directory):
    """Scaffold a task directory DIRECTORY from a reference function and its input shapes."""
    from tpudiag.challenge.scaffold import scaffold

    out = scaffold(directory, reference, shapes, hidden=hidden)
    click.echo(f"wrote {out}/task.json, reference.py, solution.py (grade: tpudiag challenge grade {out} "
               f"{out}/solution.py)")
