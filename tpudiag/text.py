"""Text helpers every layer may use: no figures, no I/O. `printable` is the one rule for showing a
program's, compiler's or file's string without letting it drive the terminal (or the page)."""

from __future__ import annotations

import re


def clip(text: str | None, chars: int, mark: str = "\u2026") -> str:
    """`text` cut to at most `chars` characters, the cut marked with `mark` (one ellipsis character
    by default; "..." where the output must stay ASCII)."""
    text = "" if text is None else str(text)
    return text if len(text) <= chars else text[:chars - len(mark)] + mark


# What a terminal acts on instead of showing: the C0 controls (ESC opens colour and cursor
# sequences, CR rewrites the line), DEL, the C1 controls (U+009B is a one-character CSI on some
# terminals), the Unicode line and paragraph separators, and the bidirectional overrides and
# isolates that reorder what is shown ("Trojan Source", CVE-2021-42574).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_char(m: re.Match) -> str:
    c = m.group()
    return _SHORT.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text, newlines: bool = False) -> str:
    """`text` (any value; None is "") with every control character written as its Python escape:
    ESC as `\\x1b`, a tab as `\\t`, U+202E as `\\u202e`. Every renderer passes each string that
    came from the program, the compiler or the file system through it before it is shown, in
    the terminal, Markdown and HTML alike. `newlines=True` keeps `\\n` (a multi-line error text or
    a whole document); by default a newline is escaped too, so a name stays on its table row.
    Backslashes are left alone: a Windows path reads as itself."""
    text = "" if text is None else str(text)
    if newlines:
        return "\n".join(_UNPRINTABLE.sub(_escape_char, line) for line in text.split("\n"))
    return _UNPRINTABLE.sub(_escape_char, text)
