"""How many times each computation of a module runs per execution of the module: while loops.

A model under `lax.scan` (its layers, a decode loop, gradient accumulation) compiles to a `while`
whose body is the layer. The TPU compiler's static profile and the per-op tables count that body
once; its op times must be multiplied by the loop's trip count to be the step's.

The trip count is the one XLA recorded (`backend_config={"known_trip_count":{"n":"4"}}`: XLA:CPU
writes it; libtpu 0.0.42 and 0.0.50 do not), else read off the loop the way XLA's own simple
while-loop analysis does: the condition compares a counter element of the loop tuple with a
constant (`compare(t#0, constant(4)), direction=LT`), the body adds a constant to that element,
and the loop's initial tuple holds a constant there. Anything else is unknown and counts once.
No I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import INTEGER_TRANSPARENT
from tpudiag.parse.hlo import HloModule, Instruction
from tpudiag.parse.hlo_model import RUNS_CALLEES
from tpudiag.parse.hlo_text import ascii_int



@dataclass(frozen=True)
class LoopRuns:
    """`runs`: {computation name: times it runs per execution of the module} for every executed
    computation (the entry: 1). `unknown`: the while loops whose trip count could not be read
    (their bodies count once)."""

    runs: dict[str, int]
    unknown: tuple[str, ...]
    trips: dict[str, int]  # while instruction name -> trip count, where known


def _through(module: HloModule, instr: Instruction | None) -> Instruction | None:
    while instr is not None and instr.opcode in INTEGER_TRANSPARENT and instr.operands:
        instr = module.operand(instr, 0)
    return instr


def _into_caller(module: HloModule, instr: Instruction | None) -> Instruction | None:
    """A parameter of a computation that one `call` runs (XLA:CPU outlines a loop into one): the
    caller's operand. Anything else as it is."""
    while instr is not None and instr.opcode == "parameter":
        callers = module.callers.get(instr.computation, [])
        if len(callers) != 1 or callers[0][0].opcode != "call" or instr.parameter_number is None:
            break
        instr = _through(module, module.operand(callers[0][0], instr.parameter_number))
    return instr


def _int_constant(instr: Instruction | None) -> int | None:
    if instr is None or instr.opcode != "constant":
        return None
    return ascii_int(instr.literal.strip(), None)


def _element(module: HloModule, instr: Instruction | None, param: Instruction) -> int | None:
    """k where `instr` is element k of the tuple parameter `param` (through copies)."""
    instr = _through(module, instr)
    if instr is None or instr.opcode != "get-tuple-element" or instr.index is None:
        return None
    src = _through(module, module.operand(instr, 0))
    return instr.index if src is not None and src.name == param.name else None


def _op(module: HloModule, instr: Instruction | None) -> tuple[Instruction | None, list]:
    """(the instruction that computes, its operands in `instr`'s computation): XLA:CPU wraps a lone
    compare or add in a fusion (`wrapped_compare`), whose root's parameters are the fusion's operands."""
    instr = _through(module, instr)
    if instr is None:
        return None, []
    if instr.opcode == "fusion" and instr.calls in module.computations:
        root = module.computations[instr.calls].root
        if root is not None and all(o is not None and o.opcode == "parameter"
                                    for o in (module.operand(root, k) for k in range(len(root.operands)))):
            return root, [module.operand(instr, module.operand(root, k).parameter_number)
                          for k in range(len(root.operands))]
    return instr, [module.operand(instr, k) for k in range(len(instr.operands))]


def trip_count(module: HloModule, loop: Instruction, recorded: bool = True) -> int | None:
    """The number of times `loop` (a while instruction) runs its body; None where unknown.
    `recorded=False` ignores XLA's recorded count (to check the reading against it)."""
    if recorded and loop.known_trip_count is not None:
        return loop.known_trip_count
    cond, body = module.computations.get(loop.condition or ""), module.computations.get(loop.body or "")
    if cond is None or body is None or cond.root is None or body.root is None:
        return None
    cparam, bparam = cond.parameter(0), body.parameter(0)
    root, operands = _op(module, cond.root)
    if cparam is None or bparam is None or root is None or root.opcode != "compare" or len(operands) != 2:
        return None
    direction = root.attributes.get("direction", "")
    a, b = operands
    if direction in ("GT", "GE"):  # N > i is i < N
        a, b, direction = b, a, {"GT": "LT", "GE": "LE"}[direction]
    if direction not in ("LT", "LE"):
        return None
    k, limit = _element(module, a, cparam), _int_constant(_through(module, b))
    if k is None or limit is None:
        return None
    # The body's new counter: element k of its root tuple, the old counter plus a constant.
    new, operands = _op(module, module.operand(body.root, k)) if body.root.opcode == "tuple" else (None, [])
    if new is None or new.opcode != "add" or len(operands) != 2:
        return None
    x, y = operands
    if _element(module, x, bparam) != k:
        x, y = y, x
    step = _int_constant(_through(module, y))
    if _element(module, x, bparam) != k or not step or step <= 0:
        return None
    init = _into_caller(module, _through(module, module.operand(loop, 0)))
    start = _int_constant(_into_caller(module, _through(module, module.operand(init, k)))) if init is not None and init.opcode == "tuple" else None
    if start is None:
        return None
    span = limit - start + (1 if direction == "LE" else 0)
    return max(0, math.ceil(span / step))


def loop_runs(module: HloModule) -> LoopRuns:
    """Runs per module execution of every executed computation (while bodies times their trip
    counts, conditions once more than that, nested loops multiplied)."""
    entry = module.entry
    runs: dict[str, int] = {}
    trips: dict[str, int] = {}
    unknown: list[str] = []
    if entry is None:
        return LoopRuns(runs, (), trips)
    todo = [(entry.name, 1)]
    while todo:
        name, n = todo.pop(0)
        comp = module.computations.get(name)
        if comp is None or name in runs or comp.execution_thread not in (None, "main"):
            continue
        runs[name] = n
        for instr in comp.instructions:
            if instr.opcode not in RUNS_CALLEES:
                continue
            if instr.opcode == "while":
                t = trip_count(module, instr)
                if t is None:
                    unknown.append(instr.name)
                else:
                    trips[instr.name] = t
                t = 1 if t is None else t
                todo += [(instr.body or "", n * t), (instr.condition or "", n * (t + 1))]
            else:
                todo += [(c, n) for c in instr.called]
    return LoopRuns(runs, tuple(unknown), trips)
