"""report/units.py: the one set of formatters the renderers share. Each is checked against the exact
text the renderers printed with their own copies before (the goldens pin the rest)."""

from __future__ import annotations

import random

from tpudiag.report import units


def test_fmt_pct_digits_match_pythons_percent_format():
    # compile_terminal printed slot utilization as f"{value:.0%}"; fmt_pct(value, 0) must print the same
    rng = random.Random(7)
    values = [rng.random() * 2 for _ in range(20000)] + [0.005, 0.015, 0.125, 0.285, 0.5, 0.825, 0.995, 1.0, 0.0]
    for x in values:
        assert units.fmt_pct(x, 0) == f"{x:.0%}", x
        assert units.fmt_pct(x) == f"{100 * x:.1f}%"
    assert units.fmt_pct(None) == "-"


def test_fmt_count_si_prefixes():
    assert units.fmt_count(1.97e14, "FLOP/s") == "197 TFLOP/s"
    assert units.fmt_count(8.19e11, "B/s") == "819 GB/s"
    assert units.fmt_count(2.5e15, "FLOP") == "2.5 PFLOP"
    assert units.fmt_count(1000, "FLOP") == "1 kFLOP"
    assert units.fmt_count(999, "FLOP") == "999 FLOP"
    assert units.fmt_count(10.0 ** -2, "") == "0.01"  # a bare axis label: no trailing space
    assert units.fmt_count(None, "FLOP") == "-"


def test_fmt_cycles_and_fmt_int():
    assert [units.fmt_cycles(n) for n in (None, 512, 1000, 97_049, 1_340_000)] == ["-", "512", "1.0k", "97.0k",
                                                                                   "1.34M"]
    assert [units.fmt_int(n) for n in (None, 0, 1234567)] == ["-", "0", "1,234,567"]


def test_fmt_ghz():
    assert units.fmt_ghz(1.5e9) == "1.50 GHz"
    assert units.fmt_ghz(940e6) == "0.94 GHz"


def test_clip_keeps_short_text_and_marks_the_cut():
    assert units.clip("fusion.12", 30) == "fusion.12"
    assert units.clip("a" * 30, 30) == "a" * 30
    cut = units.clip("b" * 31, 30)
    assert len(cut) == 30 and cut == "b" * 29 + "\u2026"
    ascii_cut = units.clip("c" * 120, 100, "...")  # diff_render's and analyze/hlo_diff's form
    assert len(ascii_cut) == 100 and ascii_cut.endswith("c...")
    assert units.clip(None, 5) == ""
    assert units.clip(12345678, 5) == "1234\u2026"
