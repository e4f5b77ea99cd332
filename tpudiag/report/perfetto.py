"""Renders a run's op timeline as a Chrome JSON trace, which Perfetto (ui.perfetto.dev and its
`trace_processor`) and chrome://tracing load: one complete event ("ph": "X") per op instance,
named after its HLO instruction, on a track per device and trace line, with the module,
category, bound, source line and step as args. Steps become a track of their own.

Input: rows prepared by `api.perfetto_rows` (plain dicts, times in ns from the trace start).
It computes nothing but the unit change to microseconds the format requires.
"""

from __future__ import annotations

import gzip
import json

SCHEMA_NOTE = "tpudiag op timeline (tpudiag export --perfetto)"


def render_perfetto(ops: list[dict], steps: list[dict], meta: dict) -> dict:
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    events: list[dict] = []
    for row in ops:
        pid = pids.setdefault(row["device"], len(pids) + 1)
        tid = tids.setdefault((row["device"], row["line"]), len(tids) + 1)
        events.append({
            "ph": "X", "name": row["op"], "cat": row["category"], "pid": pid, "tid": tid,
            "ts": row["start_ns"] / 1e3, "dur": row["duration_ns"] / 1e3,
            "args": {"hlo_module": row["module"], "program_id": row["program_id"], "category": row["category"],
                     "bound": row["bound"], "source": row["source"], "step": row["step"],
                     "self_us": row["self_ns"] / 1e3},
        })
    step_pid = len(pids) + 1
    for s in steps:
        events.append({"ph": "X", "name": f"{s['name']} {s['step_num']}", "cat": "step", "pid": step_pid, "tid": 1,
                       "ts": s["start_ns"] / 1e3, "dur": s["duration_ns"] / 1e3, "args": {"step": s["step_num"]}})
    names = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": device}} for device, pid in pids.items()]
    names += [{"ph": "M", "name": "thread_name", "pid": pids[dev], "tid": tid, "args": {"name": line}}
              for (dev, line), tid in tids.items()]
    if steps:
        names.append({"ph": "M", "name": "process_name", "pid": step_pid, "args": {"name": "Steps"}})
    return {"traceEvents": names + events, "displayTimeUnit": "ns",
            "otherData": {"generator": SCHEMA_NOTE, **{k: str(v) for k, v in meta.items()}}}


def dump_perfetto(doc: dict, path: str) -> bytes:
    """The bytes to write: gzip-compressed when the file name ends in .gz (Perfetto reads both)."""
    data = json.dumps(doc, separators=(",", ":")).encode()
    return gzip.compress(data, mtime=0) if path.endswith(".gz") else data
