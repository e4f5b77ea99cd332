"""Dequantize-then-matmul: 8- or 4-bit weights converted (and scaled) before a matmul.

Reads a `walk.Flow`; returns `PatternMatch`es with `DequantShapes`: a matmul fed by a `convert` from
an 8-bit or 4-bit type, through scales and broadcasts. It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import MATMUL, TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, etype

_QUANT = ("s8", "u8", "s4", "u4", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz")


@dataclass(frozen=True)
class DequantShapes(Shapes):
    weight: tuple[int, ...]  # [K, N] as stored
    weight_dtype: str
    out: tuple[int, ...]  # [M, N]
    dtype: str


class DequantMatmul(Detector):
    name = "dequant_matmul"
    kernel = "int8_matmul"
    matmul_work = True

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []

        def quantized(t) -> bool:
            return t.opcode == "convert" and etype(flow.g.operand(t, 0) or t) in _QUANT

        for d in flow.g.instructions:
            if d.opcode not in MATMUL:
                continue
            for o in flow.g.operands(d):
                cv, path = (o, []) if quantized(o) else flow.back(o, TRANSPARENT | {"multiply", "broadcast"},
                                                                   quantized, depth=5)
                if cv is None:
                    continue
                w = flow.g.operand(cv, 0)
                shapes = DequantShapes(weight=tuple(dims(w)), weight_dtype=etype(w), out=tuple(dims(d)),
                                       dtype=etype(d))
                scaled = any(p.opcode == "multiply" for p in path)
                out.append(flow.match(self, [d, cv], path, shapes,
                                      [f"{etype(w)} weights converted to {etype(cv)}"
                                       + (" and scaled" if scaled else "") + " before the matmul"]))
                break
        return dedupe(out)

    def bound(self, shapes: DequantShapes, chip, backward: bool = False) -> float | None:
        (k, n), (m, _) = shapes.weight, shapes.out
        nbytes = k * n * 1 + 2.0 * (m * k + m * n)
        flops = 2.0 * m * k * n
        return roofline_s(nbytes, flops, chip, backward)


DEQUANT_MATMUL = DequantMatmul()
