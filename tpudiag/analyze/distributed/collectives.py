"""Cross-process analysis of a multi-process job's traces: timelines aligned, each collective
execution matched across processes and devices, then per collective op its fastest duration,
algorithm and bus bandwidth and waiting; per step the skew and who waited for whom; stragglers;
per process the compute / communication breakdown and how much communication compute hid.

Definitions (docs/distributed.md, after nsys-jax's communication analysis and
HolisticTraceAnalysis):
- An execution of a collective is matched across processes by (module, op, run_id): JAX gives one
  launch of an SPMD program the same run id in every process. Where the trace has no run id, by
  its occurrence number on each device.
- fastest = the shortest device duration of one execution; the others include waiting, so
  wait = duration - fastest. algbw = message bytes / fastest; busbw = algbw x the nccl-tests factor.
- arrival spread = last start - first start; the process that started last is the one the others
  waited for. A straggler arrives last at its step's most skewed collective in most steps.
- hidden communication = collective time with a compute op running on the same device
  (an interval sweep); exposed = the rest.

Pure: takes parsed traces and HLO modules, returns a `DistributedReport`. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analyze.hlo.collectives import CollectiveOp, bus_factor, describe
from tpudiag.results.distributed import (SCHEMA, CollectiveRow, DistributedReport, ProcessSummary, Segment, StepSkew,
                                         Straggler, Waiting)

_NS = 1e-9
# A straggler is last at its step's most skewed collective in more than this share of the steps.
STRAGGLER_SHARE = 0.5
# Below this arrival spread a step has no meaningful last arriver (clock noise, thread wake-up).
MIN_SPREAD_NS = 1_000


@dataclass(frozen=True)
class ProcessTrace:
    """One process's parsed trace and the HLO modules of its dump ({program_id: HloModule})."""

    process_id: int
    trace: object  # parse.xplane.Trace
    modules: dict
    xplane: str | None = None
    run_dir: str | None = None
    exit_code: int | None = None
    status: str | None = None
    reason: str | None = None


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint [start, end) pairs."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.append(run_end[idx[1:] - 1], run_end[-1])


def _covered(us: np.ndarray, ue: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Measure of the union (us, ue) below each x."""
    if len(us) == 0:
        return np.zeros(len(x))
    cum = np.concatenate([[0], np.cumsum(ue - us)])
    i = np.searchsorted(us, x, side="right") - 1
    inside = np.where(i >= 0, np.clip(x - us[np.maximum(i, 0)], 0, (ue - us)[np.maximum(i, 0)]), 0)
    return np.where(i >= 0, cum[np.maximum(i, 0)] + inside, 0)


def _overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Measure of union(a) intersected with union(b)."""
    us, ue = _union(*b)
    s, e = _union(*a)
    return int((_covered(us, ue, e) - _covered(us, ue, s)).sum())


def _collective_meta(procs: list[ProcessTrace]) -> dict[tuple[int, str, str], CollectiveOp | None]:
    out = {}
    for p in procs:
        ops = p.trace.ops
        for pid, module, op in ops[["program_id", "module", "op"]].drop_duplicates().itertuples(index=False):
            key = (p.process_id, module, op)
            if key not in out:
                out[key] = describe(p.modules.get(pid), op)
    return out


def _events(procs: list[ProcessTrace], meta) -> pd.DataFrame:
    """Every op event of every process: process, device, module, op, kind, key, start/end (job clock
    before alignment: epoch ns)."""
    frames = []
    for p in procs:
        o = p.trace.ops
        if o.empty:
            continue
        d = pd.DataFrame({"process": p.process_id, "device": o["device"].to_numpy(), "module": o["module"].to_numpy(),
                          "op": o["op"].to_numpy(), "run_id": o["run_id"].to_numpy(),
                          "start": o["start_ns"].to_numpy() + p.trace.start_time_ns,
                          "duration": o["duration_ns"].to_numpy()})
        frames.append(d)
    if not frames:
        return pd.DataFrame(columns=["process", "device", "module", "op", "run_id", "start", "duration", "coll"])
    ev = pd.concat(frames, ignore_index=True)
    pairs = ev[["process", "module", "op"]].drop_duplicates()
    names = {(r.process, r.module, r.op): (meta.get((r.process, r.module, r.op)).op
                                           if meta.get((r.process, r.module, r.op)) else None)
             for r in pairs.itertuples(index=False)}
    ev["coll"] = [names[k] for k in zip(ev["process"], ev["module"], ev["op"])]
    return ev


def _instances(ev: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, collective execution): an async start and done become one span."""
    c = ev[ev["coll"].notna()].sort_values("start", kind="stable")
    if c.empty:
        return pd.DataFrame(columns=["process", "device", "module", "coll", "key", "start", "end", "busy"])
    # The execution key: the run id where the trace has one (any value but -1, frames.OPS), else
    # the occurrence on the device, in time order (an async start and its done share it).
    occ = c.groupby(["process", "device", "module", "op"]).cumcount()
    c = c.assign(key=np.where(c["run_id"] != -1, c["run_id"].astype(str), "#" + occ.astype(str)))
    c["end"] = c["start"] + c["duration"]
    return (c.groupby(["process", "device", "module", "coll", "key"], sort=False)
            .agg(start=("start", "min"), end=("end", "max"), busy=("duration", "sum")).reset_index())


def _offsets(procs: list[ProcessTrace], inst: pd.DataFrame, align: str) -> tuple[dict[int, int], str, str]:
    """ns to add to each process's timestamps. On one host the clock is shared; across hosts (or
    when asked) the first execution every process ran is aligned on its end, where a collective
    synchronizes."""
    ids = [p.process_id for p in procs]
    hosts = {p.trace.hostname for p in procs}
    if align == "clock" or (align == "auto" and len(hosts) <= 1):
        return {i: 0 for i in ids}, "host clock", ("one host: every process's timestamps come from the same clock"
                                                   if len(hosts) <= 1 else "each host's own clock, as asked")
    if inst.empty:
        return {i: 0 for i in ids}, "host clock", "no collective to align on: each host's own clock"
    per = inst.groupby(["module", "coll", "key", "process"])["end"].max().unstack("process")
    full = per.dropna()
    if full.empty or len(full.columns) < len(ids):
        return {i: 0 for i in ids}, "host clock", "no collective ran on every process: each host's own clock"
    ref = ids[0]
    first = full.loc[full[ref].idxmin()]
    offsets = {i: int(first[ref] - first[i]) if i in first.index else 0 for i in ids}
    return offsets, "first shared collective", (
        f"clocks aligned on the end of the first collective every process ran ({first.name[1]} of {first.name[0]})")


def build_distributed_report(procs: list[ProcessTrace], *, program: str | None = None, status: str = "ok",
                             reason: str | None = None, align: str = "auto", warnings: list[str] | None = None,
                             artifacts: dict | None = None) -> DistributedReport:
    procs = sorted(procs, key=lambda p: p.process_id)
    warnings = list(warnings or [])
    meta = _collective_meta(procs)
    ev = _events(procs, meta)
    inst = _instances(ev)
    offsets, method, note = _offsets(procs, inst, align)
    if not ev.empty:
        ev["start"] = ev["start"] + ev["process"].map(offsets)
    if not inst.empty:
        shift = inst["process"].map(offsets)
        inst["start"] += shift
        inst["end"] += shift
        inst["dur"] = inst["end"] - inst["start"]
    devices_total = int(ev.groupby("process")["device"].nunique().sum()) if not ev.empty else 0
    rows, unmatched, inst = _collective_rows(inst, meta, procs, devices_total)
    steps, waiting, stragglers = _skew(procs, inst, offsets)
    summaries = _process_summaries(procs, ev, inst, offsets)
    step_no, timeline = _step_timeline(procs, ev, inst, offsets)
    comm = sum(s.communication_s for s in summaries)
    hidden = sum(s.hidden_communication_s for s in summaries)
    if unmatched:
        warnings.append(f"{unmatched} collective execution(s) were traced on some processes only (a trace window "
                        "that starts or ends mid-step, or a process that failed): left out of waits and skew")
    backends = {p.trace.backend for p in procs}
    return DistributedReport(
        schema=SCHEMA, status=status, reason=reason, program=program,
        backend=next(iter(backends)) if len(backends) == 1 else "mixed", num_processes=len(procs),
        devices=devices_total, alignment=method, alignment_note=note, processes=tuple(summaries),
        collectives=tuple(rows), steps=tuple(steps), waiting=tuple(waiting), stragglers=tuple(stragglers),
        communication_s=comm, hidden_communication_s=hidden, exposed_communication_s=comm - hidden,
        overlap_ratio=hidden / comm if comm > 0 else None, unmatched_instances=unmatched,
        warnings=tuple(warnings), artifacts=dict(artifacts or {}), timeline_step=step_no, timeline=timeline)


def _step_timeline(procs, ev: pd.DataFrame, inst: pd.DataFrame, offsets) -> tuple[int | None, tuple[Segment, ...]]:
    """Every process's ops in the reference process's median step (by duration), on the job's clock."""
    _, windows = _step_windows(procs, offsets)
    if windows.empty or ev.empty:
        return None, ()
    d = (windows["end"] - windows["start"]).to_numpy()
    k = int(np.argsort(d, kind="stable")[len(d) // 2])
    t0, t1 = int(windows["start"].iloc[k]), int(windows["end"].iloc[k])
    e = ev[(ev["start"] >= t0) & (ev["start"] < t1)]
    waits = {}
    if not inst.empty and "wait" in inst:
        waits = {(r.process, r.device, r.module, r.coll, r.start): r.wait
                 for r in inst.itertuples(index=False)}
    segs = []
    for r in e.itertuples(index=False):
        lane = f"p{r.process} {r.device}"
        start, dur = (r.start - t0) * _NS, r.duration * _NS
        if r.coll is None or (isinstance(r.coll, float) and np.isnan(r.coll)):
            segs.append(Segment(lane, r.op, r.module, "compute", start, dur))
            continue
        w = waits.get((r.process, r.device, r.module, r.coll, r.start), 0) * _NS
        w = min(w, dur)
        if w > 0:
            segs.append(Segment(lane, r.op, r.module, "waiting", start, w))
        segs.append(Segment(lane, r.op, r.module, "collective", start + w, dur - w))
    return int(windows["step"].iloc[k]), tuple(segs)


def _collective_rows(inst: pd.DataFrame, meta, procs, devices_total: int):
    if inst.empty:
        return [], 0, inst
    # Complete: as many devices as its replica group has (a group inside one process is complete
    # there), or where the HLO is unknown as many as any execution of the op had.
    inst["dev_id"] = inst["process"].astype(str) + "/" + inst["device"].astype(str)
    inst["n_dev"] = inst.groupby(["module", "coll", "key"])["dev_id"].transform("nunique")
    group = {(module, m.op): m.group_size for (_, module, _), m in meta.items() if m is not None and m.group_size}
    most = inst.groupby(["module", "coll"])["n_dev"].transform("max")
    expected = [min(group.get((mo, co), n), n) for mo, co, n in zip(inst["module"], inst["coll"], most)]
    complete = inst["n_dev"] >= np.asarray(expected)
    unmatched = int(inst.loc[~complete, ["module", "coll", "key"]].drop_duplicates().shape[0])
    inst = inst[complete].copy()
    g = inst.groupby(["module", "coll", "key"])
    inst["fastest"] = g["dur"].transform("min")
    inst["wait"] = inst["dur"] - inst["fastest"]
    inst["first_start"] = g["start"].transform("min")
    inst["spread"] = g["start"].transform("max") - inst["first_start"]
    by_meta = {}
    for (pid, module, op), m in meta.items():
        if m is not None:
            by_meta.setdefault((module, m.op), m)
    rows = []
    for (module, coll), d in inst.groupby(["module", "coll"], sort=False):
        m = by_meta.get((module, coll))
        per_exec = d.groupby("key").agg(fastest=("fastest", "first"), dur=("dur", "median"),
                                        spread=("spread", "first"))
        fastest = float(per_exec["fastest"].median()) * _NS
        n = m.group_size if m and m.group_size else devices_total
        nbytes = m.message_bytes if m else None
        algbw = nbytes / fastest if nbytes and fastest > 0 else None
        rows.append(CollectiveRow(
            kind=m.kind if m else "?", module=module, op=coll, source=m.source if m else None, message_bytes=nbytes,
            replica_groups=m.replica_groups if m else None, group_size=int(n), instances=len(per_exec),
            devices=int(d["device"].nunique() if d["process"].nunique() == 1 else
                        d.groupby("process")["device"].nunique().sum()),
            duration_s=float(per_exec["dur"].median()) * _NS, fastest_s=fastest, algbw_bytes_per_s=algbw,
            busbw_bytes_per_s=algbw * bus_factor(m.kind, int(n)) if algbw and m else None,
            wait_s=float(d["wait"].sum()) * _NS, arrival_spread_s=float(per_exec["spread"].median()) * _NS,
            per_process_s={f"p{p}": float(x) * _NS for p, x in d.groupby("process")["dur"].median().items()}))
    rows.sort(key=lambda r: -(r.duration_s * r.instances))
    return rows, unmatched, inst


def _step_windows(procs: list[ProcessTrace], offsets) -> tuple[int | None, pd.DataFrame]:
    """The reference process's steps (the lowest process id that has step annotations), job clock."""
    for p in procs:
        s = p.trace.steps
        if not s.empty:
            s = s.sort_values("start_ns")
            start = s["start_ns"].to_numpy() + p.trace.start_time_ns + offsets[p.process_id]
            return p.process_id, pd.DataFrame({"step": s["step_num"].to_numpy(), "start": start,
                                               "end": start + s["duration_ns"].to_numpy()})
    return None, pd.DataFrame(columns=["step", "start", "end"])


def _skew(procs, inst: pd.DataFrame, offsets):
    if inst.empty:
        return [], [], []
    ref, windows = _step_windows(procs, offsets)
    execs = inst.groupby(["module", "coll", "key"]).agg(first_start=("first_start", "first"),
                                                       spread=("spread", "first"),
                                                       fastest=("fastest", "first")).reset_index()
    # The process that started last: the one the others waited for.
    last = inst.loc[inst.groupby(["module", "coll", "key"])["start"].idxmax(), ["module", "coll", "key", "process"]]
    execs = execs.merge(last.rename(columns={"process": "last"}), on=["module", "coll", "key"])
    if windows.empty:
        execs["step"] = -1
    else:
        # An execution belongs to the reference process's step in which that process started it
        # (up to the next step's start: the gap between steps is the step's tail).
        own = inst[inst["process"] == ref].groupby(["module", "coll", "key"])["start"].min().rename("ref_start")
        execs = execs.merge(own.reset_index(), on=["module", "coll", "key"], how="left")
        at = execs["ref_start"].fillna(execs["first_start"]).to_numpy()
        starts, ends = windows["start"].to_numpy(), windows["end"].to_numpy()
        i = np.searchsorted(starts, at, side="right") - 1
        j = np.maximum(i, 0)
        inside = (i >= 0) & ((i < len(starts) - 1) | (at < ends[j]))
        execs["step"] = np.where(inside, windows["step"].to_numpy()[j], -2)
        execs = execs[execs["step"] != -2]
    # A process's waiting at one execution: the mean over its devices.
    pw = (inst.groupby(["module", "coll", "key", "process"])["wait"].mean().rename("wait").reset_index()
          .merge(execs[["module", "coll", "key", "step", "last", "spread"]], on=["module", "coll", "key"]))
    steps, last_counts, lags, caused = [], {}, {}, {}
    for step, d in execs.groupby("step", sort=True):
        top = d.loc[d["spread"].idxmax()]
        lp = int(top["last"]) if top["spread"] >= MIN_SPREAD_NS else None
        if lp is not None:
            last_counts[lp] = last_counts.get(lp, 0) + 1
            lags.setdefault(lp, []).append(float(top["spread"]))
        w = pw[pw["step"] == step].groupby("process")["wait"].sum()
        steps.append(StepSkew(step=None if step == -1 else int(step), collectives=len(d),
                              communication_s=float(d["fastest"].sum()) * _NS,
                              max_spread_s=float(top["spread"]) * _NS, last_process=lp,
                              op=str(top["coll"]), wait_s={f"p{p}": float(x) * _NS for p, x in w.items()}))
    pairs = pw[(pw["process"] != pw["last"]) & (pw["spread"] >= MIN_SPREAD_NS)]
    waiting = [Waiting(waiter=int(a), waited_for=int(b), wait_s=float(d["wait"].sum()) * _NS, instances=len(d))
               for (a, b), d in pairs.groupby(["process", "last"])]
    waiting.sort(key=lambda w: -w.wait_s)
    for w in waiting:
        caused[w.waited_for] = caused.get(w.waited_for, 0.0) + w.wait_s
    n_steps = len(steps)
    stragglers = [Straggler(process_id=p, steps_last=k, steps=n_steps, mean_lag_s=float(np.mean(lags[p])) * _NS,
                            caused_wait_s=caused.get(p, 0.0))
                  for p, k in sorted(last_counts.items(), key=lambda kv: -kv[1])
                  if len(procs) > 1 and k > STRAGGLER_SHARE * n_steps]
    return steps, waiting, stragglers


def _process_summaries(procs, ev: pd.DataFrame, inst: pd.DataFrame, offsets) -> list[ProcessSummary]:
    out = []
    for p in procs:
        e = ev[ev["process"] == p.process_id] if not ev.empty else ev
        c = inst[inst["process"] == p.process_id] if not inst.empty else inst
        devs = sorted(e["device"].unique().tolist()) if not e.empty else []
        busy = compute = comm = hidden = wait = 0
        for dev in devs:
            de = e[e["device"] == dev]
            s, en = de["start"].to_numpy(), (de["start"] + de["duration"]).to_numpy()
            us, ue = _union(s, en)
            busy += int((ue - us).sum())
            cmask = de["coll"].isna().to_numpy()
            cs, ce = _union(s[cmask], en[cmask])
            compute += int((ce - cs).sum())
            dc = c[c["device"] == dev] if not c.empty else c
            if not dc.empty:
                ms, me = _union(dc["start"].to_numpy(), dc["end"].to_numpy())
                comm += int((me - ms).sum())
                hidden += _overlap((ms, me), (cs, ce))
                wait += int(dc["wait"].sum()) if "wait" in dc else 0
        k = max(1, len(devs))
        st = p.trace.steps
        out.append(ProcessSummary(
            process_id=p.process_id, host=p.trace.hostname, xplane=p.xplane, devices=tuple(devs),
            exit_code=p.exit_code, status=p.status, reason=p.reason, run_dir=p.run_dir,
            offset_s=offsets[p.process_id] * _NS, steps=len(st),
            step_time_s=float(st["duration_ns"].median()) * _NS if len(st) else None,
            busy_s=busy / k * _NS, compute_s=compute / k * _NS, communication_s=comm / k * _NS,
            hidden_communication_s=hidden / k * _NS, exposed_communication_s=(comm - hidden) / k * _NS,
            wait_s=wait / k * _NS, overlap_ratio=hidden / comm if comm else None))
    return out
