"""What an attention's mask is: none, causal (with its diagonal offset), a sliding window (its
width), one that depends on the program's inputs (padding, a decode position), some other pattern
(document or block masks), or unknown.

A mask is read wherever the scores pass on their way from the QK matmul to the softmax's `exp`: a
`select` between the scores and a large negative fill (`jnp.where(mask, s, -inf)`), or an `add` (or
`subtract`) of a bias whose values are 0 and a large negative number (transformers' `lax.select(mask > 0, 0,
finfo.min)`, `jnp.tril` turned into a bias, ...). The mask's own ops are evaluated with numpy
(`analyze.hlo.evaluate`), so every spelling that builds the same matrix from iotas and constants
reads as the same kind; the matrix's query and key axes are the scores' last two. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpudiag.analyze.hlo.evaluate import evaluate

# A bias at or below this masks its key out (finfo(bf16).min, -1e9, -inf all are); a pure mask's
# other values are 0.
_MASKED_BELOW = -1e4


@dataclass(frozen=True)
class Mask:
    kind: str  # none | causal | window | inputs | other | unknown
    offset: int = 0  # causal and window: query i sees keys j <= i + offset
    window: int = 0  # window: and keys j > i + offset - window
    detail: str = ""  # inputs: what it reads; unknown: what could not be read
    beneath: str = ""  # inputs: the mask with every input at 1 (causal, a window), where it is one

    def describe(self) -> str:
        if self.kind == "none":
            return "no mask"
        if self.kind == "causal":
            return "causal mask" + (f" (diagonal offset {self.offset})" if self.offset else "")
        if self.kind == "window":
            return f"sliding-window mask of {self.window} keys" + (f" (offset {self.offset})" if self.offset else "")
        if self.kind == "inputs":
            return (f"a mask computed from the program's inputs ({self.detail}: padding, packed-sequence segments "
                    "or a decode position)" + (f"; {self.beneath} where the inputs mask nothing" if self.beneath else ""))
        if self.kind == "other":
            return "a mask that is neither causal nor a sliding window (a document or block mask)"
        return f"a mask tpudiag could not read ({self.detail})"


def classify(keep: np.ndarray) -> Mask:
    """The kind of a [queries, keys] boolean matrix (True: the query sees the key)."""
    if keep.all():
        return Mask("none")
    sq, sk = keep.shape
    q = np.arange(sq)[:, None]
    k = np.arange(sk)[None, :]
    last = np.where(keep.any(axis=1), sk - 1 - np.argmax(keep[:, ::-1], axis=1), -1)  # each row's last key seen
    offset = int(last[-1] - (sq - 1))
    if np.array_equal(keep, k <= q + offset):
        return Mask("causal", offset=offset)
    width = int(keep[-1].sum())
    if width and np.array_equal(keep, (k <= q + offset) & (k > q + offset - width)):
        return Mask("window", offset=offset, window=width)
    return Mask("other")


def _keep_of(array: np.ndarray, q_axis: int, k_axis: int) -> np.ndarray | None:
    """The [queries, keys] matrix of a mask broadcast over the scores; None where it differs between
    the other axes (heads, batch). q_axis < 0: the scores' query axis is not known; it is taken as
    the one before the last unless that is the keys' axis, where the scores have one query a row
    (decode scores [keys, heads] with the batch of one dropped)."""
    k_axis %= array.ndim
    if q_axis < 0:
        q_axis = array.ndim - 2
    if q_axis == k_axis:
        moved = np.moveaxis(array, k_axis, -1)[..., None, :]
    else:
        moved = np.moveaxis(array, (q_axis, k_axis), (-2, -1))
    # Only the axes the array really varies along are compared: a broadcast's repeats are views
    # (stride 0), and reshaping them together with the rest would copy them all.
    varies = tuple(slice(None) if n > 1 and s else 0 for n, s in zip(moved.shape[:-2], moved.strides[:-2]))
    flat = moved[varies].reshape(-1, *moved.shape[-2:])
    first = flat[0]
    if not all(np.array_equal(first, f) for f in flat[1:]):
        return None
    return first


def _beneath(flow, target, value, q_axis: int, k_axis: int) -> str:
    """The mask `value(target)` where the program's inputs mask nothing, when it is causal or a window
    there: every input at 1 (an all-ones padding mask, one segment) or at 0 (segment ids compared
    with a length). MaxText's causal-within-segments mask reads as causal."""
    for fill in (1, 0):
        ev = evaluate(flow.g, target, parameters=fill)
        if not ev.ok or ev.value.ndim < 2:
            return ""
        keep = _keep_of(ev.value, q_axis, k_axis)
        keep = None if keep is None else value(keep).astype(bool)
        if keep is None or not keep.any(axis=1).all():  # a query that sees no key: the inputs mask it
            continue
        kind = classify(keep)
        if kind.kind in ("causal", "window"):
            return kind.describe()
    return ""


def _axes_by_max(flow, chain: list, on_scores: set, shape: tuple, q_len: int) -> tuple[int, int] | None:
    """The query and key axes of an array of `shape` on the scores' path, read off the row max's
    subtraction there (`s - broadcast(m)`): the axis the broadcast adds is the keys', and the one other
    axis of the queries' length the queries'. None where the chain has no such subtraction."""
    for op in chain:
        if op.opcode != "subtract" or tuple(op.parsed_shape.dims) != tuple(shape):
            continue
        a, b = (flow.g.operand(op, k) for k in (0, 1))
        if a is None or b is None or id(a) not in on_scores or b.opcode != "broadcast":
            continue
        added = [d for d in range(len(shape)) if d not in (b.dimensions or ())]
        rest = [d for d in range(len(shape)) if d not in added and shape[d] == q_len]
        if len(added) == 1 and len(rest) == 1:
            return rest[0], added[0]
    return None


def read_mask(flow, qk, x, chain: list, q_axis: int, k_axis: int,
              frame: tuple | None = None) -> Mask:
    """The mask applied between the scores matmul `qk` and the `exp` `x`; `chain` are the ops walked
    between them (some are the mask's own); `frame`: the dims `q_axis` and `k_axis` index (the
    scores'): a mask applied in another order of them takes its axes from the row max's
    subtraction there (`_axes_by_max`)."""
    on_scores = {id(qk)}
    grown = True
    while grown:  # to a fixed point: ops inside fused computations have no program order to follow
        grown = False
        for op in (*chain, x):
            if id(op) not in on_scores and any(id(o) in on_scores for o in flow.g.operands(op)):
                on_scores.add(id(op))
                grown = True
    keeps, unread = [], []
    for op in chain:
        if id(op) not in on_scores or op.opcode not in ("select", "add", "subtract"):
            continue
        operands = flow.g.operands(op)
        if op.opcode == "select":
            if len(operands) != 3 or id(operands[0]) in on_scores:
                continue
            scores_true = id(operands[1]) in on_scores
            fill = evaluate(flow.g, operands[2] if scores_true else operands[1])
            target = operands[0]
            if fill.ok and np.all(fill.value <= _MASKED_BELOW):
                ev = evaluate(flow.g, target)
                value = (lambda a, t=scores_true: a if t else ~a.astype(bool))
            else:
                continue  # a select that is no mask (a clamp, a where on values)
        else:
            bias = [o for o in operands if id(o) not in on_scores]
            if len(bias) != 1 or flow.depends_on(bias[0], qk):
                continue
            target = bias[0]
            if op.opcode == "subtract" and target is not operands[1]:
                continue  # bias - scores is no mask
            sign = -1 if op.opcode == "subtract" else 1
            ev = evaluate(flow.g, target)
            if ev.ok and not np.all((ev.value == 0) | (sign * ev.value <= _MASKED_BELOW)):
                return Mask("other", detail="an additive bias with values other than 0 and -inf (ALiBi or "
                                            "relative positions)")
            value = (lambda a, sign=sign: sign * a > _MASKED_BELOW)
        if ev.reads:
            return Mask("inputs", detail=f"it reads {ev.reads}", beneath=_beneath(flow, target, value, q_axis, k_axis))
        if not ev.ok:
            unread.append(ev.unsupported or "?")
            continue
        if ev.value.ndim < 2:
            continue
        axes = None
        if frame is not None and tuple(ev.value.shape) != tuple(frame) and q_axis >= 0:
            axes = _axes_by_max(flow, chain, on_scores, ev.value.shape, frame[q_axis])
        plane = _keep_of(ev.value, *(axes or (q_axis, k_axis)))  # before `value`: a broadcast stays a view until here
        if plane is None:
            return Mask("inputs", detail="it differs between heads or sequences")
        keeps.append(value(plane).astype(bool))
    if unread:
        return Mask("unknown", detail=", ".join(unread))
    if not keeps:
        return Mask("none")
    keep = keeps[0]
    for other in keeps[1:]:
        keep = keep & other
    return classify(keep)
