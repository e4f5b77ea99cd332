"""The walking machinery every detector shares: a `Flow` over one optimized HLO module.

Reads a `parse.hlo` module through `analyze.hlo.dataflow.Dataflow` (fusion boundaries erased);
offers breadth-first walks back (operands) and forward (users) through a set of opcodes, the
matmul test (a matmul, or the multiply-and-sum of a matrix-vector product), the stored dtype of an
operand, and `match()`, which turns the instructions a detector found into a `PatternMatch` (the
top-level ops that execute it, its anchors, their source lines). A detector that shares a finder
with another (prefill and decode attention) computes it once per module through `once()`.

It recognises no pattern itself and does no I/O.
"""

from __future__ import annotations

from typing import Callable

from tpudiag.analyze.hlo.dataflow import Dataflow
from tpudiag.analyze.hlo.vocabulary import ASYNC, MATMUL, TPU_ASYNC_SLICE, TRANSPARENT
from tpudiag.analyze.suggest.detectors.base import PatternMatch
from tpudiag.parse.hlo import HloModule, Instruction


# From a matmul to the weight it reads: casts, copies, and how the TPU compiler moves and gathers a
# weight (async slices reassembled by a custom call, an all-gather of a sharded weight); no arithmetic.
_WEIGHT_PATH = TRANSPARENT | TPU_ASYNC_SLICE | ASYNC | {"custom-call", "slice", "concatenate", "all-gather", "all-gather-start",
                                               "all-gather-done", "dynamic-slice"}


def dims(instr: Instruction) -> tuple[int, ...]:
    s = instr.parsed_shape
    return s.dims if s.is_array else ()


def etype(instr: Instruction) -> str:
    s = instr.parsed_shape
    return s.element_type if s.is_array else ""


def elems(shape_dims) -> int:
    n = 1
    for d in shape_dims:
        n *= max(d, 0)
    return n


def reducer_is(module: HloModule, instr: Instruction, opcode: str) -> bool:
    comp = module.computations.get(instr.to_apply or "")
    root = comp.root if comp else None
    return root is not None and root.opcode == opcode


class Flow:
    """One module's dataflow with the walks the detectors use."""

    def __init__(self, module: HloModule):
        self.m = module
        self.g = Dataflow(module)
        self.order = {id(i): n for n, i in enumerate(module.instructions())}
        self._once: dict[str, list] = {}

    def once(self, key: str, find: Callable[[Flow], list]) -> list:
        """`find(self)`, computed once per module for every detector that shares it."""
        if key not in self._once:
            self._once[key] = find(self)
        return self._once[key]

    def _walk(self, instr: Instruction, step, through: frozenset, want, depth: int) -> tuple[Instruction | None, list]:
        """Breadth first from `instr` along `step` (operands or users) through ops in `through`: the first
        op satisfying `want`, and the path walked."""
        frontier, seen, path = [instr], {id(instr)}, []
        for _ in range(depth):
            nxt = []
            for i in frontier:
                for o in step(i):
                    if id(o) in seen:
                        continue
                    seen.add(id(o))
                    if want(o):
                        return o, path + [o]
                    if o.opcode in through:
                        path.append(o)
                        nxt.append(o)
            frontier = nxt
        return None, path

    def back(self, instr: Instruction, through: frozenset, want, depth: int = 12) -> tuple[Instruction | None, list]:
        """The first op satisfying `want` reached from `instr` back through `through`; and the path."""
        return self._walk(instr, self.g.operands, through, want, depth)

    def forward(self, instr: Instruction, through: frozenset, want, depth: int = 8) -> tuple[Instruction | None, list]:
        """The same, downstream."""
        return self._walk(instr, self.g.users, through, want, depth)

    def is_matmul(self, instr: Instruction) -> bool:
        """A matmul, or the multiply-and-sum XLA writes for a matrix-vector product (a decode step's
        QK and PV with one query: no dot left in the HLO)."""
        if instr.opcode in MATMUL:
            return True
        if instr.opcode != "reduce" or not reducer_is(self.m, instr, "add"):
            return False
        mul = self.g.source(self.g.operand(instr, 0))
        if mul is None or mul.opcode != "multiply":
            return False
        a, b = (self.g.source(self.g.operand(mul, k), TRANSPARENT | {"broadcast"}) for k in (0, 1))
        return a is not None and b is not None and a is not b and a.opcode != "exponential" \
            and b.opcode != "exponential"

    def reachable(self, instr: Instruction, want, depth: int) -> list[Instruction]:
        """Every op satisfying `want` downstream of `instr` within `depth` steps."""
        frontier, seen, out = [instr], {id(instr)}, []
        for _ in range(depth):
            nxt = []
            for i in frontier:
                for u in self.g.users(i):
                    if id(u) in seen:
                        continue
                    seen.add(id(u))
                    if want(u):
                        out.append(u)
                    nxt.append(u)
            frontier = nxt
        return out

    def ancestors(self, instr: Instruction, depth: int = 24) -> set[int]:
        """The ids of every op `instr` is computed from within `depth` steps, its own included."""
        seen, frontier = {id(instr)}, [instr]
        for _ in range(depth):
            nxt = []
            for i in frontier:
                for o in self.g.operands(i):
                    if id(o) not in seen:
                        seen.add(id(o))
                        nxt.append(o)
            frontier = nxt
        return seen

    def depends_on(self, instr: Instruction, target: Instruction, depth: int = 24) -> bool:
        return id(target) in self.ancestors(instr, depth)

    def stored_dtype(self, instr: Instruction) -> str:
        """The narrowest float type among the arrays `instr` reads, before the converts and slices in
        between: a bf16 KV cache upcast to f32 for the matmul is still read as bf16."""
        seen_types = set()
        frontier, seen = [instr], {id(instr)}
        for _ in range(6):
            nxt = []
            for i in frontier:
                for o in self.g.operands(i):
                    if id(o) in seen:
                        continue
                    seen.add(id(o))
                    seen_types.add(etype(o))
                    if o.opcode in TRANSPARENT | {"broadcast", "dynamic-slice", "slice", "gather", "multiply"}:
                        nxt.append(o)
            frontier = nxt
        for t in ("bf16", "f16", "f32"):
            if t in seen_types:
                return t
        return etype(instr)

    def reduce_of(self, instr: Instruction, opcode: str) -> Instruction | None:
        r, _ = self.forward(instr, TRANSPARENT | {"broadcast"},
                            lambda u: u.opcode == "reduce" and reducer_is(self.m, u, opcode), depth=4)
        return r

    def load(self, stored: Instruction, depth: int = 8) -> list[Instruction]:
        """The ops that bring a stored operand (a parameter) to `stored`: layout copies and the
        TPU compiler's prefetch into VMEM (a cross-program `copy-start`/`copy-done`, or async slices
        joined by a `ConcatBitcast` custom call). A kernel reads its operand itself, so a pattern
        that a kernel replaces owns them."""
        def carries(t: Instruction) -> bool:
            return (t.opcode in TRANSPARENT or t.opcode in ASYNC or t.opcode == "slice"
                    or t.opcode == "custom-call" and 'custom_call_target="ConcatBitcast"' in (t.attrs or ""))

        out = [stored] if carries(stored) else []
        frontier, seen = list(out), {id(stored)}
        for _ in range(depth):
            nxt = []
            for i in frontier:
                for o in self.g.operands(i):
                    if id(o) not in seen and carries(o):
                        seen.add(id(o))
                        out.append(o)
                        nxt.append(o)
            frontier = nxt
        return out

    def weights(self, instr: Instruction, depth: int = 10) -> str:
        """The program's weights that the nearest matmuls at or upstream of `instr` read (their
        parameters, through casts and copies), joined: a layer's attention reads its own Q/K/V projections, in the
        forward and in its recomputation in the backward alike. Empty where none is found."""
        found, frontier, seen = set(), [instr], set()
        for _ in range(depth):
            nxt = []
            for i in frontier:
                if id(i) in seen:
                    continue
                seen.add(id(i))
                if self.is_matmul(i):
                    mine = set()
                    for o in self.g.operands(i):
                        root, _ = self.back(o, _WEIGHT_PATH, lambda t: t.opcode == "parameter", depth=8)
                        root = o if o.opcode == "parameter" else root
                        if root is not None and len(dims(root)) >= 2:
                            mine.add(root.name)
                    if mine:  # a projection: its weight names the instance; else (Q.K^T) look further up
                        found |= mine
                        continue
                nxt.extend(self.g.operands(i))
            frontier = nxt
        return ",".join(sorted(found))

    def match(self, detector, anchors: list[Instruction], covered: list[Instruction], shapes, notes=(),
              replaced=None, instance: Instruction | str | None = None):
        """The `PatternMatch` of `detector` anchored on `anchors`, its ops the top-level instructions that
        execute `anchors` and `covered`, in program order."""
        tops = {}
        for i in [*anchors, *covered]:
            t = self.g.top(i)
            if t.opcode not in ("parameter", "constant"):
                tops[id(t)] = t
        ops = sorted(tops.values(), key=lambda t: self.order.get(id(t), 0))
        own: dict[str, int] = {}  # the model's lines; then the library lines that emitted the ops
        lib: dict[str, int] = {}
        for i in [*anchors, *covered]:
            site, library = self.m.call_site(i)
            if site:
                own[site] = own.get(site, 0) + 1
            if library:
                lib[library] = lib.get(library, 0) + 1
        lines = sorted(own, key=lambda s: (-own[s], s))
        lines += [s for s in sorted(lib, key=lambda s: (-lib[s], s)) if s not in own]
        return PatternMatch(detector=detector, module=self.m.name, ops=tuple(t.name for t in ops),
                            anchors=tuple(a.name for a in anchors), source=tuple(lines),
                            shapes=shapes, notes=tuple(notes), replaced_by_xla=replaced,
                            instance=instance if isinstance(instance, str) and instance else
                            instance.name if isinstance(instance, Instruction) else anchors[0].name)


def dedupe(matches: list) -> list:
    """One match per (pattern, ops): the forward and a recomputation in the backward of one attention
    share their ops only when XLA fused them together."""
    seen, out = set(), []
    for m in matches:
        key = (m.pattern, m.ops, m.anchors[:1])
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out
