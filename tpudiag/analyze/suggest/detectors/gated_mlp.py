"""Gated MLP (SwiGLU, GeGLU): `down(act(x @ W_gate) * (x @ W_up))`, act silu or gelu.

Reads a `walk.Flow`; returns `PatternMatch`es with `GatedMlpShapes`. The anchor is the `multiply` of
the two branches: one operand a matmul (up), the other an elementwise function of a second matmul of
the same shape (gate) through a nonlinearity, and the product feeds a third matmul (down) whose weight
is a plain 2-D matrix (an expert stack's 3-D weights are the MoE detector's). XLA spells silu as
`logistic` or as `x * 1 / (1 + exp(-x))`, gelu through `tanh` (approximate), `erf`, or the exp of
the polynomial XLA:CPU expands `erfc` to (exact gelu as jax writes it); either way the
activation multiplies the gate by a function of it, which a gradient through a plain activation
(`d_h * tanh'(g)`, also a matmul times a function of a matmul) does not. The gradient's
`d_up = d_h * act(gate)` has the same shape and is matched too: its ops are the pattern's backward.

Tokens, hidden and intermediate come from the down matmul: its input holds tokens x intermediate
elements, its weight hidden x intermediate, with the intermediate size the input's last dimension.
It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import MATMUL, TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s, stored_bytes
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems

# The activation's elementwise ops between the gate matmul and the product with up; select, compare
# and abs are the branches of the erfc that exact gelu (`x * erfc(-x / sqrt(2)) / 2`) expands to.
_ACT_PATH = TRANSPARENT | {"multiply", "add", "subtract", "divide", "negate", "broadcast", "maximum", "minimum",
                           "select", "compare", "abs", "clamp"}
_SILU = frozenset({"logistic", "exponential"})
_GELU = frozenset({"tanh", "erf"})
# Steps walked inside the activation: XLA:CPU rounds a bf16 silu to bf16 after every op (a convert
# pair each), so its exp sits a dozen steps from the gate matmul; an expanded erfc is deeper still.
_DEPTH = 24


@dataclass(frozen=True)
class GatedMlpShapes(Shapes):
    tokens: int
    hidden: int
    intermediate: int
    dtype: str  # the matmuls' inputs as stored


class GatedMlp(Detector):
    name = "gated_mlp"
    no_kernel = ("no bundled kernel fuses a gated MLP (tpudiag kernels list); XLA's three matmuls are priced "
                 "against the pattern's roofline bound")
    matmul_work = True

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []
        for mul in flow.g.instructions:
            if mul.opcode != "multiply":
                continue
            branches = [flow.g.source(o) for o in flow.g.operands(mul)]
            if len(branches) != 2 or any(b is None for b in branches):
                continue
            for act, up in (branches, branches[::-1]):
                m = self._one(flow, mul, act, up)
                if m is not None:
                    out.append(m)
                    break
        return dedupe(out)

    def _one(self, flow: Flow, mul, act, up) -> PatternMatch | None:
        if up.opcode not in MATMUL or act.opcode in MATMUL or act.opcode not in _ACT_PATH | _SILU | _GELU:
            return None
        nl, act_path = (act, []) if act.opcode in _SILU | _GELU else \
            flow.back(act, _ACT_PATH, lambda o: o.opcode in _SILU | _GELU, depth=_DEPTH)
        if nl is None:
            return None
        gate, gate_path = flow.back(nl, _ACT_PATH, lambda o: o.opcode in MATMUL, depth=_DEPTH)
        if gate is None or gate is up or dims(gate) != dims(up):
            return None
        # silu(g) = g * sigmoid(g) and gelu(g) = g * Phi(g) multiply g itself by its nonlinearity; a
        # gradient through a plain activation (d_h * tanh'(g)) does not, and is no gated MLP.
        if not any(c.opcode == "multiply" and any(flow.g.source(o) is gate for o in flow.g.operands(c))
                   for c in [act, *act_path]):
            return None
        down, down_path = flow.forward(mul, TRANSPARENT, lambda u: u.opcode in MATMUL, depth=8)
        if down is None:
            return None
        h = dims(mul)
        w = next((o for o in flow.g.operands(down) if flow.g.source(o) is not mul), None)
        w_dims = tuple(d for d in dims(w) if d != 1) if w is not None else ()
        if not h or len(w_dims) != 2 or h[-1] not in w_dims:
            return None
        intermediate = h[-1]
        hidden = w_dims[1] if w_dims[0] == intermediate else w_dims[0]
        tokens = elems(h) // intermediate
        # sigmoid(g) is logistic(g) or 1 / (1 + exp(-g)); an exp of anything else is erfc's (gelu).
        neg = flow.g.source(flow.g.operand(nl, 0)) if nl.opcode == "exponential" else None
        silu = nl.opcode == "logistic" or neg is not None and neg.opcode == "negate" \
            and flow.g.source(flow.g.operand(neg, 0)) is gate
        shapes = GatedMlpShapes(tokens=tokens, hidden=hidden, intermediate=intermediate,
                                dtype=flow.stored_dtype(up))
        notes = ["SwiGLU: silu(x @ W_gate) * (x @ W_up)" if silu else "GeGLU: gelu(x @ W_gate) * (x @ W_up)",
                 "the bound reads each weight once and computes the three matmuls at the bf16 peak"]
        return flow.match(self, [mul, gate, up, down], [nl, *act_path, *gate_path, *down_path], shapes, notes)

    def bound(self, shapes: GatedMlpShapes, chip, backward: bool = False) -> float | None:
        t, d, f = shapes.tokens, shapes.hidden, shapes.intermediate
        flops = 3 * 2.0 * t * d * f  # gate, up and down
        nbytes = stored_bytes(shapes.dtype) * (3.0 * d * f + 2.0 * t * d)  # the three weights, x and the output
        return roofline_s(nbytes, flops, chip, backward)


GATED_MLP = GatedMlp()
