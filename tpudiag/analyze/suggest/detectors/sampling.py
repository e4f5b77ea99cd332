"""Top-k / top-p sampling over a vocabulary, with the program's own k, p and temperature.

Reads a `walk.Flow`; returns `PatternMatch`es with `SamplingShapes`: a `sort` or TopK over at least
`SAMPLING_MIN` candidates. Its parameters are read from the HLO where they are constants:

- k: the TopK's output width, or a slice of the sorted values narrower than the vocabulary;
- p: the constant a cumulative sum of the sorted probabilities (a `reduce-window` add, which the
  TPU compiler splits into several) is compared against;
- temperature: the constant the logits are divided by (or multiplied by its inverse, as XLA
  rewrites a division by a constant) before the softmax.

A parameter that is not a constant (passed in at run time) is None: the snippet then says "as your
program passes it". It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


from tpudiag.analyze.hlo.evaluate import scalar
from tpudiag.analyze.hlo.vocabulary import ELEMENTWISE, TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems, etype

SAMPLING_MIN = 1024  # candidates sorted per row: fewer is a small sort, not a sampler over a vocabulary
# From the sorted candidates to the top-p comparison: the softmax over them, a reversal (descending),
# a second sort of the top-k, the cumulative sum's pieces.
_AFTER_SORT = TRANSPARENT | ELEMENTWISE | {"broadcast", "slice", "reverse", "reduce", "reduce-window", "sort",
                                           "get-tuple-element", "concatenate", "pad", "custom-call"}
_BEFORE_SORT = TRANSPARENT | ELEMENTWISE | {"broadcast", "reduce", "reverse"}


@dataclass(frozen=True)
class SamplingShapes(Shapes):
    rows: int
    vocab: int
    dtype: str
    top_k: int | None = None  # None: no top-k (or not a constant)
    top_p: float | None = None  # None: no top-p (or not a constant)
    temperature: float | None = None  # None: 1.0, or not a constant


def _downstream(flow: Flow, s, depth: int = 14) -> list:
    frontier, seen, out = [s], {id(s)}, []
    for _ in range(depth):
        nxt = []
        for i in frontier:
            for u in flow.g.users(i):
                if id(u) not in seen:
                    seen.add(id(u))
                    out.append(u)
                    if u.opcode in _AFTER_SORT:
                        nxt.append(u)
        frontier = nxt
    return out


def _top_p(flow: Flow, after: list) -> tuple[float | None, list]:
    """(p, the cumulative sum's ops): a compare of a cumulative sum against a constant in (0, 1)."""
    cums = [u for u in after if u.opcode == "reduce-window"]
    if not cums:
        return None, []
    for c in after:
        if c.opcode != "compare":
            continue
        ops = flow.g.operands(c)
        if not any(id(o) in {id(x) for x in cums} or flow.back(o, TRANSPARENT | ELEMENTWISE | {"reduce-window"},
                                                               lambda t: t in cums, depth=6)[0] is not None
                   for o in ops):
            continue
        for o in ops:
            v = scalar(flow.g, o, 1 << 22)
            if v is not None and 0.0 < v < 1.0:
                return v, cums
    return None, cums


def _top_k(flow: Flow, s, after: list, vocab: int) -> int | None:
    if s.opcode == "custom-call":
        shape = s.parsed_shape
        first = shape.tuple_shapes[0] if not shape.is_array and shape.tuple_shapes else shape
        d = first.dims if first.is_array else ()
        return d[-1] if d and d[-1] < vocab else None
    for u in after:
        if u.opcode == "slice" and u.slice and dims(u) and dims(u)[-1] < vocab and u.slice[-1][0] == 0:
            return dims(u)[-1]
    return None


def _temperature(flow: Flow, s) -> float | None:
    """The constant the logits are scaled by on the way to the sort (1 / the multiplier)."""
    frontier, seen = [flow.g.operand(s, 0)], set()
    for _ in range(10):
        nxt = []
        for i in frontier:
            if i is None or id(i) in seen:
                continue
            seen.add(id(i))
            if i.opcode in ("divide", "multiply"):
                v = scalar(flow.g, flow.g.operand(i, 1), 1 << 22)
                if v is not None and v > 0 and abs(v - 1.0) > 1e-6:
                    return round(v if i.opcode == "divide" else 1.0 / v, 6)
            if i.opcode in _BEFORE_SORT:
                nxt.extend(flow.g.operands(i))
        frontier = nxt
    return None


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
            after = _downstream(flow, s)
            p, cums = _top_p(flow, after)
            k = _top_k(flow, s, after, cand[-1])
            t = _temperature(flow, s)
            notes = ["TopK" if topk else "full sort of the candidates"]
            if cums:
                notes.append("cumulative sum over the sorted probabilities (top-p)"
                             + (f", p = {p:g}" if p is not None else ", p not a constant"))
            if t is not None:
                notes.append(f"temperature {t:g}")
            shapes = SamplingShapes(rows=max(1, elems(cand) // cand[-1]), vocab=cand[-1],
                                    dtype=etype(flow.g.operand(s, 0) or s), top_k=k, top_p=p, temperature=t)
            out.append(flow.match(self, [s], cums, shapes, notes))
        return dedupe(out)

    def bound(self, shapes: SamplingShapes, chip, backward: bool = False) -> float | None:
        return roofline_s(4.0 * shapes.rows * shapes.vocab, 0.0, chip, backward)


SAMPLING = Sampling()
