"""What a TPU did with its time, from its device planes: each op's measured bound, and device time
inside and outside the program's steps.

Input: the op timeline (`timeline.build_timeline`), its per-op aggregate (`timeline.aggregate_ops`),
the trace's steps and the `DevicePlanes` of `parse/device_planes.py`. Output: per op a measured
`OpRate`, the timeline with each compute-or-memory op's `bound` taken from its rates, and the
`DeviceTime` section of the report. No I/O.

An op's bound is decided as XProf decides its `bound_by`: each execution's FLOPs, HBM bytes and
VMEM bytes read and written, over its measured self time, as a fraction of the chip's peak for
each (the peaks the trace itself records); the largest fraction names the bound. Collectives, host
transfers and control flow keep the class their HLO opcode gives them.

Device busy time is the sum of op self time (XProf's device time). Inside the steps, step time
minus busy time is idle: the device waiting on the host. Time outside the steps is setup, compile
and shutdown. Async XLA Ops (copies, collectives, host transfers running beside the ops) are
counted once, as the union of their spans, and reported with how much of that overlapped busy time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpudiag.analyze.profile.breakdown import ns_to_s
from tpudiag.results.profile import DeviceStep, DeviceStepTime, DeviceTime, OpRate

# bound_by -> breakdown class
BOUND_CLASS = {"compute": "compute", "hbm": "memory", "vmem_read": "memory", "vmem_write": "memory"}
# Classes a measured rate may replace: what the HLO opcode alone cannot decide.
_MEASURABLE = ("compute", "memory")


def op_rates(agg: pd.DataFrame, op_meta: pd.DataFrame, chip) -> dict[tuple[int, str], OpRate]:
    """{(program_id, op): OpRate} for the ops the trace records costs of and that took time."""
    if chip is None or agg.empty or op_meta.empty:
        return {}
    meta = op_meta.set_index(["program_id", "op"])
    peaks = {"compute": chip.peak_flops_per_s, "hbm": chip.hbm_bytes_per_s,
             "vmem_read": chip.vmem_read_bytes_per_s, "vmem_write": chip.vmem_write_bytes_per_s}
    out = {}
    for pid, op, self_ns, n in zip(agg["program_id"], agg["op"], agg["self_ns"], agg["occurrences"]):
        key = (int(pid), op)
        if key not in meta.index or self_ns <= 0:
            continue
        m = meta.loc[key]
        s = self_ns * 1e-9
        work = {"compute": m["flops"], "hbm": m["hbm_bytes"], "vmem_read": m["vmem_read_bytes"],
                "vmem_write": m["vmem_write_bytes"]}
        util = {k: float(v) * n / s / peaks[k] for k, v in work.items() if v >= 0 and peaks[k]}
        bound = max(util, key=util.get) if util and max(util.values()) > 0 else None
        out[key] = OpRate(bound_by=bound, flops_per_s=round(float(m["flops"]) * n / s, 3),
                          hbm_bytes_per_s=round(float(m["hbm_bytes"]) * n / s, 3) if m["hbm_bytes"] >= 0 else None,
                          compute_util=round(util.get("compute", 0.0), 6),
                          memory_util=round(max((v for k, v in util.items() if k != "compute"), default=0.0), 6))
    return out


def apply_rates(timeline: pd.DataFrame, rates: dict[tuple[int, str], OpRate]) -> pd.DataFrame:
    """The timeline with each compute-or-memory op's `bound` from its measured rate."""
    if not rates or timeline.empty:
        return timeline
    cls = {k: BOUND_CLASS[r.bound_by] for k, r in rates.items() if r.bound_by}
    new = [cls.get((int(p), o), b) if b in _MEASURABLE else b
           for p, o, b in zip(timeline["program_id"], timeline["op"], timeline["bound"])]
    return timeline.assign(bound=pd.Series(new, index=timeline.index, dtype="object"))


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the same instants."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.concatenate(([True], s[1:] > reach[:-1]))
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _covered(us: np.ndarray, ue: np.ndarray, a: np.ndarray, b: np.ndarray) -> int:
    """How much of the disjoint intervals [a, b) the disjoint sorted union (us, ue) covers."""
    if not len(us) or not len(a):
        return 0
    lengths = ue - us
    cum = np.concatenate(([0], np.cumsum(lengths)))

    def upto(x: np.ndarray) -> np.ndarray:  # covered length of (-inf, x)
        i = np.searchsorted(us, x, side="right")  # intervals starting at or before x
        j = np.maximum(i - 1, 0)
        return np.where(i > 0, cum[j] + np.clip(x - us[j], 0, lengths[j]), 0)

    return int((upto(b) - upto(a)).sum())


def _device_class(timeline: pd.DataFrame, rates: dict) -> pd.Series:
    """Each op instance's class in the device section: its measured bound; else the class its opcode
    decides (communication, host, control); else `unknown`: an op whose trace records no FLOPs or
    bytes (a custom call with no cost estimate), which XProf too leaves unbounded."""
    out = []
    for p, o, b in zip(timeline["program_id"], timeline["op"], timeline["bound"]):
        r = rates.get((int(p), o))
        if r is not None and r.bound_by:
            out.append(BOUND_CLASS[r.bound_by])
        elif b in _MEASURABLE:
            out.append("unknown")
        else:
            out.append(b)
    return pd.Series(out, index=timeline.index, dtype="object")


def _by_class(sel: pd.DataFrame) -> dict[str, int]:
    ns = sel.groupby("device_class")["self_ns"].sum().to_dict() if len(sel) else {}
    return {"compute": int(ns.get("compute", 0) + ns.get("control", 0)), "memory": int(ns.get("memory", 0)),
            "communication": int(ns.get("communication", 0)), "host": int(ns.get("host", 0)),
            "unknown": int(ns.get("unknown", 0))}


def _step(sel: pd.DataFrame, step_ns: int, step_num: int | None) -> DeviceStep:
    cls = _by_class(sel)
    busy = int(sel["self_ns"].sum())
    return DeviceStep(step_num=step_num, step_s=ns_to_s(step_ns), busy_s=ns_to_s(busy),
                      compute_s=ns_to_s(cls["compute"]), memory_s=ns_to_s(cls["memory"]),
                      communication_s=ns_to_s(cls["communication"]), host_s=ns_to_s(cls["host"]),
                      unknown_s=ns_to_s(cls["unknown"]), idle_s=ns_to_s(max(step_ns - busy, 0)))


def device_time(timeline: pd.DataFrame, steps: pd.DataFrame, planes, window_ns: int,
                rates: dict[tuple[int, str], OpRate]) -> DeviceTime:
    """The `device` section: busy time by class over the whole trace and inside the steps, idle inside
    the steps, time outside them, and the async ops' time and overlap."""
    tl = timeline.assign(device_class=_device_class(timeline, rates)) if len(timeline) else \
        timeline.assign(device_class=pd.Series(dtype="object"))
    busy = int(tl["self_ns"].sum()) if len(tl) else 0
    whole = _by_class(tl)
    in_steps = None
    outside = None
    if len(steps):
        durations = steps.groupby("step_num")["duration_ns"].sum().sort_index()
        sel = tl[tl["step"] >= 0]
        # The median step by duration, the shorter of the two middle ones (as `report --html` picks it).
        order = sorted(durations.items(), key=lambda kv: (kv[1], kv[0]))
        median_num = int(order[(len(order) - 1) // 2][0])
        in_steps = DeviceStepTime(steps=int(len(durations)),
                                  median=_step(sel[sel["step"] == median_num], int(durations[median_num]), median_num),
                                  total=_step(sel, int(durations.sum()), None))
        outside = ns_to_s(max(window_ns - int(durations.sum()), 0))
    # Async ops: their union, and the part of it during which an op ran (the busy union).
    a = planes.async_ops
    a_s, a_e = _union(a["start_ns"].to_numpy(np.int64), (a["start_ns"] + a["duration_ns"]).to_numpy(np.int64))
    b_s, b_e = _union(tl["start_ns"].to_numpy(np.int64), (tl["start_ns"] + tl["duration_ns"]).to_numpy(np.int64)) \
        if len(tl) else (np.array([], np.int64), np.array([], np.int64))
    chip = planes.chip
    return DeviceTime(
        chip=chip.device_type if chip else None,
        peak_flops_per_s=chip.peak_flops_per_s if chip else None,
        hbm_bytes_per_s=chip.hbm_bytes_per_s if chip else None,
        busy_s=ns_to_s(busy), compute_s=ns_to_s(whole["compute"]), memory_s=ns_to_s(whole["memory"]),
        communication_s=ns_to_s(whole["communication"]), host_s=ns_to_s(whole["host"]),
        unknown_s=ns_to_s(whole["unknown"]), in_steps=in_steps, outside_steps_s=outside,
        outside_steps_busy_s=ns_to_s(busy - int(tl.loc[tl["step"] >= 0, "self_ns"].sum())) if in_steps else None,
        async_s=ns_to_s(int((a_e - a_s).sum())), async_overlapped_s=ns_to_s(_covered(b_s, b_e, a_s, a_e)),
        unknown_lines=tuple(planes.unknown_lines))
