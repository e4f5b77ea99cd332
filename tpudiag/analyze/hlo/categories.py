"""Classifies an HLO instruction: a readable category and the breakdown class its time counts in.

Reads `parse.hlo` model objects; returns small `OpInfo` records. No I/O.

Breakdown classes (`bound`): "compute" (matmul, convolution, fusions and custom calls that
contain them), "memory" (everything else that runs on the device: elementwise, reductions, data
movement), "communication" (collectives), "host" (host transfers: infeed/outfeed, send/recv to
host), "control" (while/conditional/call: only their own time outside their body ops).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.parse.hlo import HloModule, Instruction

# XLA's collective opcodes (hlo_opcode.h). Async reduce-scatter and all-to-all appear as
# async-start/async-done wrapping one of these; see classify().
_COLLECTIVE = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute",
    "collective-broadcast", "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done",
    "collective-permute-start", "collective-permute-done",
})
_SEND_RECV = frozenset({"send", "send-done", "recv", "recv-done"})
_HOST = frozenset({"infeed", "outfeed"})
_DATA = frozenset({
    "copy", "copy-start", "copy-done", "slice-start", "slice-done", "transpose", "gather", "scatter", "dynamic-slice",
    "dynamic-update-slice", "slice", "concatenate", "pad", "reshape", "broadcast", "bitcast", "reverse",
    "tuple", "get-tuple-element", "bitcast-convert", "iota", "constant", "parameter",
})
_REDUCE = frozenset({"reduce", "reduce-window", "select-and-scatter", "sort", "reduce-precision"})
_CONTROL = frozenset({"while", "conditional", "call", "async-start", "async-done", "async-update"})
_MATMUL = frozenset({"dot", "convolution", "ragged-dot"})
# Custom-call targets that are matmuls or convolutions (cuBLAS, cuDNN, oneDNN) or Pallas/Mosaic
# kernels (`tpu_custom_call`), which are written for the MXU/tensor cores.
_MATMUL_CALL_PREFIXES = ("__cublas$", "__cudnn$conv", "__onednn$matmul", "__onednn$convolution", "tpu_custom_call",
                         "__gpu$xla.gpu.triton")


@dataclass(frozen=True)
class OpInfo:
    opcode: str
    category: str  # matmul | convolution | fusion:<kind> | reduction | elementwise | data_movement | ...
    bound: str  # compute | memory | communication | host | control
    shape: str
    source: str | None  # "file.py:12" of the innermost Python frame, if the HLO metadata has it


def _contains_matmul(module: HloModule, comp_names: list[str], depth: int = 0) -> bool:
    for name in comp_names:
        comp = module.computations.get(name)
        if comp is None or depth > 8:
            continue
        for i in comp.instructions:
            if i.opcode in _MATMUL or (i.opcode == "custom-call" and _is_matmul_call(i)):
                return True
            if i.opcode == "fusion" and _contains_matmul(module, i.called, depth + 1):
                return True
    return False


def _is_matmul_call(instr: Instruction) -> bool:
    return (instr.custom_call_target or "").startswith(_MATMUL_CALL_PREFIXES)


def _calls_collective(module: HloModule, computations: list[str]) -> bool:
    return any(i.opcode in _COLLECTIVE for c in computations if c in module.computations
               for i in module.computations[c].instructions)


def _by_opcode(op: str) -> tuple[str, str] | None:
    """(category, bound) from the opcode alone, where the opcode decides; None where the HLO must."""
    if op in ("dot", "ragged-dot"):
        return "matmul", "compute"
    if op == "convolution":
        return "convolution", "compute"
    if op in _COLLECTIVE:
        return "collective", "communication"
    if op in _HOST:
        return "host_transfer", "host"
    if op in _CONTROL:
        return "control_flow", "control"
    if op in _REDUCE:
        return "reduction", "memory"
    if op in _DATA:
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
    elif op in _SEND_RECV:
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
        if candidate in _SEND_RECV:
            return OpInfo(candidate, "collective", "communication", "", None)
        guess = _by_opcode(candidate)
        if guess:
            return OpInfo(candidate, *guess, "", None)
    return OpInfo("?", "unknown", "memory", "", None)
