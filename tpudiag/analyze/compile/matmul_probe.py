"""Matmul probes: each distinct matmul of a compiled step as its own one-op HLO module, so that the
TPU compiler's static cycle profile can time it where profiling the whole step is out of reach.

At scale (`tpudiag estimate`), the step compiles without the static profile and its compute-bound
ops are taken at the MXU peak. A probe is the fusion's `convolution` (or `dot`) alone, at the
step's per-device operand shapes, dtypes and layouts (memory-space annotations dropped), with its
dimension labels, window, group counts and precision: the TPU compiler lowers it as it lowered the
step's (a bitcast fusion per operand, the convolution), and its static profile gives the cycles.
The elementwise work fused around the matmul is not in the probe: the step's op keeps its roofline
time where that is longer.

Probes are deduplicated by their text (a scanned layer's matmuls are one probe) and ranked by the
step time of the ops they stand for. Pure: takes the parsed module and the compile report's ops,
returns probe texts; compiling them is the caller's (`api/estimate.py`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from tpudiag.parse.hlo_model import HloModule, Instruction

_MATMUL = ("convolution", "dot")
# The attributes that decide what a convolution or dot computes and how the MXU is fed.
_KEEP = ("window", "dim_labels", "feature_group_count", "batch_group_count", "lhs_batch_dims",
         "lhs_contracting_dims", "rhs_batch_dims", "rhs_contracting_dims", "operand_precision")
_MEMORY_SPACE = re.compile(r"S\(\d+\)")


@dataclass(frozen=True)
class Probe:
    key: str  # sha256 of the text, 16 hex digits
    text: str  # an HLO module: the matmul(s) of one fusion, alone
    ops: tuple[str, ...]  # the step's ops it stands for
    total_s: float  # their estimated time x runs in the step (the ranking)


def _shape(shape: str) -> str:
    """A shape with its layout and tiling, without memory-space annotations (`S(1)`: VMEM)."""
    return _MEMORY_SPACE.sub("", shape).replace(":}", "}")


def _matmuls(module: HloModule, instr: Instruction) -> list[Instruction]:
    if instr.opcode in _MATMUL:
        return [instr]
    if instr.opcode != "fusion" or not instr.calls:
        return []
    return [i for i in module.walk([instr.calls]) if i.opcode in _MATMUL]


def probe_text(module: HloModule, instr: Instruction) -> str | None:
    """The HLO module that is `instr`'s matmul(s) alone; None when it has none or an operand's shape
    is not known."""
    mms = _matmuls(module, instr)
    if not mms:
        return None
    params, body, roots = [], [], []
    for n, mm in enumerate(mms):
        names = []
        for k in range(len(mm.operands)):
            op = module.operand(mm, k)
            if op is None or not op.shape:
                return None
            p = f"p{len(params)}"
            params.append((p, _shape(op.shape)))
            names.append(f"%{p}")
        attrs = mm.attributes
        kept = ", ".join(f"{k}={attrs[k]}" for k in _KEEP if k in attrs)
        body.append(f"  %m{n} = {_shape(mm.shape)} {mm.opcode}({', '.join(names)}){', ' + kept if kept else ''}")
        roots.append((f"%m{n}", _shape(mm.shape)))
    lines = [f"  %{p} = {s} parameter({i})" for i, (p, s) in enumerate(params)] + body
    if len(roots) == 1:
        lines[-1] = lines[-1].replace(f"  {roots[0][0]} =", f"  ROOT {roots[0][0]} =", 1)
        result = roots[0][1]
    else:
        result = "(" + ", ".join(s for _, s in roots) + ")"
        lines.append(f"  ROOT %out = {result} tuple({', '.join(r for r, _ in roots)})")
    head = ", ".join(f"{p}: {s}" for p, s in params)
    return "HloModule matmul_probe\n\nENTRY %main (" + head + ") -> " + result + " {\n" + "\n".join(lines) + "\n}\n"


def select_probes(module: HloModule, ops, limit: int = 16) -> list[Probe]:
    """The distinct matmuls behind the step's compute-bound ops (taken at the MXU peak), largest
    share of the step first, at most `limit`."""
    by_text: dict[str, list] = {}
    for o in ops:
        if o.bound_by != "compute" or o.flops <= 0:
            continue
        instr = module.instruction(o.name, o.computation)
        text = probe_text(module, instr) if instr is not None else None
        if text is not None:
            by_text.setdefault(text, []).append(o)
    probes = [Probe(key=hashlib.sha256(t.encode()).hexdigest()[:16], text=t, ops=tuple(o.name for o in group),
                    total_s=sum(o.total_s for o in group)) for t, group in by_text.items()]
    probes.sort(key=lambda p: -p.total_s)
    return probes[:limit]
