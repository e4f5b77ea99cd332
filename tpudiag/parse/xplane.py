"""Reads an XProf `*.xplane.pb` into checked DataFrames: op instances, steps, host activity.

Two walks share one pass over the planes:
- CPU (`/host:CPU`): each executed HLO thunk is an event named after its HLO instruction, with
  `hlo_op`, `hlo_module` and `program_id` stats, on the XLA client threads.
- TPU devices (`/device:TPU:N`): read by `parse/device_planes.py` from the protobuf itself (op
  names, programs and costs live in event metadata that jaxlib's reader does not show); the
  result rides on `Trace.device`.
- GPU devices (`/device:GPU:N`): op events sit on the line named "XLA Ops", steps on "Steps".
When device planes exist the backend is that device and the CPU thunk walk is skipped.
Host events that are not op instances or step annotations become the HOST frame (host activity),
except compilation work (compiler threads and compile TraceMes), which becomes `Trace.compile`.
Times are returned relative to the trace start (`profile_start_time`), in ns.

It does not join HLO, classify ops or compute any breakdown (that is `analyze/`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from tpudiag.errors import InputError, ParseError
from tpudiag.parse import frames

if TYPE_CHECKING:
    from tpudiag.parse.device_planes import DevicePlanes

_DEVICE_PLANE = re.compile(r"^/device:(TPU|GPU):(\d+)$")
_MODULE_EVENT = re.compile(r"^(?P<name>.+?)\((?P<id>\d+)\)$")  # "jit_f(12)" on "XLA Modules"
# Host TraceMe names that are profiler bookkeeping or mark an op's end, not host work.
_SKIP_PREFIXES = ("ThreadpoolListener::", "end: ")
# Reading an event's stats costs ~2.4 us (about half of a 400k-event report). HLO instruction
# names never contain these characters, TraceMe names of host work usually do, so those events
# cannot be op instances or step annotations and skip the stats.
_NOT_HLO_NAME = re.compile(r"::|[()$]")
# The host's launch of one program execution ("CommonPjRtLoadedExecutable::Execute (jit_f)"): the
# k-th launch of a program is the device's k-th execution of it (their run ids are not the same
# numbers), which ties device work to the step that launched it.
_LAUNCH = re.compile(r"LoadedExecutable::Execute \((?P<module>[^()]+)\)$")
# Host activity that is compilation: XLA's compiler threads (`tf_PjRtCompilerThreadPool`,
# `tf_xla-cpu-codegen`) and compile TraceMes on any thread (`backend_compile_and_load`,
# `PjRtCpuClient::Compile`, `...Compiler::...`). Counted as compile even without jax.monitoring data.
_COMPILE_LINE_MARKERS = ("Compiler", "codegen")
_COMPILE_NAME_MARKERS = ("ompile",)


@dataclass(frozen=True)
class Trace:
    """One host's trace. `ops`, `steps`, `host` follow the schemas in `frames`."""

    path: str
    hostname: str
    backend: str  # "cpu" | "tpu" | "gpu"
    start_time_ns: int  # epoch ns of the trace window start (profile_start_time)
    window_ns: int  # length of the trace window
    ops: pd.DataFrame
    steps: pd.DataFrame
    host: pd.DataFrame
    compile: pd.DataFrame  # HOST schema: host events that are compilation
    devices: tuple[str, ...]
    jax_version: str | None
    device: "DevicePlanes | None" = None  # TPU traces: async ops, module runs, op costs, programs, chip peaks
    launches: pd.DataFrame | None = None  # frames.LAUNCHES: the host's program launches


def _load(path: Path):
    # jaxlib's reader alone: importing jax.profiler would import all of jax (~1.4 s of a ~2 s report).
    from jaxlib._profile_data import ProfileData

    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise ParseError(path, "empty file (0 bytes): not an XSpace trace")
    data = path.read_bytes()
    try:
        return ProfileData.from_serialized_xspace(data), data
    except RuntimeError as e:
        raise ParseError(path, f"corrupt or truncated XSpace protobuf ({e})") from None


def read_xplane(path: Path) -> Trace:
    from tpudiag.parse.device_planes import read_device_planes

    path = Path(path)
    data, raw = _load(path)
    planes = list(data.planes)
    if not planes:
        raise ParseError(path, "XSpace has no planes: not a profiler trace")
    env = next((p for p in planes if p.name == "Task Environment"), None)
    env_stats = dict(env.stats) if env is not None else {}
    meta = next((p for p in planes if p.name == "/host:metadata"), None)
    meta_stats = dict(meta.stats) if meta is not None else {}
    start = int(env_stats.get("profile_start_time", 0) or 0)
    stop = int(env_stats.get("profile_stop_time", 0) or 0)

    ops = {c: [] for c in frames.OPS}
    steps = {c: [] for c in frames.STEPS}
    device_steps = {c: [] for c in frames.STEPS}
    host = {c: [] for c in frames.HOST}
    compile_ = {c: [] for c in frames.HOST}
    launches = {c: [] for c in frames.LAUNCHES}
    device_planes = [p for p in planes if _DEVICE_PLANE.match(p.name)]
    backend = _DEVICE_PLANE.match(device_planes[0].name).group(1).lower() if device_planes else "cpu"
    tpu = read_device_planes(path, raw) if backend == "tpu" else None
    max_end = tpu.max_end_ns if tpu else 0

    for plane in planes:
        is_device = plane in device_planes
        is_host = plane.name == "/host:CPU"
        if not (is_device or is_host):
            continue
        if is_device and tpu is not None:
            continue  # read from the protobuf above
        for line in plane.lines:
            if is_device:
                if line.name == "Steps" and plane is not device_planes[0]:
                    continue  # every device repeats the same steps: the first device's line is enough
                max_end = max(max_end, _walk_device_line(plane.name, line, ops, device_steps))
            else:
                max_end = max(max_end, _walk_host_line(line, ops, steps, host, compile_, launches,
                                                           want_ops=not device_planes))

    window = stop - start if stop > start else max_end
    hostname = path.name[: -len(".xplane.pb")] if path.name.endswith(".xplane.pb") else path.stem
    devices = tuple(p.name for p in device_planes) or tuple(sorted(set(ops["device"]))) or ("/device:CPU:0",)
    # The program's own StepTraceAnnotations win over the device's step markers.
    step_frame = frames.from_rows(steps if steps["name"] else device_steps, frames.STEPS, "xplane")
    op_frame = frames.from_rows(ops, frames.OPS, "xplane")
    if tpu is not None:
        op_frame = tpu.ops
        if not steps["name"]:
            step_frame = tpu.steps
    return Trace(
        path=str(path), hostname=hostname, backend=backend, start_time_ns=start, window_ns=int(window),
        ops=op_frame, steps=step_frame, host=frames.from_rows(host, frames.HOST, "xplane"),
        compile=frames.from_rows(compile_, frames.HOST, "xplane"),
        devices=devices, jax_version=meta_stats.get("jax_version"), device=tpu,
        launches=frames.from_rows(launches, frames.LAUNCHES, "xplane"),
    )


def _walk_host_line(line, ops, steps, host, compile_, launches, want_ops: bool) -> int:
    """Op instances (CPU thunks), step annotations, and the remaining host activity of one thread."""
    lname = line.name
    compiler_thread = any(m in lname for m in _COMPILE_LINE_MARKERS)
    max_end = 0
    for ev in line.events:
        name = ev.name
        start = int(ev.start_ns)
        dur = int(ev.duration_ns)
        max_end = max(max_end, start + dur)
        if dur <= 0 or name.startswith(_SKIP_PREFIXES):
            continue
        stats = {} if _NOT_HLO_NAME.search(name) else dict(ev.stats)
        launch = _LAUNCH.search(name) if "::Execute" in name else None
        if launch:
            launches["module"].append(launch.group("module"))
            launches["start_ns"].append(start)
        if "hlo_op" in stats:
            if want_ops:
                # One CPU client can drive several devices (--xla_force_host_platform_device_count).
                ops["device"].append(f"/device:CPU:{stats.get('device_ordinal', 0)}")
                ops["line"].append(lname)
                ops["module"].append(str(stats.get("hlo_module", "")))
                ops["program_id"].append(int(stats.get("program_id", -1)))
                ops["run_id"].append(_int(stats.get("run_id")))
                ops["op"].append(str(stats["hlo_op"]))
                ops["start_ns"].append(start)
                ops["duration_ns"].append(dur)
            continue
        if "step_num" in stats:
            # A step annotation spans work; it is not itself host activity.
            steps["name"].append(name)
            steps["step_num"].append(int(stats["step_num"]))
            steps["start_ns"].append(start)
            steps["duration_ns"].append(dur)
            continue
        sink = compile_ if compiler_thread or any(m in name for m in _COMPILE_NAME_MARKERS) else host
        sink["name"].append(name)
        sink["start_ns"].append(start)
        sink["duration_ns"].append(dur)
    return max_end


def _walk_device_line(device: str, line, ops, steps) -> int:
    lname = line.name
    max_end = 0
    if lname == "Steps":
        for ev in line.events:
            start, dur = int(ev.start_ns), int(ev.duration_ns)
            max_end = max(max_end, start + dur)
            try:
                num = int(dict(ev.stats).get("step_num", ev.name))
            except (TypeError, ValueError):
                num = -1
            steps["name"].append(f"{device} step")
            steps["step_num"].append(num)
            steps["start_ns"].append(start)
            steps["duration_ns"].append(dur)
        return max_end
    if lname != "XLA Ops":
        return max_end
    for ev in line.events:
        start, dur = int(ev.start_ns), int(ev.duration_ns)
        max_end = max(max_end, start + dur)
        stats = dict(ev.stats)
        module = str(stats.get("hlo_module", ""))
        pid = stats.get("program_id", -1)
        m = _MODULE_EVENT.match(module)
        if m:
            module, pid = m.group("name"), m.group("id")
        ops["device"].append(device)
        ops["line"].append(lname)
        ops["module"].append(module)
        ops["program_id"].append(int(pid) if str(pid).lstrip("-").isdigit() else -1)
        ops["run_id"].append(_int(stats.get("run_id")))
        ops["op"].append(str(stats.get("hlo_op", ev.name)))
        ops["start_ns"].append(start)
        ops["duration_ns"].append(dur)
    return max_end


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def locate_xplane(path: Path) -> Path:
    """A `.xplane.pb` file itself, or the one under a run directory or an xprof log directory."""
    path = Path(path)
    if path.is_file():
        if not path.name.endswith(".xplane.pb"):
            raise InputError(f"{path}: not an .xplane.pb trace (and not a run directory)")
        return path
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    # The layouts profilers write: a session directory, an xprof/TensorBoard log directory, or a
    # tpudiag run. No deeper search: `report /tmp` must not pick some unrelated trace.
    for pattern in ("*.xplane.pb", "plugins/profile/*/*.xplane.pb", "trace/plugins/profile/*/*.xplane.pb"):
        found = sorted(path.glob(pattern))
        if found:
            return found[-1]
    raise InputError(f"{path}: no .xplane.pb trace in this directory (nor in its plugins/profile/*/)")
