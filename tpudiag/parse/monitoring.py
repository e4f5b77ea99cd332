"""Reads `capture/monitoring.jsonl` (jax.monitoring events recorded in the child) into frames.

Returns the COMPILES frame (tracing, lowering and backend-compile durations per function, with
their wall-clock interval) and the number of persistent compilation-cache hits in the run. It does not
align clocks with the trace (that is `analyze/profile/compiles.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tpudiag.errors import ParseError
from tpudiag.parse import frames

# jax.monitoring duration events that are compile work, and the stage each one is.
COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "tracing",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "backend_compile",
}
# jax 0.10.2 records cache hits without naming the function (jax/_src/compiler.py), so hits are
# counted per run, not per function.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def normalize_fun_name(name: str) -> str:
    """`jit(mlp)` (lowering, compile) and `mlp` (tracing) are the same function."""
    while name.startswith(("jit(", "pjit(")) and name.endswith(")"):
        name = name[name.index("(") + 1 : -1]
    return name


def read_monitoring(path: Path) -> tuple[pd.DataFrame, int]:
    """The COMPILES frame and the number of persistent compilation-cache hits."""
    rows = {c: [] for c in frames.COMPILES}
    cache_hits = 0
    if not path.is_file():
        return frames.empty_frame(frames.COMPILES), cache_hits
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            event = rec["event"]
        except (json.JSONDecodeError, KeyError, TypeError):
            # The child may be killed mid-write: a torn last line is expected, anything else is not.
            if n == len(lines):
                break
            raise ParseError(path, "not a monitoring record (JSON with an 'event')", line=n, snippet=line) from None
        if event in COMPILE_EVENTS:
            dur = int(float(rec["duration_s"]) * 1e9)
            rows["event"].append(COMPILE_EVENTS[event])
            rows["fun_name"].append(normalize_fun_name(rec.get("fun_name", "?")))
            rows["start_ns"].append(int(rec["end_ns"]) - dur)
            rows["duration_ns"].append(dur)
        elif event == CACHE_HIT_EVENT:
            cache_hits += 1
    if not rows["event"]:
        return frames.empty_frame(frames.COMPILES), cache_hits
    df = pd.DataFrame(rows).astype({"start_ns": "int64", "duration_ns": "int64"})
    return frames.check_frame(df, frames.COMPILES, "monitoring"), cache_hits
