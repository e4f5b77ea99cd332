"""The dataflow of an optimized HLO module across fusion boundaries, for the pattern detectors.

Reads a `parse.hlo` module; answers "what computes this operand" and "what reads this value" as if
no fusion existed: a fused computation's parameter stands for its fusion's operand, a fusion for
its fused root, and a get-tuple-element of a multi-output fusion for that root element. So a
softmax that XLA split over two fusions (the exp and row sums in one, the divide and the PV matmul
in the next, as libtpu does) reads as one chain. Each instruction also knows the top-level
instruction that executes it (`top`), which is where its time is measured or estimated. No I/O.
"""

from __future__ import annotations

from functools import cached_property

from tpudiag.analyze.hlo.vocabulary import TRANSPARENT
from tpudiag.parse.hlo import HloModule, Instruction


class Dataflow:
    def __init__(self, module: HloModule):
        self.module = module

    @cached_property
    def _fusion_of(self) -> dict[str, Instruction]:
        return dict(self.module.fusion_callers)

    @cached_property
    def _users(self) -> dict[int, list[Instruction]]:
        """id(instruction) -> the instructions that read it, across fusion boundaries."""
        out: dict[int, list[Instruction]] = {}
        for instr in self.instructions:
            for k in range(len(instr.operands)):
                src = self.operand(instr, k)
                if src is not None:
                    out.setdefault(id(src), []).append(instr)
        return out

    @cached_property
    def instructions(self) -> list[Instruction]:
        """Every instruction that computes: those of executed and fused computations, without the
        parameters, tuples and get-tuple-elements that only route values between them."""
        out = []
        for comp in self.module.computations.values():
            for instr in comp.instructions:
                if instr.opcode not in ("parameter", "tuple", "get-tuple-element", "fusion"):
                    out.append(instr)
        return out

    def _through(self, instr: Instruction | None, index: int | None = None) -> Instruction | None:
        """The instruction that computes the value `instr` names (a parameter, fusion or tuple element
        followed to its source); `index`: the tuple element wanted."""
        seen = 0
        while instr is not None and seen < 256:
            seen += 1
            if instr.opcode == "parameter":
                fusion = self._fusion_of.get(instr.computation)
                n = instr.parameter_number
                if fusion is None or n is None or n >= len(fusion.operands):
                    return instr  # an entry or loop parameter: the value comes from outside
                instr = self.module.operand(fusion, n)
            elif instr.opcode == "get-tuple-element":
                index, instr = instr.index, self.module.operand(instr, 0)
                continue
            elif instr.opcode == "fusion" and instr.calls:
                root = self.module.computations[instr.calls].root
                if root is None:
                    return instr
                instr = root
                continue
            elif instr.opcode == "tuple" and index is not None:
                if index >= len(instr.operands):
                    return None
                instr, index = self.module.operand(instr, index), None
                continue
            else:
                return instr
            index = None
        return instr

    def operand(self, instr: Instruction, k: int) -> Instruction | None:
        """What computes operand `k` of `instr`, across fusion boundaries."""
        return self._through(self.module.operand(instr, k))

    def operands(self, instr: Instruction) -> list[Instruction]:
        return [o for k in range(len(instr.operands)) if (o := self.operand(instr, k)) is not None]

    def source(self, instr: Instruction | None, through=TRANSPARENT) -> Instruction | None:
        """`instr` followed back through ops that only move or re-type a value."""
        seen = 0
        while instr is not None and instr.opcode in through and instr.operands and seen < 64:
            instr, seen = self.operand(instr, 0), seen + 1
        return instr

    def users(self, instr: Instruction) -> list[Instruction]:
        return self._users.get(id(instr), [])

    def top(self, instr: Instruction) -> Instruction:
        """The top-level instruction that executes `instr`: the outermost fusion it sits in, or itself."""
        seen = 0
        while instr.computation in self._fusion_of and seen < 64:
            instr, seen = self._fusion_of[instr.computation], seen + 1
        return instr
