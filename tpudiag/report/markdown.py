"""How every Markdown renderer writes a string from the program, the compiler or the file system:
`_esc` as text that cannot open a link, an emphasis, a code span, an HTML tag or a table cell,
`code` as one inline code span, `code_block` as a fenced block; each with its control characters
made `printable`. Reads strings, returns Markdown text; renders no result (`profile_markdown.py`
and the other `*_markdown`/`*_render` modules do)."""

from __future__ import annotations

import re

from tpudiag.report.units import printable

# Backslash first, so the escapes added after it are not escaped again. `&` so a name cannot spell
# an entity (`&lt;script>`); `[`, `]` so it cannot open a link; `` ` ``, `*` and `~` so it cannot
# open a code span, emphasis or strikethrough; `|` so it stays in its table cell; `<`, `>` so it
# cannot open an HTML tag.
_MD_ESCAPES = (("\\", "\\\\"), ("&", "&amp;"), ("[", "\\["), ("]", "\\]"), ("`", "\\`"), ("*", "\\*"),
               ("~", "\\~"), ("|", "\\|"), ("<", "&lt;"), (">", "&gt;"))


def _underscores(m: re.Match) -> str:
    """A run of `_` between two letters or digits (every `jit_step`) opens or closes no emphasis
    (CommonMark's flanking rules), so it stays as it is; any other run is escaped."""
    s, i, j = m.string, m.start(), m.end()
    inside = 0 < i and j < len(s) and s[i - 1].isalnum() and s[j].isalnum()
    return m.group() if inside else m.group().replace("_", "\\_")


def _esc(text) -> str:
    """`text` as literal Markdown text (a table cell, a heading, a quote)."""
    text = printable(text)
    for raw, escaped in _MD_ESCAPES:
        text = text.replace(raw, escaped)
    return re.sub("_+", _underscores, text)


def code(text) -> str:
    """`text` as one inline code span, shown exactly: backslashes and `<` are literal inside one, so only
    `|` is escaped (GitHub tables split cells before code spans, and honour `\\|` inside them), and
    the span's backtick fence is longer than any run of backticks in the text."""
    text = printable(text).replace("|", "\\|")
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(lines: list[str]) -> list[str]:
    """`lines` (already `printable`) as a fenced code block whose fence no line can close."""
    fence = "`" * max(3, 1 + max((len(run) for line in lines for run in re.findall("`+", line)), default=0))
    return [fence, *lines, fence]
