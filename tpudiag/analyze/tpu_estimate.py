"""`profile --target`: the measured CPU run next to the TPU compiler's estimate of the same computations.

Input: the profile's op timeline (TIMELINE frame), its steps, and the `tpudiag.compile/1` document
of the run's own jitted computations compiled for a TPU target. Output: the `tpu_estimate`
section of the profile report:

- per module: executions in the trace (distinct run ids), measured CPU op time, the estimated TPU
  time of one execution and of all of them;
- an estimated TPU step time: every module's estimate weighted by how often it ran inside the
  traced steps, divided by the number of steps;
- per source line: CPU op time against estimated TPU time (op names differ between the CPU and
  TPU compiles, the Python line they came from does not).

No I/O. Modules with several compiles under one name (e.g. `jit__normal` at three shapes) are
summed under that name.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from tpudiag.analyze.breakdown import ns_to_s

SECTION = "tpu_estimate"


def _executions(tl: pd.DataFrame) -> pd.Series:
    """Per module: how many times it ran (distinct run ids; where the trace has none, the most
    frequent op's count)."""
    known = tl[tl["run_id"] != -1].groupby("module")["run_id"].nunique()  # run ids may be negative (int32)
    fallback = tl.groupby(["module", "op"]).size().groupby("module").max()
    return known.reindex(fallback.index).fillna(fallback).astype("int64")


def build_tpu_estimate(timeline: pd.DataFrame, step_count: int, compile_doc: dict) -> dict:
    tl = timeline
    by_module = defaultdict(lambda: {"estimated_s": 0.0, "status": "ok", "errors": []})
    line_tpu = defaultdict(float)
    for m in compile_doc["modules"]:
        entry = by_module[m["name"]]
        if m["status"] != "ok":
            entry["status"] = "failed"
            entry["errors"].append(m["error"])
            continue
        entry["estimated_s"] += m["totals"]["estimated_s"]
        for o in m["ops"]:
            if o["source"]:
                line_tpu[(m["name"], o["source"])] += o["estimated_s"]

    execs = _executions(tl) if len(tl) else pd.Series(dtype="int64")
    cpu_ns = tl.groupby("module")["self_ns"].sum() if len(tl) else pd.Series(dtype="int64")
    in_steps = tl[tl["step"] >= 0]
    step_execs = _executions(in_steps) if len(in_steps) else pd.Series(dtype="int64")

    modules, step_tpu_s = [], 0.0
    for name in sorted(set(by_module) | set(execs.index)):
        est = by_module.get(name)
        n = int(execs.get(name, 0))
        per = est["estimated_s"] if est and est["status"] == "ok" else None
        modules.append({
            "name": name,
            "executions": n,
            "cpu_self_s": ns_to_s(cpu_ns.get(name, 0)),
            "tpu_estimated_s": per,
            "tpu_estimated_total_s": None if per is None else round(per * n, 12),
            "status": "not compiled" if est is None else est["status"],
            "error": "; ".join(est["errors"]) if est and est["errors"] else None,
        })
        if per is not None and step_count:
            step_tpu_s += per * int(step_execs.get(name, 0)) / step_count
    modules.sort(key=lambda r: (-(r["tpu_estimated_total_s"] or 0), r["name"]))

    cpu_lines = tl[tl["source"].notna()].groupby(["module", "source"])["self_ns"].sum() if len(tl) else {}
    lines = []
    for (module, source), tpu_s in line_tpu.items():
        n = int(execs.get(module, 0))
        lines.append({"module": module, "source": source,
                      "cpu_self_s": ns_to_s(cpu_lines.get((module, source), 0)) if len(tl) else 0.0,
                      "tpu_estimated_s": round(tpu_s * max(n, 1), 12)})
    lines.sort(key=lambda r: (-r["tpu_estimated_s"], r["source"]))
    return {
        "target": compile_doc["target"],
        "status": compile_doc["status"],
        "modules": modules,
        "step": {"count": step_count, "tpu_estimated_s": round(step_tpu_s, 12) if step_count else None},
        "lines": lines,
        "note": "TPU times are the TPU compiler's static estimates and roofline floors, not measurements; "
                "loop bodies count once per execution",
    }
