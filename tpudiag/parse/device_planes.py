"""Reads the TPU device planes of an XSpace trace the way XProf reads them.

A TPU trace keeps, per device plane `/device:TPU:N`:
- `XLA Ops`: one event per executed HLO op. The event's metadata holds the op's HLO text as its
  name, the HLO instruction name as `display_name`, and stats: `program_id` (the program's
  fingerprint), `hlo_category`, `flops`, `bytes_accessed`, `memory_access_breakdown`, `source`.
- `XLA Modules`: one event per program execution, named `jit_f(<fingerprint>)`, with its `run_id`.
- `Async XLA Ops`: copy-start/done, collectives and host transfers, from start to done.
- `Steps`: the device's step markers.
- `TC Overlay`, `Scalar Unit`, `_counters_`: read by no report here (known, not warned about).
`/host:metadata` stores each program's HLO proto; its head gives the program's module name and
unique id, the NNNN of the HLO dump's `module_NNNN.*` files. Ops are keyed by that id
(`program_id`), as CPU thunks are, so both join the same dump.

Event times are `line.timestamp_ns` + `offset_ps`, returned in ns on the same clock jaxlib's reader
gives the host plane. Start and end are each floored to the ns, so an op that starts where the last
ended in ps does not overlap it in ns (rounding durations instead makes 1-ns overlaps that read as
nesting and corrupt self time). Returns a `DevicePlanes` of checked frames; computes no breakdown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tpudiag.errors import InputError, ParseError
from tpudiag.parse import frames
from tpudiag.parse.xspace_proto import message_class

TPU_PLANE = re.compile(r"^/device:TPU:(\d+)$")
# Device lines this reader owns, and those it knows and leaves alone.
OWNED_LINES = ("XLA Ops", "XLA Modules", "Async XLA Ops", "Steps")
KNOWN_LINES = (*OWNED_LINES, "TC Overlay", "Scalar Unit", "_counters_")
_MODULE_NAME = re.compile(r"^(?P<name>.+?)\((?P<fp>\d+)\)$")  # "jit_f(3836019466306235917)"
_HLO_NAME = re.compile(r"^%?(?P<name>[^\s=]+)")  # "%fusion.3 = f32[...] fusion(...)" -> "fusion.3"
# memory_access_breakdown (XProf's MemoryAccessBreakdown): memory space 1 is HBM
# (MEMORY_SPACE_HBM in op_metrics.proto), 3 the on-chip VMEM; operation 1 reads, 2 writes. On v5e
# traces XProf's bound_by follows these four figures (tests/test_tpu_runs.py checks it).
_HBM, _VMEM, _READ, _WRITE = 1, 3, 1, 2


@dataclass(frozen=True)
class ChipPeaks:
    """What the trace says of the chip it ran on (the device plane's own stats)."""

    device_type: str  # "TPU v5 Lite"
    peak_flops_per_s: float
    hbm_bytes_per_s: float
    vmem_read_bytes_per_s: float | None
    vmem_write_bytes_per_s: float | None


@dataclass(frozen=True)
class Program:
    fingerprint: int
    module: str
    module_id: int  # -1 where the trace stores no HLO proto for it


@dataclass(frozen=True)
class DevicePlanes:
    ops: pd.DataFrame  # frames.OPS, line "XLA Ops"
    async_ops: pd.DataFrame  # frames.ASYNC_OPS
    module_runs: pd.DataFrame  # frames.MODULE_RUNS
    steps: pd.DataFrame  # frames.STEPS, from the first device's "Steps" line
    op_meta: pd.DataFrame  # frames.DEVICE_OP_META
    programs: tuple[Program, ...]
    chip: ChipPeaks | None
    devices: tuple[str, ...]
    unknown_lines: tuple[str, ...]  # device lines with events that no reader here knows
    max_end_ns: int


def _stat_value(stat):
    kind = stat.WhichOneof("value")
    return None if kind is None else getattr(stat, kind)


def _stats(items, names: dict[int, str]) -> dict:
    return {names.get(s.metadata_id, ""): _stat_value(s) for s in items}


def _memory_bytes(raw: bytes | None) -> tuple[int, int, int]:
    """(HBM bytes, VMEM bytes read, VMEM bytes written) of one execution; -1 each where unknown."""
    if raw is None:
        return -1, -1, -1
    try:
        from xprof.protobuf.op_metrics_pb2 import MemoryAccessBreakdown

        accessed = MemoryAccessBreakdown.FromString(raw).memory_accessed
    except Exception:  # no XProf, or a newer XProf's encoding: the figures are unknown, the op still reads
        return -1, -1, -1

    def total(space: int, ops: tuple[int, ...]) -> int:
        return int(sum(m.bytes_accessed for m in accessed if m.memory_space == space and m.operation_type in ops))

    return total(_HBM, (_READ, _WRITE)), total(_VMEM, (_READ,)), total(_VMEM, (_WRITE,))


def _programs(space, names_of) -> dict[int, Program]:
    head_cls = message_class("HloProtoHead")
    out: dict[int, Program] = {}
    meta = next((p for p in space.planes if p.name == "/host:metadata"), None)
    if meta is None:
        return out
    names = names_of(meta)
    for md in meta.event_metadata.values():
        stats = _stats(md.stats, names)
        fp = stats.get("program_id")
        if fp is None:
            continue
        module, module_id = (_MODULE_NAME.match(md.name).group("name") if _MODULE_NAME.match(md.name) else md.name), -1
        proto = stats.get("Hlo Proto")
        if isinstance(proto, bytes) and proto:
            try:
                head = head_cls.FromString(proto).hlo_module
                module, module_id = head.name or module, int(head.id)
            except Exception:
                pass  # an HLO proto this head cannot read: the module keeps its event name, no dump join
        out[int(fp)] = Program(int(fp), module, module_id)
    return out


def _chip(stats: dict) -> ChipPeaks | None:
    def gb(key: str) -> float | None:
        v = stats.get(key)
        return float(v) * 1e9 if isinstance(v, (int, float)) and v > 0 else None

    try:
        return ChipPeaks(device_type=str(stats.get("device_type_string") or "TPU"),
                         peak_flops_per_s=float(stats["peak_teraflops_per_second"]) * 1e12,
                         hbm_bytes_per_s=float(stats["peak_hbm_bw_gigabytes_per_second"]) * 1e9,
                         vmem_read_bytes_per_s=gb("peak_vmem_rd_bw_gigabytes_per_second"),
                         vmem_write_bytes_per_s=gb("peak_vmem_wr_bw_gigabytes_per_second"))
    except (KeyError, TypeError, ValueError):
        return None


def _span(base_ps: int, ev) -> tuple[int, int]:
    """(start ns, duration ns) of an event on a line whose timestamp is `base_ps`."""
    start = (base_ps + ev.offset_ps) // 1000
    return start, (base_ps + ev.offset_ps + ev.duration_ps) // 1000 - start


def read_device_planes(path: Path, data: bytes) -> DevicePlanes | None:
    """The TPU device planes of one trace file's bytes, or None when it has no `/device:TPU:N` plane."""
    try:
        space = message_class("XSpace").FromString(data)
    except Exception as e:
        raise ParseError(path, f"corrupt or truncated XSpace protobuf ({e})") from None
    planes = sorted((p for p in space.planes if TPU_PLANE.match(p.name)),
                    key=lambda p: int(TPU_PLANE.match(p.name).group(1)))
    if not planes:
        return None

    def names_of(plane) -> dict[int, str]:
        return {k: v.name for k, v in plane.stat_metadata.items()}

    ran = [p.name for p in planes if any(len(ln.events) for ln in p.lines if ln.name in ("XLA Modules", "Steps"))]
    if ran and not any(ln.name == "XLA Ops" for p in planes for ln in p.lines):
        raise InputError(f"{path}: {ran[0]} ran programs but has no 'XLA Ops' line, so no op can be timed "
                         "(a trace cut down, or written by a profiler tpudiag does not know)")
    programs = _programs(space, names_of)
    module_id = {fp: p.module_id for fp, p in programs.items()}
    ops = {c: [] for c in frames.OPS}
    asyncs = {c: [] for c in frames.ASYNC_OPS}
    runs = {c: [] for c in frames.MODULE_RUNS}
    steps = {c: [] for c in frames.STEPS}
    meta_rows: dict[tuple[int, str], tuple] = {}
    unknown: set[str] = set()
    max_end = 0
    chip = None
    for plane in planes:
        names = names_of(plane)
        chip = chip or _chip(_stats(plane.stats, names))
        device = plane.name
        op_of: dict[int, tuple[str, int, str]] = {}  # metadata id -> (op, program_id, module)
        for mid, md in plane.event_metadata.items():
            stats = _stats(md.stats, names)
            fp = stats.get("program_id")
            m = _HLO_NAME.match(md.name)
            op = md.display_name or (m.group("name") if m else md.name)
            prog = programs.get(int(fp)) if fp is not None else None
            pid = prog.module_id if prog else -1
            op_of[mid] = (op, pid, prog.module if prog else "")
            if fp is not None and (pid, op) not in meta_rows:
                meta_rows[(pid, op)] = (stats.get("hlo_category"), int(stats.get("flops") or 0),
                                        int(stats.get("bytes_accessed") or 0),
                                        *_memory_bytes(stats.get("memory_access_breakdown")),
                                        stats.get("source") or None)
        lines = {ln.name: ln for ln in plane.lines}
        unknown |= {n for n, ln in lines.items() if n not in KNOWN_LINES and len(ln.events)}
        module_line = lines.get("XLA Modules")
        run_starts, run_ends, run_ids = [], [], []
        if module_line is not None:
            base = module_line.timestamp_ns * 1000
            for ev in module_line.events:
                start, dur = _span(base, ev)
                md = plane.event_metadata.get(ev.metadata_id)
                name = md.name if md is not None else ""
                mm = _MODULE_NAME.match(name)
                fp = int(mm.group("fp")) if mm else None
                prog = programs.get(fp) if fp is not None else None
                run_id = _stats(ev.stats, names).get("run_id")
                run_id = int(run_id) if run_id is not None else -1
                runs["device"].append(device)
                runs["module"].append(prog.module if prog else (mm.group("name") if mm else name))
                runs["program_id"].append(prog.module_id if prog else -1)
                runs["run_id"].append(run_id)
                runs["start_ns"].append(start)
                runs["duration_ns"].append(dur)
                run_starts.append(start)
                run_ends.append(start + dur)
                run_ids.append(run_id)
                max_end = max(max_end, start + dur)
        order = np.argsort(run_starts, kind="stable")
        run_starts = np.asarray(run_starts, dtype=np.int64)[order]
        run_ends = np.asarray(run_ends, dtype=np.int64)[order]
        run_ids = np.asarray(run_ids, dtype=np.int64)[order]
        op_line = lines.get("XLA Ops")
        if op_line is not None:
            base = op_line.timestamp_ns * 1000
            starts = []
            for ev in op_line.events:
                op, pid, module = op_of.get(ev.metadata_id, ("", -1, ""))
                start, dur = _span(base, ev)
                ops["device"].append(device)
                ops["line"].append("XLA Ops")
                ops["module"].append(module)
                ops["program_id"].append(pid)
                ops["op"].append(op)
                ops["start_ns"].append(start)
                ops["duration_ns"].append(dur)
                starts.append(start)
                max_end = max(max_end, start + dur)
            # run_id: the execution of the program whose span holds the op.
            s = np.asarray(starts, dtype=np.int64)
            i = np.searchsorted(run_starts, s, side="right") - 1
            ok = (i >= 0) & (s < run_ends[np.clip(i, 0, None)]) if len(run_starts) else np.zeros(len(s), bool)
            ops["run_id"] += np.where(ok, run_ids[np.clip(i, 0, None)] if len(run_ids) else -1, -1).tolist()
        async_line = lines.get("Async XLA Ops")
        if async_line is not None:
            base = async_line.timestamp_ns * 1000
            for ev in async_line.events:
                op, pid, module = op_of.get(ev.metadata_id, ("", -1, ""))
                done = _stats(ev.stats, names).get("hlo_op")
                start, dur = _span(base, ev)
                asyncs["device"].append(device)
                asyncs["module"].append(module)
                asyncs["program_id"].append(pid)
                asyncs["op"].append(str(done or op))
                asyncs["start_ns"].append(start)
                asyncs["duration_ns"].append(dur)
        step_line = lines.get("Steps")
        if step_line is not None and plane is planes[0]:
            base = step_line.timestamp_ns * 1000
            for ev in step_line.events:
                md = plane.event_metadata.get(ev.metadata_id)
                try:
                    num = int(md.name) if md is not None else -1
                except ValueError:
                    num = -1
                steps["name"].append(f"{device} step")
                steps["step_num"].append(num)
                start, dur = _span(base, ev)
                steps["start_ns"].append(start)
                steps["duration_ns"].append(dur)
    meta = {c: [] for c in frames.DEVICE_OP_META}
    for (pid, op), row in meta_rows.items():
        for col, v in zip(frames.DEVICE_OP_META, (pid, op, *row)):
            meta[col].append(v)
    return DevicePlanes(
        ops=frames.from_rows(ops, frames.OPS, "device ops"),
        async_ops=frames.from_rows(asyncs, frames.ASYNC_OPS, "async ops"),
        module_runs=frames.from_rows(runs, frames.MODULE_RUNS, "module runs"),
        steps=frames.from_rows(steps, frames.STEPS, "device steps"),
        op_meta=frames.from_rows(meta, frames.DEVICE_OP_META, "device op metadata"),
        programs=tuple(sorted(programs.values(), key=lambda p: p.module_id)), chip=chip,
        devices=tuple(p.name for p in planes), unknown_lines=tuple(sorted(unknown)), max_end_ns=int(max_end))
