"""Lays out the terminal renderers' tables and lines for the console's width: a name or a path is
never split across lines, a number is never clipped.

`table(console, columns, rows)` gives each column the width it needs: a number (`num`) its widest
value, a name (`name`: an op, a module) its whole length, prose (`text`: a reason, `producer →
consumer`) what is left, wrapped at spaces, at least its longest word. When that does not fit,
names longer than their column's `most` are cut there (with an ellipsis; the JSON has them whole);
then columns are left out, those whose cells are all the same first (their one value goes into
the legend), then by their `drop` rank, and the legend under the table says what was left out;
only then are names cut further (down to `NAME_MIN`); a table that still does not fit is printed
wider than the console, never with a clipped number. On a console of natural width (output piped,
`cli.common.console`) every column is as wide as its widest cell.

`say(console, text)` prints a line of prose wrapped at spaces, never inside a word: a path or an
op name longer than the line goes on a line of its own, whole. `header_panel` boxes a report's
header lines where they fit, and prints them unboxed where they do not.

It measures text and nothing else; it formats no figure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tpudiag.report.rich_text import plain

# A cut name keeps at least this many characters (with its ellipsis): enough to tell
# `broadcast_add_fusion.3` from `broadcast_multiply_fusion`.
NAME_MIN = 16
# Prose columns (a reason, a limit, an error) wrap down to this width before a column is left out,
# but never below their longest word (a name inside the prose) up to `WORD_MAX`: a longer one is cut.
TEXT_MIN = 12
WORD_MAX = 48
_WORD = re.compile(r"\S+\s*")


@dataclass(frozen=True)
class Col:
    """One column: `kind` "num" (never wrapped or cut: figures and source lines), "name" (never
    wrapped; cut with an ellipsis past `most` or when nothing else is left to give), "text" (wraps
    at spaces). `drop`: 0 always shown; the highest is left out first when the table does not fit,
    except that a droppable column with one value in every row goes first, into the legend as
    `header value` ("host vm")."""

    header: str
    kind: str = "num"
    justify: str = "right"
    drop: int = 0
    most: int | None = None


def _width(cell) -> int:
    return max((cell_len(line) for line in _plain(cell).split("\n")), default=0)


def _longest_word(cell) -> int:
    return max((cell_len(w) for w in _plain(cell).split()), default=0)


def _cell(cell, col: Col) -> Text:
    text = cell.copy() if isinstance(cell, Text) else plain(cell)
    if col.kind == "text":
        text.overflow = "ellipsis"  # a word wider than the column is cut, never folded
    else:
        text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _chrome(n: int) -> int:
    """Characters a borderless table (`show_edge=False`, padding 1) adds to its columns' widths."""
    return 3 * n - 1 if n else 0


def layout(width: int, columns: list[Col], rows: list[list]) -> tuple[list[int], list[int], list[str]]:
    """(the indices of the columns shown, their widths, the legend's phrases) for `rows` in `width`."""
    longest = [max([_width(r[i]) for r in rows], default=0) for i in range(len(columns))]
    header_word = [_longest_word(c.header) for c in columns]
    natural, least = [], []
    for i, c in enumerate(columns):
        need = max(longest[i], cell_len(c.header))
        natural.append(need)
        if c.kind == "num":
            least.append(max(longest[i], header_word[i]))
        elif c.kind == "text":
            word = min(max([_longest_word(r[i]) for r in rows], default=0), WORD_MAX)
            least.append(max(min(need, TEXT_MIN), word, header_word[i]))
        else:
            least.append(need)
    shown = list(range(len(columns)))
    same: list[str] = []
    dropped: list[str] = []

    def total(widths) -> int:
        return sum(widths[i] for i in shown) + _chrome(len(shown))

    if total(least) > width:  # names first give up what is past their `most`
        for i, c in enumerate(columns):
            if c.kind == "name" and c.most:
                least[i] = max(min(least[i], c.most), header_word[i])
    while total(least) > width:
        droppable = [i for i in shown if columns[i].drop > 0]
        if not droppable:
            break
        constant = [i for i in droppable if rows and len({_plain(r[i]) for r in rows}) == 1]
        i = max(constant or droppable, key=lambda j: (columns[j].drop, j))
        if constant:
            same.append(f"{columns[i].header} {_plain(rows[0][i]) or '-'}")
        else:
            dropped.append(columns[i].header)
        shown.remove(i)
    # Names are cut only when no column is left to leave out.
    for i in shown:
        if total(least) <= width:
            break
        if columns[i].kind == "name":
            least[i] = max(min(least[i], NAME_MIN), header_word[i], least[i] - (total(least) - width))
    widths = {i: least[i] for i in shown}
    spare = width - total(least)
    for kind in ("name", "text", "num"):  # what is left: names first, then prose, then long headers
        growing = [i for i in shown if columns[i].kind == kind]
        while spare > 0 and (growing := [i for i in growing if widths[i] < natural[i]]):
            for i in growing[:spare]:  # a character at a time to each: the short ones end first
                widths[i] += 1
                spare -= 1
    legend = [f"in every row: {', '.join(same)}"] if same else []
    if dropped:
        legend.append(f"left out to fit {width} columns: {', '.join(dropped)} (a wider --width, or --json, has them)")
    return shown, [widths[i] for i in shown], legend


def _plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def table(console: Console, columns: list[Col], rows: list[list], *, title=None) -> None:
    """Print `rows` under `columns` fitted to the console's width (`layout`), the title above it and
    the legend below it as prose (`say`)."""
    shown, widths, legend = layout(console.width, columns, rows)
    if title is not None:
        say(console, title, style="table.title")
    t = Table(show_edge=False, expand=False, width=sum(widths) + _chrome(len(shown)))
    for i, w in zip(shown, widths):
        c = columns[i]
        t.add_column(plain(c.header), justify=c.justify, width=w, overflow="fold")
    for r in rows:
        t.add_row(*[_cell(r[i], columns[i]) for i in shown])
    console.print(t, crop=False)
    for line in legend:
        say(console, line, style="bright_black")


def say(console: Console, text, style: str = "") -> None:
    """Print `text` (a `Text` with its lines, or any value shown as `plain`: one line, a newline
    escaped) wrapped at spaces to the console's width; a word wider than that (a path, an op name)
    gets a line of its own, whole."""
    text = text.copy() if isinstance(text, Text) else plain(text)
    if style:
        text.stylize(style)
    width = console.width
    for line in text.split("\n", allow_blank=True):
        offsets, used = [], cell_len(line.plain) - cell_len(line.plain.lstrip())  # the indent
        for m in _WORD.finditer(line.plain):
            word = cell_len(m.group().rstrip())
            if used and used + word > width:
                offsets.append(m.start())
                used = 0
            used += cell_len(m.group())
        for part in line.divide(offsets):
            part.rstrip()
            console.print(part, soft_wrap=True)


def header_panel(console: Console, text: Text, title: str) -> None:
    """`text` in a box titled `title`, as wide as its longest line; where a line (a long program
    path) does not fit the console, the title and the lines unboxed, so nothing is split."""
    longest = max((cell_len(line) for line in text.plain.split("\n")), default=0)
    if longest + 4 <= console.width:
        console.print(Panel(text, title=title, title_align="left", expand=False))
    else:
        say(console, Text(title, style="bold"))
        say(console, text)
