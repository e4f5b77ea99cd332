"""`compare`'s machine-drift check on measured times (`--metric device_time`, median steps).

Input: each run's calibration samples (`ProfileReport.calibration_s`: seconds a fixed CPU loop took
before the program, after traced steps and after it; capture/child.py) and the loop's name
(`calibration_loop`), the config's thresholds, and cur's headline figure. Output: a `Calibration`
(results/compare.py) with each run's median, fastest and slowest sample and its spread, the ratio of
the two runs' loop times and the range the samples allow, whether each run kept one speed
(`consistent`), and the range of cur's figure over every correction the samples allow, from none to
the largest; or None and the reason the two runs' speeds cannot be compared when only one has
samples, or the two timed different loops.

The verdict itself (refused, or the same at both ends of that range) is decided in runs.py. No I/O.
"""

from __future__ import annotations

import math
import statistics

from tpudiag.results.compare import Calibration, CalibrationSide

# What runs timed before tpudiag recorded `calibration_loop`: a multithreaded OpenBLAS matmul, twice.
OLD_LOOP = "matmul-tanh/1"


def calibration_side(samples: tuple[float, ...], trim: float) -> CalibrationSide:
    """One run's samples: their median, the fastest, and the slowest once the slowest `trim` share
    is set aside (one of 10; none with fewer than 1/trim samples); spread = slowest / fastest - 1.
    Only slow samples are set aside: other work can slow the loop for a moment, nothing can speed it
    up, so the fastest sample is the machine's own speed at that time. A busy-loop that starts
    after the first sample therefore shows in full (that sample is the fastest)."""
    ordered = sorted(samples)
    k = int(len(ordered) * trim)
    kept = ordered[:len(ordered) - k]
    fastest, slowest = kept[0], kept[-1]
    return CalibrationSide(samples=len(ordered), median_s=round(statistics.median(ordered), 9),
                           fastest_s=fastest, slowest_s=slowest, spread=round(slowest / fastest - 1, 6))


def check(base, cur, labels: list[str], cur_value: float, cfg) -> tuple[Calibration | None, str | None]:
    """(the calibration of two profile reports, None), or (None, why the time verdict is refused).
    `cur_value`: cur's headline figure (a median step time), for `cur_low`/`cur_high`; `cfg`: the
    CompareConfig (calibration_trim, calibration_spread_max, calibration_sensitivity). (None, None)
    when neither run has samples: they compare as before tpudiag timed them. Refused when only one
    has (the samples taken between its steps are a pause the other run did not have: +7% on the
    next step of a program that never pauses, measured) or when they timed different loops (their
    ratio would mean nothing). Samples of 0 or less (never written by tpudiag) count as none."""
    samples = [tuple(r.calibration_s or ()) for r in (base, cur)]
    usable = [bool(s) and min(s) > 0 for s in samples]
    if not any(usable):
        return None, None
    if not all(usable):
        i = usable.index(False)
        what = ("calibration samples of 0 s or less, which no loop takes" if samples[i] else
                "no calibration samples (a run made before tpudiag timed them, or a bare trace)")
        return None, (f"{labels[i]} has {what}, so the runs were not measured alike and their machines' speeds "
                      "cannot be compared")
    loops = [r.calibration_loop or OLD_LOOP for r in (base, cur)]
    if loops[0] != loops[1]:
        return None, (f"the runs timed different calibration loops ({loops[0]} in base, {loops[1]} in cur: one "
                      "was made by an older tpudiag), so their machines' speeds cannot be compared")
    b, c = (calibration_side(s, cfg.calibration_trim) for s in samples)
    ratio_low, ratio_high = c.fastest_s / b.slowest_s, c.slowest_s / b.fastest_s
    # cur's figure on base's machine: cur itself if the program's speed did not follow the machine's,
    # else cur divided by the ratio to the power `sensitivity` at most: ratio_high where cur's machine
    # was the slower (shrinking cur), ratio_low where it was the faster (growing it).
    k = cfg.calibration_sensitivity
    low, high = cur_value / max(1.0, ratio_high) ** k, cur_value / min(1.0, ratio_low) ** k
    return Calibration(
        loop=loops[0], base=b, cur=c, ratio=round(c.median_s / b.median_s, 6), ratio_low=round(ratio_low, 6),
        ratio_high=round(ratio_high, 6), spread_max=cfg.calibration_spread_max, sensitivity=k,
        consistent=all(side.samples >= 2 and side.spread <= cfg.calibration_spread_max for side in (b, c)),
        cur_low=round(low, 12), cur_high=round(high, 12)), None


def _ms(seconds: float) -> str:
    """Milliseconds to three significant digits: 4.00, 8.20, 465."""
    ms = seconds * 1e3
    return f"{ms:.{max(0, 2 - math.floor(math.log10(ms)))}f}" if ms > 0 else "0"


def inconsistency(cal: Calibration) -> str:
    """The one-line reason a time verdict is refused when a run's machine changed speed during it (or a
    run has one sample, so that it cannot be told)."""
    single = [label for side, label in ((cal.base, "base"), (cal.cur, "cur")) if side.samples < 2]
    if single:
        return (f"{' and '.join(single)} timed the calibration loop once, so whether the machine kept one speed "
                "during the run is unknown")
    parts = []
    for side, label in ((cal.base, "base"), (cal.cur, "cur")):
        if side.spread > cal.spread_max:
            parts.append(f"{label}'s {side.samples} calibration samples range {_ms(side.fastest_s)} to "
                         f"{_ms(side.slowest_s)} ms ({side.spread:.0%} apart)")
    return (f"the machine's speed changed during the run: {'; '.join(parts)}; a time verdict needs each run's "
            f"samples within {cal.spread_max:.0%} of each other")
