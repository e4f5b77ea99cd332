"""The op-level timeline: op instances joined to their HLO, with self time and step, and the per-op table.

Input: the OPS and STEPS frames from `parse.xplane` and an index `{program_id: {op name: OpInfo}}`
built from the HLO dump. Output: a TIMELINE frame (one row per op instance) and an aggregated
frame (one row per (module, op)). No I/O.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpudiag.analyze.hlo.categories import OpInfo, guess_from_name
from tpudiag.parse import frames


def _self_ns(df: pd.DataFrame) -> np.ndarray:
    """Duration minus the time of events nested inside it on the same line (e.g. a while and its body)."""
    out = df["duration_ns"].to_numpy().copy()
    for _, idx in df.groupby(["device", "line"], sort=False).indices.items():
        idx = idx[np.argsort(df["start_ns"].to_numpy()[idx], kind="stable")]
        starts = df["start_ns"].to_numpy()[idx]
        ends = starts + df["duration_ns"].to_numpy()[idx]
        if len(idx) < 2 or np.all(starts[1:] >= np.maximum.accumulate(ends)[:-1]):
            continue  # no nesting on this line: self time is the duration (the common case)
        stack: list[int] = []
        for k in range(len(idx)):
            while stack and starts[k] >= ends[stack[-1]]:
                stack.pop()
            if stack:
                out[idx[stack[-1]]] -= min(ends[k], ends[stack[-1]]) - starts[k]
            stack.append(k)
    return np.maximum(out, 0)


def _assign_steps(op_starts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    if steps.empty:
        return np.full(len(op_starts), -1, dtype=np.int64)
    st = steps.sort_values("start_ns")
    s = st["start_ns"].to_numpy()
    e = s + st["duration_ns"].to_numpy()
    nums = st["step_num"].to_numpy()
    i = np.searchsorted(s, op_starts, side="right") - 1
    ok = (i >= 0) & (op_starts < e[np.clip(i, 0, None)])
    return np.where(ok, nums[np.clip(i, 0, None)], -1).astype(np.int64)


def steps_by_launch(timeline: pd.DataFrame, launches: pd.DataFrame | None, module_runs: pd.DataFrame,
                    steps: pd.DataFrame) -> pd.DataFrame:
    """The timeline with each op in the step that launched its program execution. A device runs
    behind its host, and its clock is not the host's (a TPU's ran 0.2-0.3 ms ahead here), so an op can
    start outside the step that launched it. The k-th host launch of a module is the device's k-th
    execution of it (`module_runs`, by start): paired where both counts agree. Other ops keep the step
    their start falls in."""
    if launches is None or launches.empty or steps.empty or timeline.empty or module_runs.empty:
        return timeline
    step_of: dict[int, int] = {}
    for module, runs in module_runs.sort_values("start_ns").groupby("module", sort=False):
        sent = launches[launches["module"] == module].sort_values("start_ns")
        if len(sent) != len(runs):
            continue
        for run_id, step in zip(runs["run_id"], _assign_steps(sent["start_ns"].to_numpy(), steps)):
            step_of[int(run_id)] = int(step)
    if not step_of:
        return timeline
    step = [step_of.get(int(r), s) if r != -1 else s for r, s in zip(timeline["run_id"], timeline["step"])]
    return timeline.assign(step=np.asarray(step, dtype=np.int64))


def build_timeline(ops: pd.DataFrame, steps: pd.DataFrame, hlo: dict[int, dict[str, OpInfo]]) -> pd.DataFrame:
    frames.check_frame(ops, frames.OPS, "ops")
    df = ops.reset_index(drop=True).copy()
    df["step"] = _assign_steps(df["start_ns"].to_numpy(), steps)
    df["self_ns"] = _self_ns(df).astype("int64")
    # Join each distinct (program_id, op) once, then broadcast: 400k instances are ~1k distinct ops.
    keys = df[["program_id", "op"]].drop_duplicates()
    info = [hlo.get(int(p), {}).get(o) or guess_from_name(o) for p, o in zip(keys["program_id"], keys["op"])]
    cols = {c: pd.Series([getattr(i, c) for i in info], index=keys.index, dtype="object")
            for c in ("category", "opcode", "bound", "shape", "source")}
    keys = keys.assign(**cols)
    df = df.merge(keys, on=["program_id", "op"], how="left")
    return frames.check_frame(df, frames.TIMELINE, "timeline")


def aggregate_ops(timeline: pd.DataFrame) -> pd.DataFrame:
    """One row per (module, program_id, op): occurrences, total/self/avg ns and share of device time."""
    if timeline.empty:
        return pd.DataFrame(columns=["module", "program_id", "op", "category", "opcode", "bound", "shape", "source",
                                     "occurrences", "total_ns", "self_ns", "avg_ns", "share"])
    g = timeline.groupby(["module", "program_id", "op"], sort=False, dropna=False)
    agg = g.agg(category=("category", "first"), opcode=("opcode", "first"), bound=("bound", "first"),
                shape=("shape", "first"), source=("source", "first"), occurrences=("op", "size"),
                total_ns=("duration_ns", "sum"), self_ns=("self_ns", "sum")).reset_index()
    agg["avg_ns"] = agg["total_ns"] // agg["occurrences"]
    total = agg["self_ns"].sum()
    agg["share"] = agg["self_ns"] / total if total else 0.0
    return agg.sort_values(["self_ns", "module", "op"], ascending=[False, True, True], kind="stable").reset_index(drop=True)


def step_table(timeline: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per step: its wall duration and the device op time (self) inside it."""
    if steps.empty:
        return pd.DataFrame(columns=["step_num", "duration_ns", "op_ns"])
    per = timeline[timeline["step"] >= 0].groupby("step")["self_ns"].sum()
    st = steps.groupby("step_num", sort=True)["duration_ns"].sum().reset_index()
    st["op_ns"] = st["step_num"].map(per).fillna(0).astype("int64")
    return st


def step_op_rows(timeline: pd.DataFrame, step_rows: list[dict], step: int | None = None) -> list[dict] | None:
    """The op instances of one step, as `report.html.render_html` draws them: by default the median
    step by duration (the shorter of the two middle ones), so a first step that includes compiling
    is not the one shown. `step_rows` is the report's `steps.rows`; None when there are no steps."""
    if not step_rows:
        return None
    if step is None:
        by_duration = sorted(step_rows, key=lambda r: (r["duration_s"], r["step_num"]))
        step = by_duration[(len(step_rows) - 1) // 2]["step_num"]
    sel = timeline[timeline["step"] == step].sort_values(["start_ns", "line", "op"], kind="stable")
    return [{"op": r.op, "module": r.module, "category": r.category, "line": r.line, "step": int(r.step),
             "start_s": r.start_ns * 1e-9, "duration_s": r.duration_ns * 1e-9} for r in sel.itertuples()]
