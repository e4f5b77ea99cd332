"""Softmax cross-entropy over a large vocabulary.

Reads a `walk.Flow`; returns `PatternMatch`es with `CrossEntropyShapes`: a `log` of a row sum of
exponentials (or of its absolute value, as `jax.nn.logsumexp` writes it) over at least `VOCAB_MIN`
classes (a log-softmax or logsumexp), with the labels picked by a gather or a one-hot compare. A row
sum logged twice (MaxText's z-loss reads the logsumexp again) is one match. It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import MATMUL, TRANSPARENT
from tpudiag.analyze.suggest.detectors.attention import SCORES_PATH
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems, etype, reducer_is

VOCAB_MIN = 8192  # classes: below this a plain log-softmax is cheap next to the matmul that made the logits


@dataclass(frozen=True)
class CrossEntropyShapes(Shapes):
    rows: int
    vocab: int
    dtype: str


def _label_pick(flow: Flow, logits, vocab: int):
    """How the labels are picked from the log-probabilities of `logits`: a gather from them
    (`take_along_axis`), or a one-hot over the vocabulary (a compare) multiplied into them. Not any
    gather over a vocabulary-sized table: the embedding lookup is one too."""
    for cand in flow.g.instructions:
        if cand.opcode == "gather" and vocab in dims(flow.g.operand(cand, 0) or cand) \
                and flow.depends_on(flow.g.operand(cand, 0), logits, depth=12):
            return cand
        if cand.opcode == "compare" and vocab in dims(cand):
            for m in flow.reachable(cand, lambda u: u.opcode == "multiply", depth=4):
                if any(o is not cand and flow.depends_on(o, logits, depth=12) for o in flow.g.operands(m)):
                    return cand
    return None


class CrossEntropy(Detector):
    name = "cross_entropy"
    kernel = "cross_entropy"

    def find(self, flow: Flow) -> list[PatternMatch]:
        out = []
        logs: dict[int, list] = {}  # row sum -> the logs of it: one cross-entropy however often it is logged
        for lg in flow.g.instructions:
            if lg.opcode != "log":
                continue
            # `log(abs(sum))`: jax's logsumexp (and optax's losses through it) takes the sign apart
            red, _ = flow.back(lg, TRANSPARENT | {"add", "broadcast", "abs"},
                               lambda o: o.opcode == "reduce" and reducer_is(flow.m, o, "add"), depth=4)
            if red is not None and red.dimensions:
                logs.setdefault(id(red), [red]).append(lg)
        for red, lg, *more in logs.values():
            ex = flow.g.source(flow.g.operand(red, 0))
            if ex is None or ex.opcode != "exponential":
                continue
            ex_dims = dims(ex)
            vocab = ex_dims[red.dimensions[-1]] if ex_dims else 0
            if vocab < VOCAB_MIN:
                continue
            logits = flow.back(ex, SCORES_PATH, lambda o: o.opcode in MATMUL, depth=8)[0]
            pick = _label_pick(flow, logits if logits is not None else ex, vocab)
            notes = [f"vocabulary {vocab}"]
            if logits is not None:
                notes.append("logits from a matmul in the same module (an LM head)")
            notes.append("labels picked by " + (pick.opcode if pick is not None else "no gather or one-hot found"))
            shapes = CrossEntropyShapes(rows=max(1, elems(ex_dims) // vocab), vocab=vocab, dtype=etype(ex))
            # The log-probabilities themselves (`logits - logsumexp` over the vocabulary): a log-softmax
            # written to memory whole, then picked from, is the pass over the logits the kernel saves.
            logp = flow.reachable(lg, lambda u: u.opcode == "subtract" and vocab in dims(u), depth=4)
            out.append(flow.match(self, [lg, red, ex], [*more, *logp, *(p for p in (pick,) if p is not None)],
                                  shapes, notes))
        return dedupe(out)

    def bound(self, shapes: CrossEntropyShapes, chip, backward: bool = False) -> float | None:
        nbytes = 2.0 * shapes.rows * shapes.vocab  # the bf16 logits, read once
        flops = 4.0 * shapes.rows * shapes.vocab
        return roofline_s(nbytes, flops, chip, backward)


CROSS_ENTROPY = CrossEntropy()
