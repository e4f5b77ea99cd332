"""Top-k / top-p sampling over a vocabulary.

Reads a `walk.Flow`; returns `PatternMatch`es with `SamplingShapes`: a `sort` or TopK over at least
`SAMPLING_MIN` candidates, with a cumulative sum over the sorted values for top-p. It prices nothing
and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems, etype

SAMPLING_MIN = 1024  # candidates sorted per row: fewer is a small sort, not a sampler over a vocabulary


@dataclass(frozen=True)
class SamplingShapes(Shapes):
    rows: int
    vocab: int
    dtype: str


class Sampling(Detector):
    name = "sampling"
    kernel = "sampling"

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []
        for s in flow.g.instructions:
            topk = s.opcode == "custom-call" and (s.custom_call_target or "").lower() in ("topk", "tpu_topk")
            if s.opcode != "sort" and not topk:
                continue
            cand = dims(flow.g.operand(s, 0) or s)
            if not cand or cand[-1] < SAMPLING_MIN or not etype(flow.g.operand(s, 0) or s).startswith(("f", "bf")):
                continue
            cum = flow.forward(s, TRANSPARENT | {"exponential", "divide", "subtract", "broadcast", "slice"},
                               lambda u: u.opcode == "reduce-window", depth=6)[0]
            notes = ["TopK" if topk else "full sort of the candidates"]
            if cum is not None:
                notes.append("cumulative sum over the sorted probabilities (top-p)")
            shapes = SamplingShapes(rows=max(1, elems(cand) // cand[-1]), vocab=cand[-1],
                                    dtype=etype(flow.g.operand(s, 0) or s))
            out.append(flow.match(self, [s], [c for c in (cum,) if c is not None], shapes, notes))
        return dedupe(out)

    def bound(self, shapes: SamplingShapes, chip, backward: bool = False) -> float | None:
        return roofline_s(4.0 * shapes.rows * shapes.vocab, 0.0, chip, backward)


SAMPLING = Sampling()
