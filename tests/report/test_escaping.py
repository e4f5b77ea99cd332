"""How the renderers show a string they did not write: `units.printable` (control characters as
escapes), `rich_text.plain` (rich text, never markup) and `markdown._esc` / `markdown.code`
(Markdown that shows the string and opens nothing). Each is checked against an oracle: Python's
own `unicode_escape` codec, rich's console, and markdown-it (the CommonMark reference parser's
port, which rich already depends on) with GitHub's table extension."""

from __future__ import annotations

import io
import random

import pytest
from markdown_it import MarkdownIt
from rich.console import Console
from rich.table import Table

from tpudiag.report.markdown import _esc, code
from tpudiag.report.rich_text import plain
from tpudiag.report.units import printable

HOSTILE = ("step[/bold]", "[bold red]X[/bold red]", "esc\x1b[31mred", ":smile: [link](http://x)", "a|b",
           "<script>alert(1)</script>", "`tick` ``two``", "&lt;b&gt;", "*em* _u_ __init__ ~~s~~ a_b", "back\\slash", "[/]")


def _random_strings(rng: random.Random, n: int = 300) -> list[str]:
    alphabet = [chr(c) for c in range(0x100) if c != ord("\\")]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(n)]


def test_printable_round_trips_through_pythons_escape_codec():
    """Below U+0100 (backslash aside), decoding the escapes gives the string back, and what is
    shown holds no control character."""
    for s in _random_strings(random.Random(7)):
        shown = printable(s)
        assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in shown), repr(shown)
        assert shown.encode("latin-1").decode("unicode_escape") == s


def test_printable_escapes_terminal_controls_and_keeps_newlines_when_asked():
    assert printable("esc\x1b[31mred") == "esc\\x1b[31mred"
    assert printable("a\tb\rc\nd\x7f\x9b") == "a\\tb\\rc\\nd\\x7f\\x9b"
    assert printable("rtl\u202eevil\u2066x\u2028") == "rtl\\u202eevil\\u2066x\\u2028"
    assert printable("two\nlines\x1b", newlines=True) == "two\nlines\\x1b"
    assert printable(None) == "" and printable(12) == "12"
    assert printable("C:\\path\\f.py:3 [ok] \u00e9\u4e2d") == "C:\\path\\f.py:3 [ok] \u00e9\u4e2d"


@pytest.mark.parametrize("name", HOSTILE)
def test_plain_is_shown_as_written_by_rich(name):
    """Printed, as a table cell, title and header: the literal text, never markup or an emoji."""
    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True, highlight=False)
    table = Table(title=plain(name))
    table.add_column(plain(name))
    table.add_row(plain(name))
    console.print(plain(name))
    console.print(table)
    shown = printable(name)
    assert out.getvalue().count(shown) == 4, out.getvalue()
    assert "\x1b" not in out.getvalue()


def _md_cells(row: str) -> list:
    """The inline tokens of each cell of a one-row GitHub table whose body row is `row`."""
    tokens = MarkdownIt("commonmark").enable("table").parse(f"| a | b |\n|---|---|\n{row}\n")
    body = tokens[[t.type for t in tokens].index("tbody_open"):]
    return [t for t in body if t.type == "inline"]


@pytest.mark.parametrize("name", HOSTILE)
def test_markdown_text_and_code_spans_show_the_name_and_open_nothing(name):
    text_cell, code_cell = _md_cells(f"| {_esc(name)} | {code(name)} |")
    shown = printable(name)
    # Escaped text: only text tokens (no link, emphasis, code span or HTML), whose content is the name.
    assert {c.type for c in text_cell.children} <= {"text"}, text_cell.children
    assert "".join(c.content for c in text_cell.children) == shown
    # A code span: exactly one, holding the name.
    assert [c.type for c in code_cell.children] == ["code_inline"]
    assert code_cell.children[0].content == shown
