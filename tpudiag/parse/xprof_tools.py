"""XProf's own converters for device planes: the `hlo_stats` tool as a checked DataFrame.

Reads one `.xplane.pb` through `xprof.convert.raw_to_tool_data` and returns one row per HLO op
with XProf's figures (category, FLOP rate, memory bandwidth, operational intensity, bound-by).
XProf fills these tables only from TPU and GPU device planes; for a CPU trace they are empty,
which is why the CPU timeline is tpudiag's own walk (`parse/xplane.py`).

XProf caches its op stats beside the trace (`ALL_HOSTS.op_stats_v2.pb`); to keep `report`
free of side effects the converter reads a link to the trace from a temporary directory.
It does not join these rows to the timeline (that is `analyze/profile/report.py`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from tpudiag.errors import ParseError
from tpudiag.parse import frames

# hlo_stats column id -> our column name (units in the name).
_COLUMNS = {
    "program_id": "program_id",
    "hlo_op_name": "op",
    "category": "xprof_category",
    "model_flop_rate": "model_gflops_per_s",
    "measured_memory_bw": "memory_gib_per_s",
    "operational_intensity": "flops_per_byte",
    "bound_by": "bound_by",
}


def hlo_stats(xplane: Path) -> pd.DataFrame:
    """XProf's hlo_stats table for this trace (empty for CPU-only traces)."""
    from xprof.convert import raw_to_tool_data

    xplane = Path(xplane).resolve()
    with tempfile.TemporaryDirectory(prefix="tpudiag-xprof-") as tmp:
        link = Path(tmp) / xplane.name
        link.symlink_to(xplane)
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(link)], "hlo_stats", {"use_saved_result": False})
    if not data:
        raise ParseError(xplane, "XProf's hlo_stats converter produced nothing for this trace")
    try:
        table = json.loads(data)
        ids = [c["id"] for c in table["cols"]]
        rows = [[cell.get("v") if isinstance(cell, dict) else None for cell in r["c"]] for r in table.get("rows") or []]
    except (ValueError, KeyError, TypeError) as e:
        raise ParseError(xplane, f"unexpected hlo_stats table from XProf ({e})") from None
    df = pd.DataFrame(rows, columns=ids) if rows else pd.DataFrame(columns=ids)
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise ParseError(xplane, f"XProf's hlo_stats lacks columns {missing}")
    df = df[list(_COLUMNS)].rename(columns=_COLUMNS)
    df["program_id"] = pd.to_numeric(df["program_id"], errors="coerce").fillna(-1).astype("int64")
    for col in ("model_gflops_per_s", "memory_gib_per_s", "flops_per_byte"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in ("op", "xprof_category", "bound_by"):
        df[col] = df[col].astype("object")
    return frames.check_frame(df, frames.XPROF_HLO_STATS, "xprof hlo_stats")
