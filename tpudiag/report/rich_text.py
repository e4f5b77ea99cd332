"""The one way the terminal renderers hand a string to rich: as `rich.text.Text`, never as a str.

rich reads a str given to `Console.print`, a `Table` cell, title or header, or a `Panel` as console
markup (`[bold]`, `[/x]`) and emoji codes (`:x:`): a jitted function named `step[/bold]` raises
MarkupError, one named `[red]x[/red]` is drawn red. A `Text` is shown as it is. `plain` also makes
the string `printable` (no raw ESC or other control character reaches the terminal, with or
without --no-color). Takes any value (None is ""); returns a `Text`; formats nothing else.
"""

from __future__ import annotations

from rich.text import Text

from tpudiag.report.units import printable


def plain(value, style: str = "", newlines: bool = False, **options) -> Text:
    """`value` as literal text in `style`; `options` go to `Text` (`no_wrap`, `overflow`, `justify`)."""
    return Text(printable(value, newlines=newlines), style=style, **options)
