"""Text helpers every layer may use: no figures, no I/O."""

from __future__ import annotations


def clip(text: str | None, chars: int, mark: str = "\u2026") -> str:
    """`text` cut to at most `chars` characters, the cut marked with `mark` (one ellipsis character
    by default; "..." where the output must stay ASCII)."""
    text = "" if text is None else str(text)
    return text if len(text) <= chars else text[:chars - len(mark)] + mark
