"""XProf's own converters for device planes: the `hlo_stats` tool as a checked DataFrame.

Reads one `.xplane.pb` through `xprof.convert.raw_to_tool_data` and returns one row per HLO op
with XProf's figures (category, FLOP rate, memory bandwidth, operational intensity, bound-by).
XProf fills these tables only from TPU and GPU device planes; for a CPU trace they are empty,
which is why the CPU timeline is tpudiag's own walk (`parse/xplane.py`).

XProf caches its op stats beside the trace (`ALL_HOSTS.op_stats_v2.pb`); to keep `report`
free of side effects the converter reads a link to the trace from a temporary directory.
XProf names a program by its fingerprint; `program_ids` ({fingerprint: module id}, from the trace's
`/host:metadata`, `parse/device_planes.py`) turns that into the module id the timeline and the HLO
dump use. It does not join these rows to the timeline (that is `analyze/profile/report.py`).
"""

from __future__ import annotations

import html
import json
import re
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
    "occurrences": "occurrences",
    "total_self_time": "self_us",
    "hbm_bw": "hbm_gib_per_s",
    "source_info": "source",
}
# source_info is an HTML cell: "<div class='source-info-cell' title='STACK'>file.py:80</div>".
_SOURCE_CELL = re.compile(r">([^<>]*)</div>\s*$")


def _source(cell) -> str | None:
    if not isinstance(cell, str) or not cell:
        return None
    m = _SOURCE_CELL.search(cell)
    text = html.unescape(m.group(1) if m else cell).strip()
    return text or None


def hlo_stats(xplane: Path, program_ids: dict[int, int] | None = None) -> pd.DataFrame:
    """XProf's hlo_stats table for this trace (empty for CPU-only traces). With `program_ids`
    ({fingerprint: module id}), `program_id` is the module id; a fingerprint not in it becomes -1."""
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
    if program_ids is not None:
        # Fingerprints are unsigned 64-bit: read them as Python ints, never through int64 or float.
        df["program_id"] = [program_ids.get(int(v), -1) if str(v).isdigit() else -1 for v in df["program_id"]]
    df["program_id"] = pd.to_numeric(df["program_id"], errors="coerce").fillna(-1).astype("int64")
    for col in ("model_gflops_per_s", "memory_gib_per_s", "flops_per_byte", "occurrences", "self_us",
                "hbm_gib_per_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["source"] = [_source(v) for v in df["source"]]
    for col in ("op", "xprof_category", "bound_by", "source"):
        df[col] = df[col].astype("object")
    return frames.check_frame(df, frames.XPROF_HLO_STATS, "xprof hlo_stats")
