"""Activation-quantized matmul (W8A8): a matmul of two int8 (or two e4m3) operands, one of them float
activations quantized in the program (a `convert` to s8 or f8e4m3fn from a float, after the round
or the clip).

Reads a `walk.Flow`; returns `PatternMatch`es with `W8A8Shapes`. The quantize fusion (the absmax
reduce, the divide, round, clip, convert) is part of the pattern: a kernel does it in VMEM. The
int8 weight side is the other operand; its load (`Flow.load`: the TPU compiler's prefetch of the
weights into VMEM) is the pattern's too, since a kernel streams the weights itself. It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import MATMUL, TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, etype

_FLOAT = ("bf16", "f16", "f32")
_QUANT = {"s8": "int8", "f8e4m3fn": "e4m3"}  # operand type -> its name in the notes
# What sits between the quantizing convert and the matmul in the TPU compiler's output: layout
# copies and the fusions that hold them.
_BETWEEN = TRANSPARENT - {"convert"} | {"fusion"}


@dataclass(frozen=True)
class W8A8Shapes(Shapes):
    activations: tuple[int, ...]  # [M, K], quantized per token
    weight: tuple[int, ...]  # [K, N] int8
    out: tuple[int, ...]  # [M, N]
    dtype: str  # the layer's output type
    quant_dtype: str = "s8"  # what both operands are: s8, or f8e4m3fn (an fp8 checkpoint)


class ActQuantMatmul(Detector):
    name = "w8a8_matmul"
    kernel = "w8a8_matmul"
    matmul_work = True

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []

        for d in flow.g.instructions:
            if d.opcode not in MATMUL:
                continue
            ops = flow.g.operands(d)[:2]
            qt = etype(ops[0]) if ops else ""
            if len(ops) != 2 or qt not in _QUANT or etype(ops[1]) != qt:
                continue

            def quantizes(t, qt=qt) -> bool:
                return t.opcode == "convert" and etype(t) == qt and etype(flow.g.operand(t, 0) or t) in _FLOAT

            for side, o in enumerate(ops):
                cv, path = (o, []) if quantizes(o) else flow.back(o, _BETWEEN, quantizes, depth=6)
                if cv is None:
                    continue
                # the quantize's own ops: the scale (a reduce of |x|), the divide, round and clip
                _, quant = flow.back(cv, frozenset({"clamp", "round-nearest-even", "round-nearest-afz", "divide",
                                                    "multiply", "broadcast", "convert", "reduce", "abs"}),
                                     lambda t: False, depth=8)
                w = ops[1 - side]
                a = flow.g.operand(cv, 0) or cv
                # the layer's output: what the op holding the matmul (its fusion, with the scales) makes
                shapes = W8A8Shapes(activations=tuple(dims(a)), weight=tuple(dims(w)), out=tuple(dims(d)),
                                    dtype=etype(flow.g.top(d)), quant_dtype=qt)
                kind = _QUANT[qt]
                out.append(flow.match(self, [d, cv], [*path, *quant, *flow.load(w)], shapes,
                                      [f"activations quantized to {kind} in the program (a separate pass over "
                                       f"HBM), then an {kind} x {kind} matmul"]))
                break
        return dedupe(out)

    def bound(self, shapes: W8A8Shapes, chip, backward: bool = False) -> float | None:
        (m, k), (n,) = shapes.activations[-2:], shapes.out[-1:]
        nbytes = k * n * 1 + 2.0 * (m * k + m * n)
        flops = 2.0 * m * k * n
        # int8 (e4m3) runs at the chip's int8 (fp8) rate where it has one
        rate = "peak_int8_ops_per_s" if shapes.quant_dtype == "s8" else "peak_fp8_flops_per_s"
        peak = getattr(chip, rate, None) or chip.peak_bf16_flops_per_s
        return (3 if backward else 1) * max(nbytes / chip.hbm_bytes_per_s, flops / peak)


ACT_QUANT_MATMUL = ActQuantMatmul()
