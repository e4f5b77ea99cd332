"""Splits the traced wall time into compute / memory / communication / host / idle / compile.

Input: the trace window length and, per class, a list of [start, end) intervals (ns from the
window start). Output: a `Breakdown` whose parts sum exactly to the window.

Definition (docs/breakdown.md): every instant of the window is given to exactly one class, the
first of these that is active at that instant:

    communication > compute > memory > control (counted as compute) > compile > host > idle

so overlapping activity is never counted twice and the parts always sum to the window.
"""

from __future__ import annotations


import numpy as np

from tpudiag.results.profile import Breakdown

def ns_to_s(ns) -> float:
    """ns -> s, rounded to the ns so JSON shows 0.0123 and not 0.012300000000000002."""
    return round(float(ns) * 1e-9, 9)


PRIORITY = ("communication", "compute", "memory", "control", "compile", "host")


def _coverage(bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each elementary segment [bounds[i], bounds[i+1]), whether any interval covers it."""
    delta = np.zeros(len(bounds), dtype=np.int64)
    np.add.at(delta, np.searchsorted(bounds, starts), 1)
    np.add.at(delta, np.searchsorted(bounds, ends), -1)
    return np.cumsum(delta)[:-1] > 0


def split_window(window_ns: int, intervals: dict[str, tuple[np.ndarray, np.ndarray]]) -> Breakdown:
    unknown = set(intervals) - set(PRIORITY)
    if unknown:
        raise ValueError(f"unknown breakdown classes: {sorted(unknown)}")
    clipped = {}
    pieces = [np.array([0, window_ns], dtype=np.int64)]
    for cls, (s, e) in intervals.items():
        s = np.clip(np.asarray(s, dtype=np.int64), 0, window_ns)
        e = np.clip(np.asarray(e, dtype=np.int64), 0, window_ns)
        keep = e > s
        clipped[cls] = (s[keep], e[keep])
        pieces += [s[keep], e[keep]]
    # sort + drop repeats: numpy 2's np.unique hashes, 13x slower here (0.65 s vs 0.05 s at 750k, bench/).
    bounds = np.sort(np.concatenate(pieces))
    bounds = bounds[np.concatenate(([True], bounds[1:] != bounds[:-1]))]
    seg = np.diff(bounds)
    taken = np.zeros(len(seg), dtype=bool)
    ns = dict.fromkeys(PRIORITY, 0)
    for cls in PRIORITY:
        if cls not in clipped or not len(clipped[cls][0]):
            continue
        cov = _coverage(bounds, *clipped[cls]) & ~taken
        ns[cls] = int(seg[cov].sum())
        taken |= cov
    busy = sum(ns.values())
    to_s = ns_to_s
    return Breakdown(
        total_s=to_s(window_ns),
        compute_s=to_s(ns["compute"] + ns["control"]),
        memory_s=to_s(ns["memory"]),
        communication_s=to_s(ns["communication"]),
        host_s=to_s(ns["host"]),
        idle_s=to_s(window_ns - busy),
        compile_s=to_s(ns["compile"]),
    )
