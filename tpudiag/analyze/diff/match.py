"""Matches the instructions of two HLO modules by structure: the first half of `hlo_diff`.

Reads two `parse.hlo` modules (their typed attribute fields and cached call graph); returns a
`Matching`: each module flattened into `Node`s with structural hashes, the op -> op pairs, the
fusion -> fusion pairs and the computation -> computation pairs. It does not decide what changed
or build the document (that is `hlo_diff`). No I/O.

Instructions are matched by structure, never by name: XLA renumbers names between compiles
(`fusion.12` becomes `fusion.13`), so a name is at most the last tie-breaker (by position).

- The graph is *flattened*: every fusion (and every `call`, which XLA inlines early anyway) is
  inlined, its parameters standing for the fusion's operands and a get-tuple-element of its tuple
  root for the element, so an op has the same operands whether or not it sits in a fusion. That
  is what lets an op that moved into a fusion match. (Only the diff reads this graph; the other
  readers walk the module's own def-use graph, `HloModule.uses`.)
- Each op gets a bottom-up structural hash: opcode, shape without layout, the attributes that
  change what it computes (dimensions, window, contracting dims, custom-call target, ...), the
  structure of an applied computation (a reducer), constant values, and its operands' hashes in
  order. Entry parameters hash by their metadata op_name (JAX writes the argument path there),
  else by number; loop and branch parameters by the operand they are bound to.
- Matching, in stages, each followed by propagation (a matched pair matches its unmatched
  operands of the same opcode, position by position, and its users of the same opcode where one
  is left on each side): equal hashes (unique, or unique within op_name and source line); equal
  hashes still ambiguous, in program order; then opcode + metadata op_name + source line (+ shape);
  then opcode + op_name; then, for ops without metadata, opcode + shape. What is left is
  added or removed.
- Fusions themselves are matched by vote: the fusion on the other side that holds most of the
  counterparts of this fusion's ops.
- Only executed computations are flattened (entry, loop bodies and conditions, branches, called
  computations, and the fusion bodies inside them); reducers and comparators are part of the op
  that applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpudiag.errors import ParseError
from tpudiag.parse.hlo import RUNS_CALLEES, HloModule, Instruction

# Attributes that do not change what an op computes: names of other computations and
# instructions (compared structurally instead), XLA's bookkeeping, and TPU scheduling notes.
_IGNORED_ATTRS = frozenset({
    "metadata", "backend_config", "frontend_attributes", "control-predecessors", "calls", "to_apply",
    "body", "condition", "branch_computations", "true_computation", "false_computation",
    "called_computations", "channel_id", "statistics", "kind", "original_value", "origin",
})
_LAYOUT = re.compile(r"\{[^{}]*\}")


def _attr_key(instr: Instruction) -> tuple:
    """The attributes that change what an op computes, as a sorted tuple of (name, text)."""
    return tuple(sorted((k, v) for k, v in instr.attributes.items() if k not in _IGNORED_ATTRS))


class Node:
    """One instruction instance of the flattened graph."""

    __slots__ = ("idx", "instr", "opcode", "comp", "container", "operands", "operand_names", "users",
                 "shape_key", "attr_key", "called", "applied", "op_name", "source", "h", "is_fusion", "top_level")

    def __init__(self, idx: int, instr: Instruction, comp: str, container: int):
        self.idx, self.instr, self.opcode, self.comp, self.container = idx, instr, instr.opcode, comp, container
        self.operands: list[int] = []  # resolved producers (through fusion parameters and roots)
        self.operand_names: list[str] = []  # what to show: the producer's name where it is a fusion parameter
        self.users: list[tuple[int, int]] = []  # (user idx, operand position)
        self.is_fusion = False
        self.top_level = container < 0


class Side:
    """One module, flattened into nodes with structural hashes."""

    def __init__(self, module: HloModule, shapes: dict):
        self.module = module
        self.shapes = shapes  # shape text -> without layouts, shared by both sides
        self.nodes: list[Node] = []
        self.order = list(module.executed_computations)
        if not self.order:
            raise ParseError(module.path, "no ENTRY computation: nothing to diff")
        self.comp_rank = {c: k for k, c in enumerate(self.order)}
        self.callers: dict[str, tuple[Node, int]] = {}  # computation -> (caller, index among its calls)
        self._applied: dict[str, int] = {}
        self._sources: dict[str, str | None] = {}  # stack_frame_id -> file:line
        self._inlined: set[str] = set()
        for name in self.order:
            if name not in self._inlined:
                self._add_computation(name)
        # Every node is listed in the diff; fusion parameters are no nodes (they are the operands).
        self.ops = [n for n in self.nodes if not n.is_fusion]
        self.fusions = [n for n in self.nodes if n.is_fusion]
        self.inner: dict[int, list[Node]] = {}
        for n in self.ops:
            if n.container >= 0:
                self.inner.setdefault(n.container, []).append(n)

    # -- building -----------------------------------------------------------------------------------

    def _computation(self, name: str, instr: Instruction):
        comp = self.module.computations.get(name)
        if comp is None or not comp.instructions:
            raise ParseError(self.module.path, f"instruction {instr.name} calls {name}, which is not defined or empty",
                             line=instr.line or None)
        return comp

    def _resolve(self, scope: dict, instr: Instruction, k: int, name: str) -> tuple[int, str]:
        found = scope.get(name)
        if found is None:
            raise ParseError(self.module.path, f"instruction {instr.name}: operand {k} ({name}) is not defined",
                             line=instr.line or None)
        return found

    def _add_computation(self, name: str) -> None:
        comp = self.module.computations[name]
        scope: dict[str, tuple[int, str]] = {}  # name -> (resolved node idx, name to show)
        for instr in comp.instructions:
            scope[instr.name] = self._add(instr, name, -1, scope)

    def _add(self, instr: Instruction, comp: str, container: int, scope: dict) -> tuple[int, str]:
        """Create the node of `instr` (and, for a fusion, of its body); return what its users see."""
        node = Node(len(self.nodes), instr, comp, container)
        self.nodes.append(node)
        for k, o in enumerate(instr.operands):
            idx, shown = self._resolve(scope, instr, k, o)
            node.operands.append(idx)
            node.operand_names.append(shown)
        self._describe(node)
        if instr.opcode == "fusion":
            node.is_fusion = True
            root = self._expand(instr, node, node.idx if container < 0 else container, comp)
            node.h = hash(("fusion", node.shape_key, self.nodes[root[0]].h))
            return root[0], instr.name
        seen_through = None
        if instr.opcode == "get-tuple-element" and node.operands:
            src = self.nodes[node.operands[0]]
            i = instr.index
            if src.opcode == "tuple" and i is not None and i < len(src.operands):
                # A fusion's (or call's) tuple root: the element is the operand; the index is
                # just where the compiler put it.
                seen_through = src.operands[i]
                node.operands, node.attr_key = [seen_through], ()
        for k, o in enumerate(node.operands):
            self.nodes[o].users.append((node.idx, k))
        node.h = hash((node.opcode, node.shape_key, node.attr_key, node.applied, self._context(node),
                       tuple(self.nodes[o].h for o in node.operands)))
        if instr.opcode == "call" and len(node.called) == 1 and container < 0:
            # XLA inlines calls early (CallInliner): see through them, as through fusions.
            self._inlined.add(node.called[0])
            return self._inline(instr, node, node.called[0])
        if instr.opcode in RUNS_CALLEES:
            for k, c in enumerate(node.called):
                self.callers.setdefault(c, (node, k))
        return (node.idx if seen_through is None else seen_through), instr.name

    def _inline(self, call: Instruction, node: Node, name: str) -> tuple[int, str]:
        body = self._computation(name, call)
        scope: dict[str, tuple[int, str]] = {}
        bound = list(zip(node.operands, node.operand_names))
        for instr in body.instructions:
            k = instr.parameter_number
            if instr.opcode == "parameter" and k is not None and k < len(bound):
                scope[instr.name] = bound[k]
            else:
                scope[instr.name] = self._add(instr, name, -1, scope)
        return scope[body.root.name]

    def _expand(self, fusion: Instruction, node: Node, container: int, comp: str) -> tuple[int, str]:
        body = self._computation(node.called[0] if node.called else "?", fusion)
        scope: dict[str, tuple[int, str]] = {}
        bound = list(zip(node.operands, node.operand_names))
        for instr in body.instructions:
            if instr.opcode == "parameter":
                k = instr.parameter_number
                if k is None or k >= len(bound):
                    raise ParseError(self.module.path, f"fusion {fusion.name}: {instr.name} is "
                                     f"parameter({instr.literal}) of a fusion with {len(bound)} operands",
                                     line=instr.line or None)
                scope[instr.name] = bound[k]
            elif instr.opcode == "fusion":  # nested (TPU `bitcast_fusion`s): inline it too
                inner = Node(-1, instr, comp, container)
                inner.called = instr.called
                for k, o in enumerate(instr.operands):
                    idx, shown = self._resolve(scope, instr, k, o)
                    inner.operands.append(idx)
                    inner.operand_names.append(shown)
                scope[instr.name] = self._expand(instr, inner, container, comp)
            else:
                scope[instr.name] = self._add(instr, comp, container, scope)
        return scope[body.root.name]

    def _describe(self, node: Node) -> None:
        instr = node.instr
        shape_key = self.shapes.get(instr.shape)
        if shape_key is None:
            shape_key = self.shapes[instr.shape] = _LAYOUT.sub("", instr.shape)
        node.shape_key = shape_key
        node.attr_key, node.called = _attr_key(instr), instr.called
        config = instr.attributes.get("backend_config")
        if instr.opcode == "custom-call" and config is not None:  # a kernel's config is what it computes
            node.attr_key = node.attr_key + (("backend_config", str(hash(config))),)
        node.applied = () if instr.opcode in RUNS_CALLEES or instr.opcode == "fusion" else \
            tuple(self._applied_hash(c, instr) for c in node.called)
        md = instr.metadata
        node.op_name = md.get("op_name") or None
        node.source = self._source(instr, md)

    def _source(self, instr: Instruction, md: dict) -> str | None:
        if "source_file" in md:
            return f"{md['source_file']}:{md.get('source_line', 0)}"
        fid = md.get("stack_frame_id")
        if not fid:
            return None
        if fid not in self._sources:
            self._sources[fid] = self.module.source(instr)
        return self._sources[fid]

    def _context(self, node: Node):
        """What a parameter stands for: entry parameters by argument path (or number), loop and
        branch parameters by the operand bound to them; the literal of constants and iotas."""
        instr = node.instr
        if node.opcode != "parameter":
            return instr.literal
        caller = self.callers.get(node.comp)
        if caller is None:
            return ("entry", node.op_name or instr.literal)
        call, k = caller
        if call.opcode == "conditional":
            at = k + 1
        elif call.opcode == "while":
            at = 0
        else:
            at = instr.parameter_number or 0
        bound = self.nodes[call.operands[at]].h if at < len(call.operands) else None
        return ("bound", instr.literal, bound)

    def _applied_hash(self, name: str, instr: Instruction) -> int:
        """Structure of a computation an op applies (a reducer): names do not count."""
        if name in self._applied:
            return self._applied[name]
        comp = self._computation(name, instr)
        local: dict[str, int] = {}
        for i in comp.instructions:
            shape = _LAYOUT.sub("", i.shape)
            if i.opcode == "parameter":
                local[i.name] = hash(("parameter", i.literal, shape))
                continue
            applied = tuple(self._applied_hash(c, i) for c in i.called)
            operands = tuple(local.get(o, 0) for o in i.operands)
            local[i.name] = hash((i.opcode, shape, _attr_key(i), i.literal, applied, operands))
        self._applied[name] = local[comp.root.name]
        return local[comp.root.name]



class Matcher:
    def __init__(self, a: Side, b: Side):
        self.a, self.b = a, b
        self.ab: dict[int, int] = {}
        self.ba: dict[int, int] = {}

    def pair(self, x: int, y: int, work: list) -> None:
        self.ab[x] = y
        self.ba[y] = x
        work.append((x, y))

    def unmatched(self):
        return ([n for n in self.a.ops if n.idx not in self.ab], [n for n in self.b.ops if n.idx not in self.ba])

    def by_key(self, key, unique: bool) -> None:
        """Pair unmatched ops with equal keys (None: not a candidate): buckets of one on each side,
        or (not unique) every bucket zipped in program order. Then propagate."""
        work: list[tuple[int, int]] = []
        ua, ub = self.unmatched()
        buckets: dict = {}
        for side, nodes in ((0, ua), (1, ub)):
            for n in nodes:
                k = key(n)
                if k is not None:
                    buckets.setdefault(k, ([], []))[side].append(n)
        for xs, ys in buckets.values():
            if xs and ys and (not unique or len(xs) == len(ys) == 1):
                for x, y in zip(xs, ys):
                    self.pair(x.idx, y.idx, work)
        self.propagate(work)

    def propagate(self, work: list) -> None:
        A, B = self.a.nodes, self.b.nodes
        while work:
            x, y = work.pop()
            nx, ny = A[x], B[y]
            if len(nx.operands) == len(ny.operands):
                for ox, oy in zip(nx.operands, ny.operands):
                    if (ox not in self.ab and oy not in self.ba and A[ox].opcode == B[oy].opcode
                            and not A[ox].is_fusion and not B[oy].is_fusion):
                        self.pair(ox, oy, work)
            if not nx.users or not ny.users:
                continue
            ux: dict = {}
            for u, k in nx.users:
                if u not in self.ab:
                    ux.setdefault((A[u].opcode, k), []).append(u)
            if not ux:
                continue
            uy: dict = {}
            for u, k in ny.users:
                if u not in self.ba:
                    uy.setdefault((B[u].opcode, k), []).append(u)
            for k, us in ux.items():
                vs = uy.get(k)
                if len(us) == 1 and vs and len(vs) == 1 and us[0] not in self.ab and vs[0] not in self.ba:
                    self.pair(us[0], vs[0], work)

    def run(self) -> None:
        self.by_key(lambda n: n.h, unique=True)
        self.by_key(lambda n: (n.h, n.op_name, n.source), unique=True)
        self.by_key(lambda n: (n.h, n.op_name, n.source), unique=False)
        self.by_key(lambda n: n.h, unique=False)
        self.by_key(lambda n: (n.opcode, n.op_name, n.source, n.shape_key) if n.op_name else None, unique=False)
        self.by_key(lambda n: (n.opcode, n.op_name, n.source) if n.op_name else None, unique=False)
        self.by_key(lambda n: (n.opcode, n.op_name) if n.op_name else None, unique=False)
        self.by_key(lambda n: (n.opcode, n.shape_key) if not n.op_name else None, unique=False)


def match_fusions(m: Matcher) -> tuple[dict[int, int], dict[int, int]]:
    """Fusion -> fusion: most shared op counterparts first, then op_name/source/kind for the rest."""
    a, b = m.a, m.b
    votes: dict[tuple[int, int], int] = {}
    for f, ops in a.inner.items():
        for n in ops:
            y = m.ab.get(n.idx)
            if y is not None and b.nodes[y].container >= 0:
                key = (f, b.nodes[y].container)
                votes[key] = votes.get(key, 0) + 1
    fab: dict[int, int] = {}
    fba: dict[int, int] = {}
    for (x, y), _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0])):
        if x not in fab and y not in fba:
            fab[x], fba[y] = y, x
    for key in (lambda n: (n.instr.fusion_kind, n.op_name, n.source, n.shape_key),
                lambda n: (n.instr.fusion_kind, n.op_name, n.source)):
        buckets: dict = {}
        for side, nodes, done in ((0, a.fusions, fab), (1, b.fusions, fba)):
            for n in nodes:
                if n.idx not in done:
                    buckets.setdefault(key(n), ([], []))[side].append(n)
        for xs, ys in buckets.values():
            for x, y in zip(xs, ys):
                fab[x.idx], fba[y.idx] = y.idx, x.idx
    return fab, fba



def match_computations(m: Matcher) -> dict[str, str]:
    votes: dict[tuple[str, str], int] = {}
    for x, y in m.ab.items():
        key = (m.a.nodes[x].comp, m.b.nodes[y].comp)
        votes[key] = votes.get(key, 0) + 1
    out, taken = {}, set()
    ranked = sorted(votes.items(), key=lambda kv: (-kv[1], m.a.comp_rank[kv[0][0]], m.b.comp_rank[kv[0][1]]))
    for (ca, cb), _ in ranked:
        if ca not in out and cb not in taken:
            out[ca] = cb
            taken.add(cb)
    return out



@dataclass
class Matching:
    """Two flattened modules and their counterparts: `ops` (the op matcher: `ab`/`ba` node index
    maps), `fab`/`fba` (fusion node -> fusion node), `computations` (A's name -> B's)."""

    a: Side
    b: Side
    ops: Matcher
    fab: dict[int, int]
    fba: dict[int, int]
    computations: dict[str, str]


def match_modules(a: HloModule, b: HloModule) -> Matching:
    """Flatten both modules and match their ops, fusions and computations."""
    shapes: dict = {}
    sa, sb = Side(a, shapes), Side(b, shapes)
    m = Matcher(sa, sb)
    m.run()
    fab, fba = match_fusions(m)
    return Matching(sa, sb, m, fab, fba, match_computations(m))
