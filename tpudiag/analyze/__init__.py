"""Analyze: pure functions over parsed artifacts (no I/O, no click, no rich)."""
