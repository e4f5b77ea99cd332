"""Evaluates a constant subgraph of an optimized HLO module with numpy: the values a mask, a
position table or a scale has when the program computes them from iotas and constants.

`evaluate(flow, instr)` follows operands across fusion boundaries (an `analyze.hlo.dataflow.Dataflow`)
and returns an `Evaluated`: the array, or why there is none: the value reads a parameter (it
depends on the program's inputs: a padding mask, a decode position) or an op this evaluator does
not compute. It covers what masks and tables are built from: iota, constants, broadcast, reshape,
transpose, slice, convert, compare, select, the logical ops and elementwise arithmetic. Arrays over
`max_elems` elements are refused, except a broadcast or an iota, which numpy holds as a view of
their operand (a mask broadcast over heads costs its own [queries, keys]). No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tpudiag.analyze.hlo.vocabulary import SAME_ELEMENTS
from tpudiag.parse.hlo import Instruction

_NP = {"pred": np.bool_, "s8": np.int8, "s16": np.int16, "s32": np.int32, "s64": np.int64, "u8": np.uint8,
       "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "f16": np.float32, "bf16": np.float32,
       "f32": np.float32, "f64": np.float64}  # bf16 and f16 are held as f32: the values masks compare
_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
            "GE": np.greater_equal}
_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
           "minimum": np.minimum, "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
           "remainder": np.remainder, "power": np.power}
_UNARY = {"negate": np.negative, "abs": np.abs, "not": np.logical_not, "floor": np.floor, "ceil": np.ceil,
          "sign": np.sign, "exponential": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda a: 1 / np.sqrt(a),
          "cosine": np.cos, "sine": np.sin}
MAX_ELEMS = 1 << 24


@dataclass(frozen=True)
class Evaluated:
    value: np.ndarray | None
    reads: str | None = None  # the parameter it reads (the value depends on the program's inputs)
    unsupported: str | None = None  # the op it could not evaluate

    @property
    def ok(self) -> bool:
        return self.value is not None


class _Stop(Exception):
    def __init__(self, result: Evaluated):
        self.result = result


def _dtype(instr: Instruction):
    s = instr.parsed_shape
    return _NP.get(s.element_type if s.is_array else "", None)


def _literal(instr: Instruction) -> np.ndarray:
    text = (instr.literal or "").strip()
    s = instr.parsed_shape
    if "..." in text:  # the dump elides large literals: `constant({...})`
        raise _Stop(Evaluated(None, unsupported=f"{instr.name} (a constant whose literal the dump elides)"))
    dt = _dtype(instr)
    if dt is None:
        raise _Stop(Evaluated(None, unsupported=f"{instr.name} (a {s.element_type if s.is_array else '?'} constant)"))
    words = [w for w in re.split(r"[{},\s]+", text) if w]
    vals = [w == "true" if dt is np.bool_ else float.fromhex(w) if w.startswith("0x") else float(w)
            for w in words if w not in ("",)]
    n = int(np.prod(s.dims)) if s.dims else 1
    if len(vals) == 1 and n != 1:
        vals = vals * n
    if len(vals) != n:
        raise _Stop(Evaluated(None, unsupported=f"{instr.name} (a constant whose literal is not printed whole)"))
    return np.array(vals, dtype=dt).reshape(s.dims)


def _physical_reshape_ok(instr: Instruction, operand: Instruction) -> bool:
    """A bitcast is a reshape when both sides lay their dimensions out major to minor in order."""
    def row_major(i: Instruction) -> bool:
        m = re.search(r"\{([0-9,]*)", i.shape.split("]", 1)[-1])
        order = [int(x) for x in m.group(1).split(",") if x] if m else []
        return not order or order == sorted(order, reverse=True)
    return row_major(instr) and row_major(operand)


def evaluate(flow, instr: Instruction, max_elems: int = MAX_ELEMS, parameters: int | None = None) -> Evaluated:
    """The value of `instr` (a `Dataflow` names its operands: `flow.operand(i, k)`), or why none.
    `parameters`: the value every element of the program's inputs takes (1: an all-ones attention
    mask, one packed segment); None: a value that reads an input has none (`Evaluated.reads`)."""
    memo: dict[int, np.ndarray] = {}

    def ev(i: Instruction | None) -> np.ndarray:
        if i is None:
            raise _Stop(Evaluated(None, unsupported="an operand outside the module"))
        if id(i) in memo:
            return memo[id(i)]
        s = i.parsed_shape
        if not s.is_array:
            raise _Stop(Evaluated(None, unsupported=f"{i.name} (a tuple)"))
        if int(np.prod(s.dims or (1,))) > max_elems and i.opcode not in ("broadcast", "iota"):  # views: no memory
            raise _Stop(Evaluated(None, unsupported=f"{i.name} (over {max_elems} elements)"))
        op = i.opcode

        def ops(k: int, i=i) -> np.ndarray:
            return ev(flow.operand(i, k))

        if op == "parameter" and parameters is None:
            raise _Stop(Evaluated(None, reads=i.name))
        if op == "parameter":
            out = np.full(s.dims, parameters, dtype=_dtype(i) or np.float32)
        elif op == "constant":
            out = _literal(i)
        elif op == "iota":
            dim = int(i.attributes.get("iota_dimension", "0"))
            shape = [1] * len(s.dims)
            shape[dim] = s.dims[dim]
            out = np.broadcast_to(np.arange(s.dims[dim]).reshape(shape), s.dims)
        elif op == "broadcast":
            a = ops(0)
            keep = list(i.dimensions or ())
            shape = [1] * len(s.dims)
            order = sorted(range(len(keep)), key=lambda k: keep[k])
            a = np.transpose(a, order) if len(order) > 1 else a
            for k, d in enumerate(sorted(keep)):
                shape[d] = a.shape[k]
            out = np.broadcast_to(a.reshape(shape), s.dims)
        elif op in ("custom-call", "copy-done") and (whole := flow.whole_copy_of(i)) is not i and whole is not None:
            # a copy in pieces, or an async copy (to or from host memory): copy-done(copy-start(x)) is x
            out = ev(flow.resolve(whole))
        elif op in SAME_ELEMENTS or op == "bitcast" and _physical_reshape_ok(i, flow.operand(i, 0)):
            out = ops(0).reshape(s.dims)
        elif op == "transpose":
            out = np.transpose(ops(0), i.dimensions)
        elif op == "slice":
            out = ops(0)[tuple(slice(a, b, c) for a, b, c in i.slice)]
        elif op == "convert":
            a = ops(0)
            out = a if _dtype(i) is None else a.astype(_dtype(i))
        elif op == "compare":
            out = _COMPARE[i.attributes.get("direction", "EQ")](ops(0), ops(1))
        elif op == "select":
            out = np.where(ops(0), ops(1), ops(2))
        elif op == "clamp":
            out = np.clip(ops(1), ops(0), ops(2))
        elif op == "divide":
            a, b = ops(0), ops(1)
            out = (a // b) if np.issubdtype(a.dtype, np.integer) else a / b
        elif op in _BINARY:
            out = _BINARY[op](ops(0), ops(1))
        elif op in _UNARY:
            out = _UNARY[op](ops(0))
        else:
            raise _Stop(Evaluated(None, unsupported=f"{i.name} ({op})"))
        memo[id(i)] = np.asarray(out)
        return memo[id(i)]

    try:
        with np.errstate(all="ignore"):
            return Evaluated(ev(instr))
    except _Stop as stop:
        return stop.result
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as e:  # a shape this reading gets wrong
        return Evaluated(None, unsupported=f"{instr.name} ({type(e).__name__})")


def scalar(flow, instr: Instruction | None, max_elems: int = MAX_ELEMS) -> float | None:
    """The value of `instr` where it is one constant repeated (a broadcast scalar: an epsilon, a top-p,
    a temperature), as the program wrote it (float32's shortest spelling: 1e-05, not 9.99e-06)."""
    if instr is None:
        return None
    e = evaluate(flow, instr, max_elems)
    if not e.ok or e.value.size == 0 or not np.all(e.value == e.value.flat[0]):
        return None
    return float(str(np.float32(e.value.flat[0])))
