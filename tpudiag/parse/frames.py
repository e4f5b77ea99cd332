"""The DataFrame schemas of tpudiag, written down once, and the check applied where a frame enters.

Units live in column names (`_ns`, `_s`, `bytes_`). `check_frame` lists every bad column at once.
"""

from __future__ import annotations

import pandas as pd

from tpudiag.errors import SchemaError

# One row per executed op instance (a CPU thunk, or an event on a device's "XLA Ops" line).
OPS = {
    "device": "object",       # "/host:CPU" or "/device:TPU:0"
    "line": "object",         # the trace line (thread or stream) it ran on
    "module": "object",       # HLO module name, e.g. "jit_mlp"
    "program_id": "int64",    # XLA's module id; joins `module_NNNN.*` in the HLO dump (-1 if unknown)
    "run_id": "int64",        # one execution of the module: its ops share it (-1 if unknown)
    "op": "object",           # HLO instruction name, e.g. "fusion.12"
    "start_ns": "int64",      # from the start of the trace window
    "duration_ns": "int64",
}
# One row per StepTraceAnnotation (host) or device "Steps" event.
STEPS = {"name": "object", "step_num": "int64", "start_ns": "int64", "duration_ns": "int64"}
# Host activity intervals (TraceMe events on host threads that are not op instances).
HOST = {"name": "object", "start_ns": "int64", "duration_ns": "int64"}
# Compile activity from jax.monitoring: tracing, lowering and backend compile of one function.
COMPILES = {"event": "object", "fun_name": "object", "start_ns": "int64", "duration_ns": "int64"}
# XProf's hlo_stats tool, one row per HLO op of a device plane (parse/xprof_tools.py).
XPROF_HLO_STATS = {
    "program_id": "int64", "op": "object", "xprof_category": "object",
    "model_gflops_per_s": "float64",   # achieved model FLOP rate
    "memory_gib_per_s": "float64",     # measured memory bandwidth
    "flops_per_byte": "float64",       # operational intensity
    "bound_by": "object",              # XProf's verdict: "HBM", "Compute", ...
    "occurrences": "float64",          # executions in the trace
    "self_us": "float64",              # total self time, all executions
    "hbm_gib_per_s": "float64",        # measured HBM bandwidth
    "source": "object",                # "file.py:80", XProf's source line (None if it has none)
}
# TPU device planes (parse/device_planes.py). One row per event on a device's "Async XLA Ops" line:
# an asynchronous copy, collective or host transfer, from its start to its done.
ASYNC_OPS = {"device": "object", "module": "object", "program_id": "int64", "op": "object",
             "start_ns": "int64", "duration_ns": "int64"}
# One row per execution of a program on a device's "XLA Modules" line.
MODULE_RUNS = {"device": "object", "module": "object", "program_id": "int64", "run_id": "int64",
               "start_ns": "int64", "duration_ns": "int64"}
# What the trace's event metadata records of each HLO op of a device plane, once per (program_id, op).
DEVICE_OP_META = {
    "program_id": "int64", "op": "object",
    "xprof_category": "object",   # XProf's category ("convolution fusion", "loop fusion", ...)
    "flops": "int64",             # per execution
    "bytes_accessed": "int64",    # all memories, per execution
    "hbm_bytes": "int64",         # HBM read and written (memory_access_breakdown), per execution; -1 if not recorded
    "vmem_read_bytes": "int64",   # on-chip VMEM read, per execution; -1 if not recorded
    "vmem_write_bytes": "int64",  # on-chip VMEM written, per execution; -1 if not recorded
    "source": "object",           # "file.py:12" as the profiler recorded it, or None
}
# One row per host launch of a program execution (a device's trace: its k-th launch of a module is
# the device's k-th execution of it).
LAUNCHES = {"module": "object", "start_ns": "int64"}
# The per-op timeline after joining the HLO: OPS plus these columns.
TIMELINE = {**OPS, "step": "int64", "self_ns": "int64", "category": "object", "opcode": "object",
            "bound": "object", "shape": "object", "source": "object"}


def from_rows(rows: dict[str, list], schema: dict[str, str], what: str) -> pd.DataFrame:
    """A checked frame of `schema` from column lists (integer columns as int64); empty lists give the
    empty frame."""
    if not rows or not next(iter(rows.values())):
        return empty_frame(schema)
    df = pd.DataFrame(rows)
    for col, dtype in schema.items():
        if dtype == "int64":
            df[col] = df[col].astype("int64")
    return check_frame(df[list(schema)], schema, what)


def empty_frame(schema: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in schema.items()})


def check_frame(df: pd.DataFrame, schema: dict[str, str], what: str) -> pd.DataFrame:
    """Raise SchemaError naming every missing column and every column of the wrong dtype."""
    problems = []
    for col, dtype in schema.items():
        if col not in df.columns:
            problems.append(f"{col}: missing")
        elif dtype == "object":
            if not (pd.api.types.is_object_dtype(df[col]) or pd.api.types.is_string_dtype(df[col])):
                problems.append(f"{col}: expected strings, got {df[col].dtype}")
        elif str(df[col].dtype) != dtype:
            problems.append(f"{col}: expected {dtype}, got {df[col].dtype}")
    if problems:
        raise SchemaError(f"{what} frame: " + "; ".join(problems))
    return df
