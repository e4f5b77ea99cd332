"""Terminal and Markdown renderers of `tpudiag.challenge/2` (a grade), `tpudiag.challenge-tasks/1`
(`challenge list`) and `tpudiag.challenge-task/1` (`challenge show`). They compute nothing."""

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


@renders("tpudiag.challenge-tasks", "terminal")
def render_tasks(doc, console: Console) -> None:
    """One row a task, wrapped to the console's width (--width, COLUMNS or the terminal's)."""
    table = Table(show_edge=False, pad_edge=False, box=None)
    table.add_column("task", no_wrap=True)
    for col in ("title", "signature and public shapes"):
        table.add_column(col, overflow="fold")
    for t in doc["tasks"]:
        table.add_row(escape(t["name"]), escape(t["title"]), escape(f"{t['function']}: {t['public']}"))
    console.print(table)


@renders("tpudiag.challenge-tasks", "md")
def render_tasks_md(doc) -> str:
    lines = ["| task | title | signature and public shapes |", "|---|---|---|"]
    lines += [f"| {_esc(t['name'])} | {_esc(t['title'])} | {_esc(t['function'] + ': ' + t['public'])} |"
              for t in doc["tasks"]]
    return "\n".join(lines) + "\n"


def _show_lines(t, rubric) -> list[str]:
    out = [f"{t['name']}: {t['title']}", "", t["statement"], "",
           f"function:    {t['function']}", f"reference:   {t['reference']}",
           f"attribution: {t['attribution']}", f"public:      {t['public']}",
           f"hidden:      {t['hidden_sets']} shape set(s), used only at grading",
           f"regimes:     {', '.join(t['regimes'])}" + ("; gradients graded too" if t["grad"] else ""),
           f"speed at:    {t['speed']}",
           f"dtypes:      {', '.join(t['dtypes'])}",
           f"ground truth: {t['ground_truth'] or '(none)'}", "", "rubric:"]
    out += [f"  {r['criterion']:<12} {r['points']:>3} points  {r['what']}" for r in rubric]
    return out


@renders("tpudiag.challenge-task", "terminal")
def render_task(doc, console: Console) -> None:
    for line in _show_lines(doc["task"], doc["rubric"]):
        console.print(line, markup=False)


@renders("tpudiag.challenge-task", "md")
def render_task_md(doc) -> str:
    return "\n".join(["```", *_show_lines(doc["task"], doc["rubric"]), "```"]) + "\n"
