"""Rotary position embedding, in any of its spellings.

Reads a `walk.Flow`; returns `PatternMatch`es with `RopeShapes`. One form: `x * T1 + rotate(x) * T2`
(or its difference), where T1 and T2 are position tables broadcast over the heads and `rotate(x)`
is x's halves or pairs rearranged (slices, negation, a concatenate, or XLA's pad-and-maximum
rewrite of one). A table is cos/sin computed in place, a constant (a table computed on the host or
constant-folded by XLA, as transformers' `jnp.take(embed_positions, position_ids)` is), a gather or
slice of one, or a parameter. The layout is `half` (GPT-NeoX, Llama: the two halves of the head
dimension) or `interleaved` (GPT-J: even and odd elements), read from the slices. It prices
nothing and does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s, stored_bytes
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, etype

# From a multiply to its position table; `select`: a gather's out-of-bounds fill (`jnp.take(..., mode="fill")`);
# `pad` and `maximum`: XLA's rewrite of a concatenate (`concatenate([sin, sin])`).
_TABLE_PATH = TRANSPARENT | {"broadcast", "slice", "gather", "dynamic-slice", "concatenate", "pad", "maximum", "select"}
_TABLE_ROOTS = ("cosine", "sine", "constant", "parameter")
# rotate(x): x's halves or pairs moved and negated (XLA writes a concatenate as pads and a maximum)
_ROTATE_PATH = TRANSPARENT | {"slice", "pad", "maximum", "negate", "concatenate", "select"}


@dataclass(frozen=True)
class RopeShapes(Shapes):
    shape: tuple[int, ...]  # the rotated tensor
    dtype: str
    layout: str = "half"  # half | interleaved | unknown


def _table(flow: Flow, o) -> bool:
    """A position table: it reaches cos/sin, a constant or a parameter through broadcasts, slices and
    gathers, and is broadcast over at least one dimension (the heads)."""
    if o.opcode in ("cosine", "sine"):
        return True
    root, path = flow.back(o, _TABLE_PATH, lambda t: t.opcode in _TABLE_ROOTS, depth=8)
    if root is None:
        return False
    walked = [o, *path]
    return root.opcode in ("cosine", "sine") or any(p.opcode == "broadcast" and len(dims(p)) > len(
        dims(flow.g.operand(p, 0) or p)) for p in walked)


def _split(flow: Flow, m):
    """(data, table) operands of a multiply by a position table, or None."""
    ops = flow.g.operands(m)
    if len(ops) != 2:
        return None
    a, b = ops
    if _table(flow, b) and not _table(flow, a):
        return a, b
    if _table(flow, a) and not _table(flow, b):
        return b, a
    return None


def _ancestors(flow: Flow, o, depth: int = 16) -> tuple[dict, list]:
    """The ops `o` is computed from through `_ROTATE_PATH` (id -> op), and the slices among them."""
    seen, frontier, slices = {id(o): o}, [o], []
    for _ in range(depth):
        nxt = []
        for i in frontier:
            if i.opcode == "slice":
                slices.append(i)
            if i.opcode not in _ROTATE_PATH and i is not o:
                continue
            for p in flow.g.operands(i):
                if id(p) not in seen:
                    seen[id(p)] = p
                    nxt.append(p)
        frontier = nxt
    return seen, slices


def _layout(flow: Flow, slices) -> str:
    """`interleaved` where x's pairs are taken by stride-2 slices, `half` where each slice takes half
    of the dimension it slices, else `unknown`."""
    strides = {s.slice[-1][2] for s in slices if s.slice}
    if 2 in strides:
        return "interleaved"

    def halves(s) -> bool:
        whole = dims(flow.g.operand(s, 0) or s)
        return bool(s.slice and whole) and (s.slice[-1][1] - s.slice[-1][0]) * 2 == whole[-1]

    if slices and all(halves(s) for s in slices):
        return "half"
    return "unknown"


class Rope(Detector):
    name = "rope"
    no_kernel = "rope takes q and k together at [B, S, H, D]; one rotated tensor alone is not priced"

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []
        for c in flow.g.instructions:
            if c.opcode not in ("add", "subtract"):
                continue
            muls = [flow.g.source(o) for o in flow.g.operands(c)]
            if len(muls) != 2 or any(m is None or m.opcode != "multiply" for m in muls):
                continue
            parts = [_split(flow, m) for m in muls]
            if None in parts:
                continue
            (d1, t1), (d2, t2) = parts
            anc1, sl1 = _ancestors(flow, d1)
            anc2, sl2 = _ancestors(flow, d2)
            shared = [o for k, o in anc1.items() if k in anc2 and o.opcode not in _ROTATE_PATH | {"constant"}]
            if not shared or t1 is t2:
                continue
            x = shared[0]
            in_place = any(flow.back(t, _TABLE_PATH, lambda o: o.opcode in ("cosine", "sine"), depth=8)[0]
                           is not None or t.opcode in ("cosine", "sine") for t in (t1, t2))
            shapes = RopeShapes(shape=tuple(dims(c)), dtype=etype(x), layout=_layout(flow, sl1 + sl2))
            note = "cos and sin computed in place" if in_place else "cos and sin read from a table"
            # one instance per rotated tensor: its projection's weight, in the forward and in a recomputation
            out.append(flow.match(self, [muls[0]], [muls[1], c], shapes, [note, f"{shapes.layout} rotation"],
                                  instance=flow.weights(x, depth=4) or x))
        return dedupe(out)

    def bound(self, shapes: RopeShapes, chip, backward: bool = False) -> float | None:
        return roofline_s(2.0 * stored_bytes(shapes.dtype) * math.prod(shapes.shape), 0.0, chip, backward)


ROPE = Rope()
