"""Mixture-of-experts dispatch.

Reads a `walk.Flow`; returns `PatternMatch`es: `ragged-dot` (XLA's own grouped matmul; already
replaced where libtpu lowered it to its custom call) with `RaggedDotShapes`, or a dense dispatch
over at most `MOE_MAX_EXPERTS` experts with `DenseDispatchShapes`: every expert's matmul computes
every token, and the routing masks either the inputs (a one-hot, a compare against an iota; the
matmuls downstream of it) or the outputs (the router's top-k weights scattered into zeros, one slot
per expert, then a combine matmul; the matmuls that compute its operands). It prices nothing and
does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.cost import op_cost
from tpudiag.analyze.hlo.evaluate import scalar
from tpudiag.analyze.hlo.vocabulary import TRANSPARENT, is_gradient
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems, etype

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
    # The experts' model and feed-forward widths, from their weights ([E, D, F] up, [E, F, D] down):
    # 0 where the weights do not show them.
    hidden: int = 0
    ffn: int = 0


class Moe(Detector):
    name = "moe"
    kernel = "fused_moe"  # routes, sorts and runs the experts itself (at_shapes says where it does not fit)
    matmul_work = True

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []
        for d in flow.g.instructions:
            if d.opcode == "ragged-dot" or (d.opcode == "custom-call" and "ragged" in (d.custom_call_target or "")
                                             + d.name):
                out.append(flow.match(self, [d], [], RaggedDotShapes(dtype=etype(d)), ["ragged_dot"],
                                      replaced="ragged-dot" if d.opcode == "custom-call" else None))
        for r in flow.g.instructions:
            routing = _one_hot(flow, r) or _scattered(flow, r)
            if routing is None:
                continue
            experts, k, how = routing
            # Experts are few and get a dimension of their own in the dispatched activations: a one-hot of
            # labels (a loss over classes) has neither. A one-hot masks the experts' inputs (its matmuls are
            # downstream); scattered router weights mask their outputs in a combine matmul, whose operands
            # the experts' matmuls compute (upstream, not the router's own: it computed the weights).
            # (a combine is the first matmul after the weights: further down is the next layer's)
            dispatch = [d for d in flow.reachable(r, flow.is_matmul, depth=16 if how == "one-hot" else 6)
                        if _touches(flow, d, experts)]
            if how == "scatter":
                dispatch += [d for d in _experts_upstream(flow, dispatch, experts, flow.ancestors(r))
                             if d not in dispatch]
                dispatch += [d for d in _gradients_at(flow, dispatch, experts) if d not in dispatch]
            # The forward's matmuls carry the work a routed kernel does; a training step's gradient
            # matmuls (JAX's `transpose(jvp(...))`) are its ops too, priced by the backward factor.
            forward = [d for d in dispatch if not is_gradient(d) and len(dims(d)) >= 3]
            if not forward:
                continue
            tokens = max((elems(dims(d)) // max(1, experts * dims(d)[-1]) for d in forward if experts in dims(d)),
                         default=1)
            shapes = DenseDispatchShapes(
                tokens=tokens, experts=experts, matmuls=len(forward), dtype=etype(forward[0]),
                dense_flops=sum(op_cost(flow.m, d).flops for d in forward),
                weight_bytes=sum(max((o.parsed_shape.bytes for o in flow.g.operands(d) if o.parsed_shape.is_array),
                                     default=0) for d in forward), top_k=k, **_widths(flow, forward, experts))
            routed = "read from the router" if k > 1 else "no top-k found: the least any routing computes"
            spelled = ("a dense one-hot" if how == "one-hot" else
                       "router weights scattered into every expert's slot (zero for the unrouted)")
            notes = [(f"dispatch by {spelled} over {experts} experts: every token goes through every expert's "
                      f"matmul, masked ({experts / k:.3g}x the FLOPs of top-{k} routing)"),
                     (f"the bound routes each token to its {k} expert{'s' if k > 1 else ''} (top-{k}, {routed}) "
                      "and reads each expert's weights once")]
            out.append(flow.match(self, [r, *forward], [d for d in dispatch if d not in forward], shapes, notes,
                                  instance=",".join(sorted(flow.weights(d) for d in forward))))
        return dedupe(out)

    def bound(self, shapes: Shapes, chip, backward: bool = False) -> float | None:
        if not isinstance(shapes, DenseDispatchShapes):
            return None  # a ragged-dot's shapes do not say how much it computes
        # Routed, each token goes through its k experts instead of all of them; the expert weights
        # are read at least once. `dense_flops` is the forward's: the backward factor adds the gradient.
        flops = shapes.dense_flops * max(1, shapes.top_k) / max(1, shapes.experts)
        return roofline_s(float(shapes.weight_bytes), flops, chip, backward)


def _widths(flow: Flow, forward: list, experts: int) -> dict:
    """{"hidden": D, "ffn": F} from the experts' weights (each forward matmul's operand with an
    expert dimension that is a parameter of the module, through layout ops; else its largest, which
    at a prefill's token count may be the activations): the up and gate weights are [E, D, F], the
    down weight [E, F, D], so the most common (first, second) pair of non-expert dimensions is
    (D, F); {} where no weight has two."""
    def is_param(o) -> bool:
        src = flow.g.source(o, TRANSPARENT)
        return src is not None and src.opcode == "parameter"

    pairs = []
    for d in forward:
        w = max((o for o in flow.g.operands(d) if o.parsed_shape.is_array and experts in dims(o)),
                key=lambda o: (is_param(o), o.parsed_shape.bytes), default=None)
        rest = list(dims(w)) if w is not None else []
        if experts in rest:
            rest.remove(experts)
        if len(rest) == 2:
            pairs.append(tuple(rest))
    if not pairs:
        return {}
    hidden, ffn = max(pairs, key=pairs.count)
    return {"hidden": hidden, "ffn": ffn}


def _one_hot(flow: Flow, c):
    """(experts, k, "one-hot") of a compare of the router's expert indices against an iota, else None."""
    if c.opcode != "compare" or c.attributes.get("direction") != "EQ":
        return None
    iota = flow.back(c, TRANSPARENT | {"broadcast"}, lambda t: t.opcode == "iota", depth=3)[0]
    if iota is None:
        return None
    cd = dims(c)
    experts = cd[iota.attributes and int(iota.attributes.get("iota_dimension", "0"))] \
        if cd and dims(iota) == cd else max(cd, default=1)
    if experts > MOE_MAX_EXPERTS:
        return None
    return experts, _top_k(flow, c, iota, experts), "one-hot"


def _scattered(flow: Flow, s):
    """(experts, k, "scatter") of the router's top-k weights scattered into zeros, one slot per expert
    (MaxText's `update_weights.at[...].set(top_k_weights)`): `[tokens, k]` updates into
    `tokens x experts` elements, else None."""
    if s.opcode != "scatter":
        return None
    ops = flow.g.operands(s)
    if len(ops) != 3 or scalar(flow.g, ops[0]) != 0.0:
        return None
    upd = dims(ops[2])
    if len(upd) < 2 or not 1 < upd[-1] <= 16:
        return None
    k, tokens = upd[-1], elems(upd) // upd[-1]
    n = elems(dims(s))
    if not tokens or n % tokens or not k < n // tokens <= MOE_MAX_EXPERTS:
        return None
    return n // tokens, k, "scatter"


def _experts_upstream(flow: Flow, combine: list, experts: int, exclude: set, depth: int = 24) -> list:
    """The matmuls with an expert dimension that compute the combine matmuls' operands, through the
    activation between the up and down projections; none of `exclude` (the router's)."""
    out, frontier, seen = [], list(combine), {id(c) for c in combine} | exclude
    for _ in range(depth):
        nxt = []
        for i in frontier:
            for o in flow.g.operands(i):
                if id(o) in seen:
                    continue
                seen.add(id(o))
                if flow.is_matmul(o):
                    if experts not in dims(o):
                        continue
                    out.append(o)
                nxt.append(o)
        frontier = nxt
    return out


def _touches(flow: Flow, d, experts: int) -> bool:
    """A matmul with an expert dimension in its result or an operand (a combine contracts it away)."""
    return experts in dims(d) or any(experts in dims(o) for o in flow.g.operands(d))


def _gradients_at(flow: Flow, forward: list, experts: int) -> list:
    """The gradient matmuls with an expert dimension that JAX emitted at the forward matmuls' source
    lines (the transposes of those einsums): the training step's share of the dispatch."""
    lines = {flow.m.call_site(d)[0] for d in forward} - {None}
    return [d for d in flow.g.instructions if flow.is_matmul(d) and is_gradient(d)
            and _touches(flow, d, experts) and flow.m.call_site(d)[0] in lines]


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
