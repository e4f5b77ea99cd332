"""Compile activity: the per-function compile table and the compile intervals on the trace clock.

Input: the COMPILES frame (epoch-ns intervals from jax.monitoring) and the trace's start time.
No I/O.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def compile_intervals(compiles: pd.DataFrame, trace_start_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) in ns from the trace window start (same clock: both are the host's wall clock)."""
    s = compiles["start_ns"].to_numpy(dtype=np.int64) - trace_start_ns
    return s, s + compiles["duration_ns"].to_numpy(dtype=np.int64)


def compile_table(compiles: pd.DataFrame) -> pd.DataFrame:
    """One row per function: how many times each stage ran and how long it took."""
    cols = ["fun_name", "compiles", "tracing_ns", "lowering_ns", "backend_compile_ns", "total_ns"]
    if compiles.empty:
        return pd.DataFrame(columns=cols)
    p = compiles.pivot_table(index="fun_name", columns="event", values="duration_ns", aggfunc="sum", fill_value=0)
    for stage in ("tracing", "lowering", "backend_compile"):
        if stage not in p.columns:
            p[stage] = 0
    n = compiles[compiles["event"] == "backend_compile"].groupby("fun_name").size()
    out = pd.DataFrame({
        "fun_name": p.index,
        "compiles": p.index.map(n).fillna(0).astype("int64"),
        "tracing_ns": p["tracing"].astype("int64").to_numpy(),
        "lowering_ns": p["lowering"].astype("int64").to_numpy(),
        "backend_compile_ns": p["backend_compile"].astype("int64").to_numpy(),
    })
    out["total_ns"] = out["tracing_ns"] + out["lowering_ns"] + out["backend_compile_ns"]
    return out.sort_values(["total_ns", "fun_name"], ascending=[False, True]).reset_index(drop=True)
