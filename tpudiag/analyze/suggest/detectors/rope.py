"""Rotary position embedding computed in place.

Reads a `walk.Flow`; returns `PatternMatch`es with `RopeShapes`: a value multiplied by a cosine and
by a sine (computed in place) whose halves are recombined by a concatenate, add or subtract. It
prices nothing and does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s, stored_bytes
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, etype


@dataclass(frozen=True)
class RopeShapes(Shapes):
    shape: tuple[int, ...]  # the rotated tensor
    dtype: str


class Rope(Detector):
    name = "rope"
    no_kernel = "rope takes q and k together at [B, S, H, D]; one rotated tensor alone is not priced"

    def find(self, flow: Flow) -> list[PatternMatch]:
        trig = {}
        for m in flow.g.instructions:
            if m.opcode != "multiply":
                continue
            ops = flow.g.operands(m)
            kinds = [flow.back(o, TRANSPARENT | {"broadcast", "slice"}, lambda t: t.opcode in ("cosine", "sine"),
                               depth=4)[0] if o.opcode not in ("cosine", "sine") else o for o in ops]
            for o, t in zip(ops, kinds):
                if t is None:
                    continue
                other = next((p for p in ops if p is not o), None)
                x = flow.g.source(other, TRANSPARENT | {"slice", "broadcast"}) if other is not None else None
                if x is not None:
                    trig.setdefault(id(x), (x, {}))[1].setdefault(t.opcode, []).append(m)
        out = []
        for x, kinds in trig.values():
            if "cosine" not in kinds or "sine" not in kinds:
                continue
            muls = kinds["cosine"] + kinds["sine"]
            combine = flow.forward(muls[0], TRANSPARENT, lambda u: u.opcode in ("concatenate", "add", "subtract"),
                                   depth=3)[0]
            if combine is None:
                continue
            shapes = RopeShapes(shape=tuple(dims(x)), dtype=etype(x))
            out.append(flow.match(self, muls[:1], [*muls, combine], shapes, ["cos and sin computed in place"]))
        return dedupe(out)

    def bound(self, shapes: RopeShapes, chip, backward: bool = False) -> float | None:
        return roofline_s(2.0 * stored_bytes(shapes.dtype) * math.prod(shapes.shape), 0.0, chip, backward)


ROPE = Rope()
