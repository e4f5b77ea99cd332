"""Dequantize-then-matmul: 8- or 4-bit weights converted (and scaled) before a matmul.

Reads a `walk.Flow`; returns `PatternMatch`es with `DequantShapes`: a matmul fed by a `convert` from
an 8-bit or 4-bit type, through scales and broadcasts. The scales' own ops (their broadcast to the
weights' shape, which XLA may write to HBM whole) and the weights' load (`Flow.load`: a prefetch
into VMEM) are part of the pattern, and the scales' count gives the group size: K x N weights with K / G x N scales are groups of G rows. It prices nothing and
does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import MATMUL, TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems, etype

_QUANT = ("s8", "u8", "s4", "u4", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz")


@dataclass(frozen=True)
class DequantShapes(Shapes):
    weight: tuple[int, ...]  # [K, N] as stored
    weight_dtype: str
    out: tuple[int, ...]  # [M, N]
    dtype: str
    group: int | None = None  # rows of K per scale (K: one scale per channel); None: no scale found


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
                scale_ops, group = self._scales(flow, cv, path, w)
                scale_ops += flow.load(w)
                shapes = DequantShapes(weight=tuple(dims(w)), weight_dtype=etype(w), out=tuple(dims(d)),
                                       dtype=etype(d), group=group)
                scaled = any(p.opcode == "multiply" for p in path)
                out.append(flow.match(self, [d, cv], path + scale_ops, shapes,
                                      [f"{etype(w)} weights converted to {etype(cv)}"
                                       + (" and scaled" if scaled else "") + " before the matmul"]))
                break
        return dedupe(out)

    @staticmethod
    def _scales(flow: Flow, cv, path: list, w) -> tuple[list, int | None]:
        """The scale side of each multiply on the weights' path (the ops from the scales' source up to
        the multiply: converts, broadcasts, reshapes) and the group size their count implies."""
        through = TRANSPARENT | {"broadcast", "convert"}
        ops, group = [], None
        weights = elems(dims(w))
        for p in path:
            if p.opcode != "multiply":
                continue
            for so in flow.g.operands(p):
                if so is cv or flow.depends_on(so, cv):  # the weights' side
                    continue
                src, sp = flow.back(so, through, lambda t: t.opcode not in through, depth=8)
                ops += [so, *sp]
                # K x N weights (K: all but the last dim) and `groups` x N scales: groups of K / groups
                n, wd = elems(dims(src if src is not None else so)), dims(w)
                if group is None and wd and n and n % wd[-1] == 0:
                    k, groups = weights // wd[-1], n // wd[-1]
                    group = k // groups if k % groups == 0 else None
        return ops, group

    def bound(self, shapes: DequantShapes, chip, backward: bool = False) -> float | None:
        (k, n), (m, _) = shapes.weight[-2:], shapes.out[-2:]
        bits = 4 if shapes.weight_dtype in ("s4", "u4") else 8
        scales = 0 if not shapes.group else (k // shapes.group) * n * 4
        nbytes = k * n * bits / 8 + scales + 2.0 * (m * k + m * n)
        flops = 2.0 * m * k * n
        return roofline_s(nbytes, flops, chip, backward)


DEQUANT_MATMUL = DequantMatmul()
