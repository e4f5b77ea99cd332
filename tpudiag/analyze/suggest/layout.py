"""Static findings in a module compiled for TPU, each with its cost in bytes and time at HBM bandwidth.

Reads the optimized TPU HLO (`parse.hlo` module, its layouts) and the module's compile report
row; returns `Finding`s. No I/O.

- padding: an array whose tiled layout (`T(8,128)` and friends) stores more than it holds: a
  `[*, 100]` bf16 array stored as `[*, 128]`. The waste is read and written with the array.
- f32_matmul: a matmul whose operands were bf16 and were converted to f32 for it; on bf16 inputs
  `preferred_element_type=jnp.float32` keeps the f32 accumulation at the bf16 MXU rate.
- relayout_before_matmul: a top-level copy or transpose whose result feeds a matmul: the array is
  written in another layout and read again before the matmul can start.
- fusion_break: a value one fusion writes to HBM and the next reads back (the fusion report's
  breaks), above `FindingsConfig.min_break_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.dataflow import Dataflow
from tpudiag.analyze.hlo.vocabulary import MATMUL, NO_NEW_BUFFER
from tpudiag.results.suggest import Finding
from tpudiag.parse.hlo import HloModule



@dataclass(frozen=True)
class FindingsConfig:
    min_padding_share: float = 0.25  # of the array's stored bytes: tile rounding below this is the normal cost
    min_bytes: int = 1 << 20  # smaller arrays cost nanoseconds
    min_break_bytes: int = 4 << 20  # a fusion break that moves less is cheaper than the launch it saves
    top: int = 10  # findings of each kind, largest first
    min_module_share: float = 0.05  # of the run's estimated time: a module below it is setup, not the step


DEFAULT_FINDINGS_CONFIG = FindingsConfig()


def _padded_elements(shape) -> int | None:
    layout = shape.layout
    if layout is None or not layout.tiles or not shape.dims or any(d < 0 for d in shape.dims):
        return None
    tile = [t for t in layout.tiles[0] if t > 0]
    mtm = list(layout.minor_to_major)
    if len(mtm) != len(shape.dims) or not tile:
        return None
    dims = list(shape.dims)
    for k, t in enumerate(reversed(tile)):  # the tile's last entry covers the most minor dimension
        if k >= len(mtm):
            break
        d = mtm[k]
        dims[d] = -(-dims[d] // t) * t
    n = 1
    for d in dims:
        n *= d
    return n


def module_findings(module: HloModule, module_name: str, hbm_bytes_per_s: float, fusions: dict | None,
                    config: FindingsConfig = DEFAULT_FINDINGS_CONFIG) -> list[Finding]:
    g = Dataflow(module)
    out: list[Finding] = []
    pads = []
    for comp_name in module.executed_computations:
        for instr in module.computations[comp_name].instructions:
            if instr.opcode in NO_NEW_BUFFER:
                continue
            s = instr.parsed_shape
            if not s.is_array or not s.elements:
                continue
            padded = _padded_elements(s)
            if padded is None or padded <= s.elements:
                continue
            per = s.bytes / s.elements
            waste = int((padded - s.elements) * per)
            if waste >= config.min_bytes and waste >= config.min_padding_share * padded * per:
                pads.append(Finding(kind="padding", module=module_name, op=instr.name, source=module.source(instr),
                                    bytes=waste, estimated_s=round(2 * waste / hbm_bytes_per_s, 12),
                                    detail=f"{s.element_type}{list(s.dims)} stored tiled as {padded} elements, "
                                           f"{(padded - s.elements) / padded:.0%} padding: pad the minor dimensions "
                                           "to the tile (128 lanes, 8 sublanes for 32-bit, 16 for bf16)"))
    out += sorted(pads, key=lambda f: -f.bytes)[:config.top]
    f32 = []
    for instr in g.instructions:
        if instr.opcode not in MATMUL:
            continue
        ups = []
        for k in range(len(instr.operands)):
            o = g.operand(instr, k)
            if o is not None and o.opcode == "convert" and o.parsed_shape.is_array \
                    and o.parsed_shape.element_type == "f32":
                src = g.operand(o, 0)
                if src is not None and src.parsed_shape.is_array and src.parsed_shape.element_type == "bf16":
                    ups.append(o)
        if ups:
            extra = sum(u.parsed_shape.elements * 2 for u in ups)
            top = g.top(instr)
            f32.append(Finding(kind="f32_matmul", module=module_name, op=top.name, source=module.source(instr),
                               bytes=extra, estimated_s=round(extra / hbm_bytes_per_s, 12),
                               detail="bf16 operands converted to f32 before the matmul: pass the bf16 arrays and "
                                      "preferred_element_type=jnp.float32 (the MXU accumulates in f32 at the bf16 "
                                      "rate)"))
    out += sorted(f32, key=lambda f: -f.bytes)[:config.top]
    relayouts = []
    entry = module.entry
    for instr in entry.instructions if entry else []:
        if instr.opcode not in ("copy", "transpose"):
            continue
        s = instr.parsed_shape
        if not s.is_array or s.bytes < config.min_bytes:
            continue
        feeds = [u for u in g.users(instr) if u.opcode in MATMUL]
        if feeds:
            relayouts.append(Finding(kind="relayout_before_matmul", module=module_name, op=instr.name,
                                     source=module.source(instr), bytes=2 * s.bytes,
                                     estimated_s=round(2 * s.bytes / hbm_bytes_per_s, 12),
                                     detail=f"{instr.opcode} of {s.element_type}{list(s.dims)} written and read again "
                                            f"before {g.top(feeds[0]).name}: store the array in the layout the "
                                            "matmul reads, or let XLA fuse the transpose into it"))
    out += sorted(relayouts, key=lambda f: -f.bytes)[:config.top]
    seen = set()
    for b in (fusions or {}).get("top_breaks", [])[:config.top]:
        key = (b.get("producer"), b.get("consumer"))
        if key in seen:
            continue
        seen.add(key)
        if b.get("memory_space", 0) == 0 and b.get("bytes", 0) >= config.min_break_bytes:
            out.append(Finding(kind="fusion_break", module=module_name, op=str(b.get("consumer")), source=None,
                               bytes=2 * int(b["bytes"]), estimated_s=round(2 * b["bytes"] / hbm_bytes_per_s, 12),
                               detail=f"{b.get('producer')} writes {b.get('shape')} to HBM and {b.get('consumer')} "
                                      f"reads it back ({b.get('reason')})"))
    return out
