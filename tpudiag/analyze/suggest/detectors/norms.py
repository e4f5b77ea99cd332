"""RMSNorm and LayerNorm: one finder, two detectors.

Reads a `walk.Flow`; returns `PatternMatch`es with `NormShapes`. The finder anchors on a reciprocal square
root (`rsqrt`, `pow(_, -0.5)`, or a `sqrt` that divides) of a row sum of `x * x` (LayerNorm: of
`(x - mean)^2`, or `E[x^2] - E[x]^2` as flax's LayerNorm writes it) plus a constant epsilon; an `add` producing x is the residual add before
it. It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


from tpudiag.analyze.hlo.evaluate import scalar
from tpudiag.analyze.hlo.vocabulary import TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s, stored_bytes
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems, etype, reducer_is


@dataclass(frozen=True)
class NormShapes(Shapes):
    rows: int
    hidden: int
    dtype: str
    eps: float | None = None  # added to the mean square before the square root, where a constant


def _inverse_sqrt(flow: Flow, r) -> bool:
    """`rsqrt(v)`, `pow(v, -0.5)`, or a `sqrt(v)` that divides something (`x / jnp.sqrt(v)`): one
    form, the reciprocal square root a norm scales by."""
    if r.opcode == "rsqrt":
        return True
    if r.opcode == "power":
        return scalar(flow.g, flow.g.operand(r, 1)) == -0.5
    if r.opcode != "sqrt":
        return False
    frontier, seen = [r], {id(r)}
    for _ in range(4):
        nxt = []
        for i in frontier:
            for u in flow.g.users(i):
                if u.opcode == "divide" and flow.g.operand(u, 1) is i:
                    return True
                if u.opcode in TRANSPARENT | {"broadcast"} and id(u) not in seen:
                    seen.add(id(u))
                    nxt.append(u)
        frontier = nxt
    return False


def _epsilon(flow: Flow, path) -> float | None:
    """The constant added to the mean square on the way to the square root."""
    for op in path:
        if op.opcode != "add":
            continue
        for o in flow.g.operands(op):
            v = scalar(flow.g, o)
            if v is not None and 0 < v < 1e-2:
                return v
    return None


def _find(flow: Flow) -> list[PatternMatch]:
    out = []
    for r in flow.g.instructions:
        if r.opcode not in ("rsqrt", "sqrt", "power") or not _inverse_sqrt(flow, r):
            continue
        # through the variance's own arithmetic; flax's LayerNorm writes it max(0, E[x^2] - E[x]^2)
        red, path = flow.back(r, TRANSPARENT | {"add", "multiply", "divide", "broadcast", "subtract", "maximum"},
                              lambda o: o.opcode == "reduce" and reducer_is(flow.m, o, "add"), depth=10)
        if red is None or not red.dimensions:
            continue
        sq = flow.g.source(flow.g.operand(red, 0))
        if sq is None or sq.opcode != "multiply":
            continue
        a, b = (flow.g.source(flow.g.operand(sq, k)) for k in (0, 1))
        if a is None or a is not b:
            continue
        # LayerNorm: the square of x - mean, or E[x^2] minus the squared mean on the way to the root
        layer = a.opcode == "subtract" or any(p.opcode == "subtract" for p in path)
        x = flow.g.source(flow.g.operand(a, 0)) if a.opcode == "subtract" else a
        red_dims = dims(red) and dims(flow.g.operand(red, 0))
        hidden = 1
        for d in red.dimensions:
            hidden *= red_dims[d] if d < len(red_dims) else 1
        rows = max(1, elems(red_dims) // max(1, hidden))
        notes = []
        residual = x is not None and x.opcode == "add" and all(dims(o) == dims(x) for o in flow.g.operands(x))
        if residual:
            notes.append("with the residual add before it")
        covered = [red, sq, *path, *flow.forward(r, TRANSPARENT | {"broadcast"},
                                                 lambda u: u.opcode == "multiply", depth=3)[1]]
        if residual:
            covered.append(x)
        shapes = NormShapes(rows=rows, hidden=hidden, dtype=etype(x) if x is not None else etype(sq),
                            eps=_epsilon(flow, path))
        out.append(flow.match(LAYERNORM if layer else RMSNORM, [r], covered, shapes, notes, instance=red))
    return dedupe(out)


class _Norm(Detector):
    def find(self, flow: Flow) -> list[PatternMatch]:
        return [m for m in flow.once("norms", _find) if m.detector is self]

    def bound(self, shapes: NormShapes, chip, backward: bool = False) -> float | None:
        nbytes = 2.0 * stored_bytes(shapes.dtype) * shapes.rows * shapes.hidden
        flops = 4.0 * shapes.rows * shapes.hidden
        return roofline_s(nbytes, flops, chip, backward)


class RmsNorm(_Norm):
    name = "rmsnorm"
    kernel = "rmsnorm"


class LayerNorm(_Norm):
    name = "layernorm"
    no_kernel = "no bundled kernel for layernorm"


RMSNORM, LAYERNORM = RmsNorm(), LayerNorm()
