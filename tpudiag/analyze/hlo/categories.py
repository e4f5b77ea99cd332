"""Classifies an HLO instruction: a readable category and the breakdown class its time counts in.

Reads `parse.hlo` model objects; returns small `OpInfo` records. No I/O.

Breakdown classes (`bound`): "compute" (matmul, convolution, fusions and custom calls that
contain them), "memory" (everything else that runs on the device: elementwise, reductions, data
movement), "communication" (collectives), "host" (host transfers: infeed/outfeed, send/recv to
host), "control" (while/conditional/call: only their own time outside their body ops).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import (COLLECTIVE, CONTROL, DATA_MOVEMENT, HOST, MATMUL, MATMUL_CALL_PREFIXES,
                                            REDUCE, SEND_RECV)
from tpudiag.parse.hlo import HloModule, Instruction


@dataclass(frozen=True)
class OpInfo:
    opcode: str
    category: str  # matmul | convolution | fusion:<kind> | reduction | elementwise | data_movement | ...
    bound: str  # compute | memory | communication | host | control
    shape: str
    source: str | None  # "file.py:12" of the innermost Python frame, if the HLO metadata has it


def _is_matmul_call(instr: Instruction) -> bool:
    return (instr.custom_call_target or "").startswith(MATMUL_CALL_PREFIXES)


def _contains_matmul(module: HloModule, computations: list[str]) -> bool:
    """Whether `computations` (a fusion's body, nested fusions opened) hold a matmul."""
    return any(i.opcode in MATMUL or (i.opcode == "custom-call" and _is_matmul_call(i))
               for i in module.walk(computations, into=("fusion",)))


def _calls_collective(module: HloModule, computations: list[str]) -> bool:
    return any(i.opcode in COLLECTIVE for i in module.walk(computations, depth=0))


def _by_opcode(op: str) -> tuple[str, str] | None:
    """(category, bound) from the opcode alone, where the opcode decides; None where the HLO must."""
    if op == "convolution":
        return "convolution", "compute"
    if op in MATMUL:
        return "matmul", "compute"
    if op in COLLECTIVE:
        return "collective", "communication"
    if op in HOST:
        return "host_transfer", "host"
    if op in CONTROL:
        return "control_flow", "control"
    if op in REDUCE:
        return "reduction", "memory"
    if op in DATA_MOVEMENT:
        return "data_movement", "memory"
    return None


def classify(module: HloModule, instr: Instruction) -> OpInfo:
    """The category and breakdown class of one instruction of `module` (an async-done is classed
    by the async-start it closes, its operand)."""
    op = instr.opcode
    if op == "fusion":
        cat = f"fusion:{(instr.fusion_kind or 'kLoop')[1:].lower()}"
        bound = "compute" if _contains_matmul(module, instr.called) else "memory"
        if _calls_collective(module, instr.called):
            bound = "communication"
    elif op in SEND_RECV:
        host = instr.is_host_transfer
        cat, bound = ("host_transfer", "host") if host else ("collective", "communication")
    elif op.startswith("async-"):
        # async-start/-update/-done wrapping a collective (async reduce-scatter, all-to-all).
        start = (module.instruction(instr.operands[0]) or instr) if op != "async-start" and instr.operands else instr
        cat, bound = ("collective", "communication") if _calls_collective(module, start.called) \
            else ("control_flow", "control")
    elif op == "custom-call":
        cat, bound = "custom_call", "compute" if _is_matmul_call(instr) else "memory"
    else:
        cat, bound = _by_opcode(op) or ("elementwise", "memory")
    return OpInfo(opcode=op, category=cat, bound=bound, shape=instr.shape, source=module.source(instr))


def index_module(module: HloModule) -> dict[str, OpInfo]:
    """OpInfo for every instruction that can execute as a unit (not those inside fusions)."""
    fused = module.fused_computations()
    out: dict[str, OpInfo] = {}
    for comp in module.computations.values():
        if comp.name in fused:
            continue
        for instr in comp.instructions:
            out[instr.name] = classify(module, instr)
    return out


def guess_from_name(op_name: str) -> OpInfo:
    """For an op with no HLO (a bare trace): XLA names instructions after their opcode (`all-reduce.3`,
    `dot.12`, `copy.4`), so the name's stem is a fair guess at the opcode. Fusions and anything else
    whose kind the name cannot tell are `unknown`."""
    stem = op_name.split(".")[0]
    for candidate in (stem, stem.replace("_", "-")):
        if candidate in SEND_RECV:
            return OpInfo(candidate, "collective", "communication", "", None)
        guess = _by_opcode(candidate)
        if guess:
            return OpInfo(candidate, *guess, "", None)
    return OpInfo("?", "unknown", "memory", "", None)
