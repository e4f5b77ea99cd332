"""Mixture-of-experts dispatch.

Reads a `walk.Flow`; returns `PatternMatch`es: `ragged-dot` (XLA's own grouped matmul; already
replaced where libtpu lowered it to its custom call) with `RaggedDotShapes`, or matmuls fed by a
one-hot (a compare against an iota) over at most `MOE_MAX_EXPERTS` experts, with an expert dimension
of their own, with `DenseDispatchShapes`. It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.cost import op_cost
from tpudiag.analyze.hlo.vocabulary import TRANSPARENT, is_gradient
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, etype

MOE_MAX_EXPERTS = 256  # a one-hot over more "experts" is a one-hot of labels or tokens, not a router


@dataclass(frozen=True)
class RaggedDotShapes(Shapes):
    dtype: str


@dataclass(frozen=True)
class DenseDispatchShapes(Shapes):
    tokens: int
    experts: int
    matmuls: int
    dtype: str
    # For a bound: the dense dispatch's FLOPs, and its expert weights (each matmul's largest operand)
    # that any kernel must read once.
    dense_flops: float
    weight_bytes: int
    top_k: int = 1  # experts per token, from the router's top-k (1 where none is found)


class Moe(Detector):
    name = "moe"
    no_kernel = ("grouped_matmul needs the tokens sorted by expert with group sizes; a dense one-hot dispatch has to "
                 "be rewritten around it first (tpudiag kernels show grouped_matmul)")
    matmul_work = True

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []
        for d in flow.g.instructions:
            if d.opcode == "ragged-dot" or (d.opcode == "custom-call" and "ragged" in (d.custom_call_target or "")
                                             + d.name):
                out.append(flow.match(self, [d], [], RaggedDotShapes(dtype=etype(d)), ["ragged_dot"],
                                      replaced="ragged-dot" if d.opcode == "custom-call" else None))
        for c in flow.g.instructions:
            if c.opcode != "compare" or c.attributes.get("direction") != "EQ":
                continue
            iota = flow.back(c, TRANSPARENT | {"broadcast"}, lambda t: t.opcode == "iota", depth=3)[0]
            if iota is None:
                continue
            cd = dims(c)
            experts = cd[iota.attributes and int(iota.attributes.get("iota_dimension", "0"))] \
                if cd and dims(iota) == cd else max(cd, default=1)
            # Experts are few and get a dimension of their own in the dispatched activations: a one-hot of
            # labels (a loss over classes) has neither.
            dispatch = [d for d in flow.reachable(c, flow.is_matmul, depth=16)
                        if len(dims(d)) >= 3 and experts in dims(d)]
            # The forward's matmuls carry the work a routed kernel does; a training step's gradient
            # matmuls (JAX's `transpose(jvp(...))`) are its ops too, priced by the backward factor.
            forward = [d for d in dispatch if not is_gradient(d)]
            if experts > MOE_MAX_EXPERTS or not forward:
                continue
            k = _top_k(flow, c, iota, experts)
            shapes = DenseDispatchShapes(
                tokens=max((x for x in cd if x not in (experts, k)), default=1), experts=experts,
                matmuls=len(forward), dtype=etype(forward[0]),
                dense_flops=sum(op_cost(flow.m, d).flops for d in forward),
                weight_bytes=sum(max((o.parsed_shape.bytes for o in flow.g.operands(d) if o.parsed_shape.is_array),
                                     default=0) for d in forward), top_k=k)
            routed = "read from the router" if k > 1 else "no top-k found: the least any routing computes"
            notes = [(f"dispatch by a dense one-hot over {experts} experts: every token goes through every expert's "
                      f"matmul, masked ({experts / k:.3g}x the FLOPs of top-{k} routing)"),
                     (f"the bound routes each token to its {k} expert{'s' if k > 1 else ''} (top-{k}, {routed}) "
                      "and reads each expert's weights once")]
            out.append(flow.match(self, [c, *forward], [d for d in dispatch if d not in forward], shapes, notes))
        return dedupe(out)

    def bound(self, shapes: Shapes, chip, backward: bool = False) -> float | None:
        if not isinstance(shapes, DenseDispatchShapes):
            return None  # a ragged-dot's shapes do not say how much it computes
        # Routed, each token goes through its k experts instead of all of them; the expert weights
        # are read at least once. `dense_flops` is the forward's: the backward factor adds the gradient.
        flops = shapes.dense_flops * max(1, shapes.top_k) / max(1, shapes.experts)
        return roofline_s(float(shapes.weight_bytes), flops, chip, backward)


def _top_k(flow: Flow, compare, iota, experts: int) -> int:
    """Experts per token: the last dimension of the expert indices the one-hot compares against (a
    `[tokens, k]` array from the router's top-k), 1 where they have none."""
    for o in flow.g.operands(compare):
        if o is iota:
            continue
        src = flow.g.source(o, TRANSPARENT | {"broadcast"})
        d = dims(src) if src is not None else ()
        if src is not None and src.opcode not in ("iota", "constant") and len(d) >= 2 and 1 < d[-1] < experts:
            return d[-1]
    return 1


MOE = Moe()
