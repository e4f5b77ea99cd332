"""The buffers live at a compiled module's HBM peak, grouped by the source line that made them.

XLA's dump (`XLA_FLAGS=--xla_dump_to`, which `tpudiag compile` and `estimate` set) writes
`*after_optimizations-live-range.txt`: the buffer live ranges of the scheduled module and, under
"Live ranges at N (peak):", every buffer live at the peak with its size. This module reads that
list and the optimized HLO beside it, leaves out buffers in host memory or VMEM (the dump lists
them with HBM's), and names each buffer: a parameter (its number and shape: a
weight, an optimizer state, a batch), or an instruction's output, by the model's own `file:line`
(`HloModule.call_site`) and op name. Buffers from one line are summed, largest first: what to read
when two programs of one model differ in peak HBM.

Pure reading: takes paths, returns rows; never compiles.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpudiag.errors import InputError

_PEAK = re.compile(r"^\s*Live ranges at (\d+) \(peak\):\s*$")
_LAYOUT = re.compile(r"\{[^{}]*\}")
_BUFFER = re.compile(r"^\s*([^\s{}]+)\{[^}]*\}: (\d+) bytes")


def live_at_peak(text: str) -> list[tuple[str, int]]:
    """(instruction name, bytes) of every buffer the live-range dump lists at the peak."""
    out, inside = [], False
    for line in text.splitlines():
        if _PEAK.match(line):
            inside = True
            continue
        if inside:
            m = _BUFFER.match(line)
            if not m:
                break
            out.append((m.group(1), int(m.group(2))))
    return out


def peak_buffers(live_range: Path, hlo_path: Path, top: int = 12) -> list[dict]:
    """[{"bytes", "count", "kind" (parameter|output|temporary), "where", "shape"}], largest first."""
    from tpudiag.analyze.compile.memory_space import outside_hbm_bytes
    from tpudiag.parse.hlo import read_hlo_file

    live = live_at_peak(live_range.read_text(errors="replace"))
    if not live:
        raise InputError(f"{live_range}: no 'Live ranges at N (peak)' section")
    module = read_hlo_file(hlo_path)
    root = module.entry.root if module.entry else None
    root_operands = set(root.operands) if root is not None else set()
    groups: dict[tuple[str, str], dict] = {}
    for name, size in live:
        instr = module.instruction(name)
        # A buffer in host memory (activation offload) or VMEM is listed with HBM's: an 8B step
        # offloading its layer inputs lists 21 GiB of them at a 22.6 GiB HBM peak.
        if outside_hbm_bytes(instr, whole=True):
            continue
        if instr is None:
            kind, where, shape = "temporary", name, ""
        elif instr.opcode == "parameter" and instr.computation == (module.entry.name if module.entry else None):
            shape = _LAYOUT.sub("", instr.shape)  # parameters of one shape (a stacked weight, its moments) summed
            kind, where = "parameter", f"parameters {shape}"
        elif instr.opcode == "parameter":  # a loop body's or a called computation's own parameter
            shape = _LAYOUT.sub("", instr.shape)
            kind, where = "temporary", f"loop state {shape}"
        else:
            own, _lib = module.call_site(instr)
            op = instr.metadata.get("op_name", "").rsplit("/", 1)[-1]
            kind = "output" if name in root_operands else "temporary"
            where, shape = f"{own or '(no source)'} {op or instr.opcode}".strip(), _LAYOUT.sub("", instr.shape)
        g = groups.setdefault((kind, where), {"bytes": 0, "count": 0, "kind": kind, "where": where, "shape": shape})
        g["bytes"] += size
        g["count"] += 1
    return sorted(groups.values(), key=lambda g: -g["bytes"])[:top]


def peak_buffers_of_run(run_dir: Path, top: int = 12) -> list[dict]:
    """`peak_buffers` of a compile run's first module with a live-range dump (an estimate's step)."""
    for hlo_dir in sorted(Path(run_dir).glob("modules/*/hlo")):
        ranges = sorted(hlo_dir.glob("*after_optimizations-live-range.txt"))
        if ranges:
            hlo = Path(str(ranges[0]).replace("-live-range.txt", ".txt"))
            if not hlo.is_file():
                raise InputError(f"{hlo}: the optimized HLO beside {ranges[0].name} is missing")
            return peak_buffers(ranges[0], hlo, top)
    raise InputError(f"{run_dir}: no *after_optimizations-live-range.txt under modules/*/hlo")
