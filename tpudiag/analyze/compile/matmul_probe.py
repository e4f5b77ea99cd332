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
returns probe texts; compiling them is the caller's (`api/estimate_probes.py`).

Where a probe's static profile gives no cycles, the step's own HLO still holds the compiler's figure
for the op: the convolution emitter picks each convolution fusion's tiling with a cost model and
records the pick's cycles in the fusion's backend config (`cost_model_cycles`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import DOT_CONVOLUTION
from tpudiag.parse.hlo_model import HloModule, Instruction

# The attributes that decide what a convolution or dot computes and how the MXU is fed.
_KEEP = ("window", "dim_labels", "feature_group_count", "batch_group_count", "lhs_batch_dims",
         "lhs_contracting_dims", "rhs_batch_dims", "rhs_contracting_dims", "operand_precision")
_MEMORY_SPACE = re.compile(r"S\(\d+\)")
_DIMS = re.compile(r"^(\w+)\[([\d,]*)\](.*)$", re.S)
# A probe's rows (the convolution's batch dimension, times its window-1 spatial dimensions) are cut to
# at most this many, and its cycles scaled back by the rows cut: the static profile steps through
# every loop iteration (fast-forwarding loops inflates a large matmul's cycles 2.35x), and at the
# step's full rows it runs past 8 GB. A matmul's cycles are linear in its rows once they are many
# times the MXU's 128 or 256.
PROBE_ROWS = 2048
# Its output and contracted features likewise, to at most this many: at 2048 rows a [8192, 28672]
# weight (a 32B model's MLP) still took the static profile past its 45 s CPU budget on a 2-core
# machine, and the op fell back to the convolution cost model's cycles (2.5x the MXU rate there).
PROBE_COLS = 4096
# The cost model whose pick a convolution fusion's `window_config` records. Other ops' window configs
# say COST_MODEL_TYPE_INVALID, their cycles not a tiling's (some INT64_MAX: unset).
_COST_MODEL = "COST_MODEL_TYPE_CLASSIC"
_UNSET = 2**63 - 1


@dataclass(frozen=True)
class Probe:
    key: str  # sha256 of the text, 16 hex digits
    text: str  # an HLO module: the matmul(s) of one fusion, alone
    ops: tuple[str, ...]  # the step's ops it stands for
    total_s: float  # their estimated time x runs in the step (the ranking)
    scale: float = 1.0  # the step's work over the probe's (rows, features cut): cycles x this are the op's


def _shape(shape: str) -> str:
    """A shape with its layout and tiling, without memory-space annotations (`S(1)`: VMEM)."""
    return _MEMORY_SPACE.sub("", shape).replace(":}", "}")


def _dims(shape: str) -> tuple[str, list[int], str]:
    m = _DIMS.match(shape)
    return m.group(1), [int(d) for d in m.group(2).split(",") if d], m.group(3)


def _with_dims(dtype: str, dims: list[int], rest: str) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]{rest}"


def _cut_rows(mm: Instruction, lhs: str, rhs: str, out: str) -> tuple[str, str, str, float]:
    """(lhs shape, rhs shape, result shape, work cut) with a convolution's rows cut to at most
    PROBE_ROWS (its spatial dimensions with a plain size-1 window, batch-like, to 1, then its batch
    dimension to PROBE_ROWS where that divides it) and its output features to PROBE_COLS where that
    divides them, and its contracted (input) features likewise. A shape it cannot read is left whole
    (factor 1)."""
    attrs = mm.attributes
    labels = attrs.get("dim_labels", "")
    window = attrs.get("window", "{}").strip("{}").strip()
    if mm.opcode != "convolution" or "->" not in labels or "_" not in labels:
        return lhs, rhs, out, 1.0
    lhs_l, rest = labels.split("_", 1)
    rhs_l, out_l = rest.split("->", 1)
    plain = re.fullmatch(r"size=[\dx]+", window) is not None
    sizes = [int(x) for x in window[5:].split("x")] if plain else []
    try:
        (ldt, ld, lrest), (rdt, rd, rrest), (odt, od, orest) = _dims(lhs), _dims(rhs), _dims(out)
    except (AttributeError, ValueError):
        return lhs, rhs, out, 1.0
    if len(ld) != len(lhs_l) or len(rd) != len(rhs_l) or len(od) != len(out_l):
        return lhs, rhs, out, 1.0
    factor = 1.0
    for c in lhs_l:
        if c.isdigit() and plain and int(c) < len(sizes) and sizes[int(c)] == 1 and c in out_l:
            n = ld[lhs_l.index(c)]
            if n > 1 and od[out_l.index(c)] == n:
                ld[lhs_l.index(c)] = od[out_l.index(c)] = 1
                factor *= n
    if "b" in lhs_l and "b" in out_l:
        n = ld[lhs_l.index("b")]
        if n > PROBE_ROWS and n % PROBE_ROWS == 0 and od[out_l.index("b")] == n:
            ld[lhs_l.index("b")] = od[out_l.index("b")] = PROBE_ROWS
            factor *= n / PROBE_ROWS
    if "o" in rhs_l and "f" in out_l and int(mm.attributes.get("feature_group_count", "1")) == 1:
        n = rd[rhs_l.index("o")]
        if n > PROBE_COLS and n % PROBE_COLS == 0 and od[out_l.index("f")] == n:
            rd[rhs_l.index("o")] = od[out_l.index("f")] = PROBE_COLS
            factor *= n / PROBE_COLS
        n = rd[rhs_l.index("i")] if "i" in rhs_l else 0  # the contracted features, likewise
        if n > PROBE_COLS and n % PROBE_COLS == 0 and "f" in lhs_l and ld[lhs_l.index("f")] == n:
            rd[rhs_l.index("i")] = ld[lhs_l.index("f")] = PROBE_COLS
            factor *= n / PROBE_COLS
    return _with_dims(ldt, ld, lrest), _with_dims(rdt, rd, rrest), _with_dims(odt, od, orest), factor


def _matmuls(module: HloModule, instr: Instruction) -> list[Instruction]:
    if instr.opcode in DOT_CONVOLUTION:
        return [instr]
    if instr.opcode != "fusion" or not instr.calls:
        return []
    return [i for i in module.walk([instr.calls]) if i.opcode in DOT_CONVOLUTION]


def cost_model_cycles(module: HloModule, instr: Instruction) -> int | None:
    """The cycles the TPU compiler's convolution cost model gives a matmul fusion (or convolution):
    `backend_config.window_config.estimated_cycles` where its `cost_model_type` is the classic
    model's, the tiling the compiler chose. None for an op with no matmul, no such record (a dot
    the compiler did not lower as a tiled convolution, a custom call) or an unset figure.

    Against the static profile of the same one-op modules, loops stepped through (libtpu 0.0.50,
    30 probes of published steps: docs/estimate.md): 0.90-1.11x its cycles on 23, 1.29-1.85x on
    matmuls of 8.6-90 GFLOP. It scores the tiling; the static profile schedules its bundles."""
    if not _matmuls(module, instr):
        return None
    config = instr.backend_config or {}
    window = config.get("window_config")
    if not isinstance(window, dict) or window.get("cost_model_type") != _COST_MODEL:
        return None
    try:
        cycles = int(window.get("estimated_cycles", 0))
    except (TypeError, ValueError):
        return None
    return cycles if 0 < cycles < _UNSET else None


def probe_cost_model_cycles(probe: HloModule) -> int | None:
    """A compiled probe's own convolution cost model: the cycles its entry's matmul fusions record
    (`cost_model_cycles`), summed; None where none records them. For a probe whose static profile
    gives no cycles (a weight gradient's windowed convolution, whose emitter it does not time). Where
    a probe has both, the two agreed within 2% on the 10 probes of MaxText's 32B step on v5e-256
    (bench/RESULTS.md); the step's own record for the full-size op read 1.14-1.63x the MXU peak where
    its probe's read 1.03-1.07x."""
    entry = probe.entry
    figures = [cost_model_cycles(probe, i) for i in entry.instructions] if entry is not None else []
    figures = [c for c in figures if c]
    return sum(figures) if figures else None


def probe_text(module: HloModule, instr: Instruction, cut: bool = False) -> str | None:
    """The HLO module that is `instr`'s matmul(s) alone; None when it has none or an operand's shape
    is not known. `cut`: rows cut as `probe` does (use `probe` for the factor)."""
    got = probe(module, instr, cut)
    return got[0] if got else None


def probe(module: HloModule, instr: Instruction, cut: bool = True) -> tuple[str, float] | None:
    """(the probe's HLO text, the work cut: its cycles times this are the op's), or None. A fusion
    with several matmuls is probed whole (factor 1)."""
    mms = _matmuls(module, instr)
    if not mms:
        return None
    params, body, roots = [], [], []
    factor = 1.0
    for n, mm in enumerate(mms):
        shapes = []
        for k in range(len(mm.operands)):
            op = module.operand(mm, k)
            if op is None or not op.shape:
                return None
            shapes.append(_shape(op.shape))
        result = _shape(mm.shape)
        if cut and len(mms) == 1 and len(shapes) == 2:
            shapes[0], shapes[1], result, factor = _cut_rows(mm, shapes[0], shapes[1], result)
        names = []
        for sh in shapes:
            p = f"p{len(params)}"
            params.append((p, sh))
            names.append(f"%{p}")
        attrs = mm.attributes
        kept = ", ".join(f"{k}={attrs[k]}" for k in _KEEP if k in attrs)
        body.append(f"  %m{n} = {result} {mm.opcode}({', '.join(names)}){', ' + kept if kept else ''}")
        roots.append((f"%m{n}", result))
    lines = [f"  %{p} = {s} parameter({i})" for i, (p, s) in enumerate(params)] + body
    if len(roots) == 1:
        lines[-1] = lines[-1].replace(f"  {roots[0][0]} =", f"  ROOT {roots[0][0]} =", 1)
        result = roots[0][1]
    else:
        result = "(" + ", ".join(s for _, s in roots) + ")"
        lines.append(f"  ROOT %out = {result} tuple({', '.join(r for r, _ in roots)})")
    head = ", ".join(f"{p}: {s}" for p, s in params)
    text = "HloModule matmul_probe\n\nENTRY %main (" + head + ") -> " + result + " {\n" + "\n".join(lines) + "\n}\n"
    return text, factor


def select_probes(module: HloModule, ops, limit: int = 16) -> list[Probe]:
    """The distinct matmuls behind the step's compute-bound ops (taken at the MXU peak), largest
    share of the step first, at most `limit`."""
    by_text: dict[tuple[str, float], list] = {}
    for o in ops:
        if o.bound_by != "compute" or o.flops <= 0:
            continue
        instr = module.instruction(o.name, o.computation)
        got = probe(module, instr) if instr is not None else None
        if got is not None:
            by_text.setdefault(got, []).append(o)
    probes = [Probe(key=hashlib.sha256(t.encode()).hexdigest()[:16], text=t, ops=tuple(o.name for o in group),
                    total_s=sum(o.total_s for o in group), scale=f) for (t, f), group in by_text.items()]
    probes.sort(key=lambda p: -p.total_s)
    return probes[:limit]
