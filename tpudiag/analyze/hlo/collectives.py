"""What the HLO says of one collective op: its kind, the message it moves, its replica groups and
the Python line it came from; and the nccl-tests bus-bandwidth factor of its kind.

Pure functions over a parsed `HloModule`; no I/O. `message_bytes` and `bus_factor` are the one
definition of a collective's size and ring factor: the cross-process analysis
(`analyze/distributed/collectives.py`) and the compile report's ICI model (`analyze/compile/`) both
read them. Without HLO (a pod trace copied without its dumps) the kind comes from
the op's name and the size is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import ASYNC_DONE, COLLECTIVE_START_TUPLE, COLLECTIVE_WRAPPERS, collective_kind
from tpudiag.parse.hlo_model import HloModule, Instruction


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw (doc/PERFORMANCE.md): all-reduce 2(n-1)/n; all-gather,
    reduce-scatter, all-to-all (n-1)/n; permute and broadcast 1."""
    if n <= 1:
        return 0.0 if kind not in ("collective-permute", "collective-broadcast") else 1.0
    if kind == "all-reduce":
        return 2 * (n - 1) / n
    if kind in ("all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class CollectiveOp:
    """One collective instruction. `message_bytes` is nccl-tests' "size": the whole result of an
    all-reduce, all-gather, all-to-all or permute, the whole input of a reduce-scatter (per device)."""

    kind: str
    op: str  # the instruction the trace's events carry (the -start of an async pair)
    message_bytes: int | None
    replica_groups: str | None  # as the HLO prints them
    group_size: int | None  # devices per group; None: every device
    source: str | None  # file.py:line


def kind_from_name(op: str) -> str | None:
    """`all-reduce.3`, `all-gather-start.1`, `reduce-scatter-done` -> the collective kind, else None."""
    return collective_kind(op.split(".")[0])


def start_name(op: str) -> str:
    """The -start op an async -done closes (by XLA's naming; the HLO is exact where there is one)."""
    head, dot, tail = op.partition(".")
    return head.removesuffix("-done") + "-start" + dot + tail if head.endswith("-done") else op


# A -done's operand is its -start or an -update, whose operand is the -start or another -update.
_ASYNC_HOPS = 16


def collective_instruction(module: HloModule, instr: Instruction) -> Instruction | None:
    """The collective an instruction is or wraps (async-start, a fusion on TPU), else None."""
    if kind_from_name(instr.opcode):
        return instr
    if instr.opcode not in COLLECTIVE_WRAPPERS:
        return None
    return next((i for i in module.walk(instr.called, into=COLLECTIVE_WRAPPERS) if kind_from_name(i.opcode)), None)


def message_bytes(module: HloModule, instr: Instruction) -> int:
    """nccl-tests' "size" of collective `instr`, per device: the whole input of a reduce-scatter (its
    operands, looked up in its own computation), the whole result of any other collective (of an
    async start, the result element of its (operands, results, ...) tuple)."""
    if collective_kind(instr.opcode) == "reduce-scatter":
        return sum(x.parsed_shape.bytes for x in (module.operand(instr, k) for k in range(len(instr.operands)))
                   if x is not None)
    shape = instr.parsed_shape
    if instr.opcode in COLLECTIVE_START_TUPLE and shape.is_tuple and len(shape.tuple_shapes) >= 2:
        return shape.tuple_shapes[1].bytes
    return shape.bytes


def describe(module: HloModule | None, op: str) -> CollectiveOp | None:
    """The collective op `op` of `module` (an async -done resolves to its -start, through any
    -update between them); None when it is not a collective."""
    instr = module.instruction(op) if module is not None else None
    if instr is None:
        kind = kind_from_name(op)
        return None if kind is None else CollectiveOp(kind, start_name(op), None, None, None, None)
    for _ in range(_ASYNC_HOPS):
        start = module.operand(instr, 0) if instr.opcode in ASYNC_DONE else None
        if start is None:
            break
        instr = start
    inner = collective_instruction(module, instr)
    if inner is None:
        return None
    kind = kind_from_name(inner.opcode)
    groups = inner.replica_groups
    return CollectiveOp(kind=kind, op=instr.name, message_bytes=message_bytes(module, inner),
                        replica_groups=inner.attributes.get("replica_groups"),
                        group_size=groups.group_size if groups is not None and groups.group_size else None,
                        source=module.source(inner) or module.source(instr))
