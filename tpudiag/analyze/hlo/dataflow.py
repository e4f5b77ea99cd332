"""The dataflow of an optimized HLO module across fusion boundaries, for the pattern detectors.

Reads a `parse.hlo` module; answers "what computes this operand" and "what reads this value" as if
no fusion existed: a fused computation's parameter stands for its fusion's operand, a fusion for
its fused root, a get-tuple-element of a multi-output fusion for that root element, and a while
body's element that holds one array on every iteration for the loop's input. So a
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

    @cached_property
    def _loop_of(self) -> dict[str, Instruction]:
        """{a while loop's body computation: the while}."""
        out = {}
        for comp in self.module.computations.values():
            for instr in comp.instructions:
                if instr.opcode == "while" and (body := (instr.attributes.get("body") or "").lstrip("%")):
                    out[body] = instr
        return out

    def _carried(self, param: Instruction, index: int) -> int | None:
        """The element of the body's parameter that the body passes on as element `index` of the next
        iteration's tuple (through whole-array copies), or None."""
        root = self.module.computations[param.computation].root
        if root is None or root.opcode != "tuple" or index >= len(root.operands):
            return None
        out = self.whole_copy_of(self.module.operand(root, index))
        if out is None or out.opcode != "get-tuple-element" or self.module.operand(out, 0) is not param:
            return None
        return out.index

    def _loop_constant(self, param: Instruction, index: int) -> int | None:
        """Where element `index` of a while body's parameter `param` holds the same array on every
        iteration, the element of the loop's input tuple that holds it; else None. So it is when the
        body passes the element on unchanged, or passes on a copy of an element j it passes on
        unchanged where the loop's input has a copy of one array at both (a mask made before a
        scanned loop, which the TPU compiler rotates through the loop's tuple in async pieces)."""
        if param.computation not in self._loop_of:
            return None
        j = self._carried(param, index)
        if j is None:
            return None
        if j == index:
            return index
        if self._carried(param, j) != j:
            return None
        start = self.module.operand(self._loop_of[param.computation], 0)
        if start is None or start.opcode != "tuple" or max(index, j) >= len(start.operands):
            return None
        a, b = (self.whole_copy_of(self.module.operand(start, k)) for k in (index, j))
        return j if a is not None and a is b else None

    def whole_copy_of(self, instr: Instruction | None) -> Instruction | None:
        """`instr` seen through what only copies a whole array: `copy`, `copy-done` of a `copy-start`,
        and a `ConcatBitcast` custom call of asynchronous slices that cut one array, in order, along
        the result's most major dimension (the TPU compiler's copy in pieces)."""
        for _ in range(16):
            if instr is None:
                return None
            if instr.opcode == "copy":
                instr = self.module.operand(instr, 0)
            elif instr.opcode == "copy-done" and (start := self.module.operand(instr, 0)) is not None \
                    and start.opcode == "copy-start":
                instr = self.module.operand(start, 0)
            elif instr.opcode == "custom-call" and "ConcatBitcast" in instr.attributes.get("custom_call_target", ""):
                whole = self._pieces_of(instr)
                if whole is None:
                    return instr
                instr = whole
            else:
                return instr
        return instr

    def _pieces_of(self, concat: Instruction) -> Instruction | None:
        """The one array whose async slices `concat` (a ConcatBitcast) joins back whole, or None."""
        shape = concat.parsed_shape
        if not shape.is_array or shape.layout is None or not shape.layout.minor_to_major:
            return None
        major = shape.layout.minor_to_major[-1]
        whole, at = None, 0
        for k in range(len(concat.operands)):
            done = self.module.operand(concat, k)
            start = self.module.operand(done, 0) if done is not None and done.opcode == "async-done" else None
            if start is None or start.opcode != "async-start" or not start.calls:
                return None
            piece = done.parsed_shape.layout  # each piece laid out as the result: its bytes one block of it
            if piece is None or tuple(piece.minor_to_major) != tuple(shape.layout.minor_to_major):
                return None
            body = self.module.computations.get(start.calls)
            cut = body.root if body is not None else None
            src = self.module.operand(start, 0)
            if cut is None or cut.opcode != "slice" or src is None or whole not in (None, src):
                return None
            first = self.module.operand(cut, 0)
            if first is None or first.opcode != "parameter" or first.parameter_number != 0:
                return None
            whole = src
            dims = src.parsed_shape.dims
            for d, (lo, hi, step) in enumerate(cut.slice or ()):
                if step != 1 or (d != major and (lo, hi) != (0, dims[d])) or (d == major and lo != at):
                    return None
            at = cut.slice[major][1] if cut.slice else -1
        if whole is None or list(whole.parsed_shape.dims) != list(shape.dims) or at != shape.dims[major]:
            return None
        return whole

    def _through(self, instr: Instruction | None, index: int | None = None) -> Instruction | None:
        """The instruction that computes the value `instr` names (a parameter, fusion or tuple element
        followed to its source); `index`: the tuple element wanted."""
        seen = 0
        while instr is not None and seen < 256:
            seen += 1
            if instr.opcode == "parameter":
                fusion = self._fusion_of.get(instr.computation)
                n = instr.parameter_number
                if fusion is None and index is not None and (k := self._loop_constant(instr, index)) is not None:
                    instr, index = self.module.operand(self._loop_of[instr.computation], 0), k  # the loop's input
                    continue
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

    def resolve(self, instr: Instruction | None) -> Instruction | None:
        """The instruction that computes the value `instr` names (`whole_copy_of` returns names)."""
        return self._through(instr)

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
