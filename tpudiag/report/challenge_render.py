"""Terminal and Markdown renderers of `tpudiag.challenge/2` (a grade), and the plain text of
`tpudiag challenge list` and `show`. They compute nothing."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tpudiag.report.markdown import _esc
from tpudiag.report.registry import renders


def _get(r, name):
    return r[name] if isinstance(r, dict) else getattr(r, name)


def _rows(result):
    for c in _get(result, "criteria"):
        c = c if isinstance(c, dict) else c.to_dict()
        yield c["name"], f"{c['awarded']}/{c['points']}", c["status"], c["why"]


@renders("tpudiag.challenge", "terminal")
def render_grade(result, console: Console) -> None:
    head = f"{_get(result, 'task')}: {_get(result, 'score')} of {_get(result, 'max_score')} points"
    console.print(f"{head}  ({_get(result, 'solution')}, seed {_get(result, 'seed')})", markup=False)
    if _get(result, "error"):
        console.print(f"grade failed: {_get(result, 'error')}", markup=False)
    table = Table(show_edge=False, pad_edge=False)
    for col in ("criterion", "points", "status", "why"):
        table.add_column(col, overflow="fold")
    for row in _rows(result):
        table.add_row(*map(escape, row))  # as written: "[normal]" in a why is a regime, not markup
    console.print(table)


@renders("tpudiag.challenge", "md")
def render_grade_md(result) -> str:
    lines = [f"## {_esc(_get(result, 'task'))}: {_get(result, 'score')} of {_get(result, 'max_score')} points", ""]
    if _get(result, "error"):
        lines += [f"Grade failed: {_esc(_get(result, 'error'))}", ""]
    lines += ["| criterion | points | status | why |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(_esc(x) for x in row)} |" for row in _rows(result)]
    return "\n".join(lines) + "\n"


def list_lines(tasks) -> list[str]:
    width = max((len(t.name) for t in tasks), default=0)
    return [f"{t.name:<{width}}  {t.title}  ({t.function}: {t.public})" for t in tasks]


def show_lines(task, rubric) -> list[str]:
    out = [f"{task.name}: {task.title}", "", task.statement, "",
           f"function:    {task.function}", f"reference:   {task.reference}",
           f"attribution: {task.attribution}", f"public:      {task.public}",
           f"hidden:      {len(task.hidden)} shape set(s), used only at grading",
           f"regimes:     {', '.join(task.regimes)}" + ("; gradients graded too" if task.grad else ""),
           f"speed at:    {task.speed or task.public}",
           f"dtypes:      {', '.join(task.dtypes)}",
           f"ground truth: {task.ground_truth or '(none)'}", "", "rubric:"]
    out += [f"  {name:<12} {points:>3} points  {what}" for name, points, what in rubric]
    return out
