"""Structural diff of two HLO modules: which instructions were added, removed, changed, or moved
into or out of fusions, with FLOPs, bytes and (where given) time on each side.

Reads two `parse.hlo` modules (and optional per-instruction times, seconds by instruction name);
returns a JSON-safe `tpudiag.hlo_diff/1` document (its fields: `diff_modules`). No I/O, no
rendering (that is `report/diff_render.py`).

Instructions are matched by structure, never by name: XLA renumbers names between compiles
(`fusion.12` becomes `fusion.13`), so a name is at most the last tie-breaker (by position).

- The graph is *flattened*: every fusion (and every `call`, which XLA inlines early anyway) is
  inlined, its parameters standing for the fusion's operands and a get-tuple-element of its tuple
  root for the element, so an op has the same operands whether or not it sits in a fusion. That
  is what lets an op that moved into a fusion match.
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
  counterparts of this fusion's ops. An op is `moved` when it sits in a fusion on one side and not
  on the other, or in fusions that are not each other's counterpart.
- A matched op is `changed` when its own shape, layout, attributes, constant value or operand
  wiring differ (an operand whose counterpart is not the other side's operand), not when only
  something upstream changed. A fusion is `changed` when its kind, shape or contents changed.
- Only executed computations are diffed (entry, loop bodies and conditions, branches, called
  computations, and the fusion bodies inside them); reducers and comparators are part of the op
  that applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpudiag.analyze.executed import executed_computations
from tpudiag.analyze.hlo_cost import module_costs
from tpudiag.errors import ParseError
from tpudiag.parse.hlo import HloModule, Instruction, split_top_level

SCHEMA = "tpudiag.hlo_diff/1"
STATUSES = ("added", "removed", "changed", "moved", "unchanged")


@dataclass(frozen=True)
class DiffConfig:
    # Names listed in a fusion's "fused in"/"fused out" change before "(+N more)"; the rest is in
    # the pairs themselves.
    names_listed: int = 5
    # Characters of a constant's literal shown when its value changed (a weight matrix is MBs).
    literal_chars: int = 40
    # Characters of a shape shown in a change (a train step's root tuple is thousands long); the
    # pair's shape_a/shape_b keep it whole.
    shape_chars: int = 120


DEFAULT_DIFF_CONFIG = DiffConfig()

# Attributes that do not change what an op computes: names of other computations and
# instructions (compared structurally instead), XLA's bookkeeping, and TPU scheduling notes.
_IGNORED_ATTRS = frozenset({
    "metadata", "backend_config", "frontend_attributes", "control-predecessors", "calls", "to_apply",
    "body", "condition", "branch_computations", "true_computation", "false_computation",
    "called_computations", "channel_id", "statistics", "kind", "original_value", "origin",
})
# Where the attributes worth parsing end: XLA prints metadata and backend_config after the rest
# (HloInstruction::PrintWithCanonicalNameMap), and a TPU backend_config runs to 1,000 characters.
_ATTR_TAILS = ("metadata={", "backend_config=", "original_value=", "statistics=")
# The keys `Instruction.called` reads, in its order (a conditional's true branch is operand 1).
_CALL_KEYS = ("calls", "to_apply", "body", "condition", "branch_computations", "true_computation", "false_computation")
_CALLED = re.compile(r"\b(" + "|".join(_CALL_KEYS) + r")=(\{[^}]*\}|[^\s,]+)")
_LAYOUT = re.compile(r"\{[^{}]*\}")
_CONTROL = frozenset({"while", "call", "conditional", "async-start"})


class _Node:
    """One instruction instance of the flattened graph."""

    __slots__ = ("idx", "instr", "opcode", "comp", "container", "operands", "operand_names", "users",
                 "shape_key", "attrs", "attr_key", "called", "applied", "op_name", "source", "h", "is_fusion",
                 "top_level")

    def __init__(self, idx: int, instr: Instruction, comp: str, container: int):
        self.idx, self.instr, self.opcode, self.comp, self.container = idx, instr, instr.opcode, comp, container
        self.operands: list[int] = []  # resolved producers (through fusion parameters and roots)
        self.operand_names: list[str] = []  # what to show: the producer's name where it is a fusion parameter
        self.users: list[tuple[int, int]] = []  # (user idx, operand position)
        self.is_fusion = False
        self.top_level = container < 0


class _Side:
    """One module, flattened into nodes with structural hashes."""

    def __init__(self, module: HloModule, shapes: dict, attr_cache: dict):
        self.module = module
        self.shapes, self.attr_cache = shapes, attr_cache
        self.nodes: list[_Node] = []
        self.order = executed_computations(module)
        if not self.order:
            raise ParseError(module.path, "no ENTRY computation: nothing to diff")
        self.comp_rank = {c: k for k, c in enumerate(self.order)}
        self.callers: dict[str, tuple[_Node, int]] = {}  # computation -> (caller, index among its calls)
        self._applied: dict[str, int] = {}
        self._sources: dict[str, str | None] = {}
        self._inlined: set[str] = set()
        for name in self.order:
            if name not in self._inlined:
                self._add_computation(name)
        # Every node is listed in the diff; fusion parameters are no nodes (they are the operands).
        self.ops = [n for n in self.nodes if not n.is_fusion]
        self.fusions = [n for n in self.nodes if n.is_fusion]
        self.inner: dict[int, list[_Node]] = {}
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
        node = _Node(len(self.nodes), instr, comp, container)
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
            i = node.attrs.get("index", "")
            if src.opcode == "tuple" and i.isdigit() and int(i) < len(src.operands):
                # A fusion's (or call's) tuple root: the element is the operand; the index is
                # just where the compiler put it.
                seen_through = src.operands[int(i)]
                node.operands, node.attr_key = [seen_through], ()
        for k, o in enumerate(node.operands):
            self.nodes[o].users.append((node.idx, k))
        node.h = hash((node.opcode, node.shape_key, node.attr_key, node.applied, self._context(node),
                       tuple(self.nodes[o].h for o in node.operands)))
        if instr.opcode == "call" and len(node.called) == 1 and container < 0:
            # XLA inlines calls early (CallInliner): see through them, as through fusions.
            self._inlined.add(node.called[0])
            return self._inline(instr, node, node.called[0])
        if instr.opcode in _CONTROL:
            for k, c in enumerate(node.called):
                self.callers.setdefault(c, (node, k))
        return (node.idx if seen_through is None else seen_through), instr.name

    def _inline(self, call: Instruction, node: _Node, name: str) -> tuple[int, str]:
        body = self._computation(name, call)
        scope: dict[str, tuple[int, str]] = {}
        bound = list(zip(node.operands, node.operand_names))
        for instr in body.instructions:
            k = instr.parameter_number
            if instr.opcode == "parameter" and k is not None and k < len(bound):
                scope[instr.name] = bound[k]
            else:
                scope[instr.name] = self._add(instr, name, -1, scope)
        root = next((i for i in body.instructions if i.is_root), body.instructions[-1])
        return scope[root.name]

    def _expand(self, fusion: Instruction, node: _Node, container: int, comp: str) -> tuple[int, str]:
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
                inner = _Node(-1, instr, comp, container)
                inner.called = self._attrs(instr)[2]
                for k, o in enumerate(instr.operands):
                    idx, shown = self._resolve(scope, instr, k, o)
                    inner.operands.append(idx)
                    inner.operand_names.append(shown)
                scope[instr.name] = self._expand(instr, inner, container, comp)
            else:
                scope[instr.name] = self._add(instr, comp, container, scope)
        root = next((i for i in body.instructions if i.is_root), body.instructions[-1])
        return scope[root.name]

    def _describe(self, node: _Node) -> None:
        instr = node.instr
        shape_key = self.shapes.get(instr.shape)
        if shape_key is None:
            shape_key = self.shapes[instr.shape] = _LAYOUT.sub("", instr.shape)
        node.shape_key = shape_key
        node.attrs, node.attr_key, node.called = self._attrs(instr)
        if instr.opcode == "custom-call":  # a kernel's config is what the kernel computes
            i = instr.attrs.find("backend_config=")
            if i >= 0:
                node.attr_key = node.attr_key + (("backend_config", str(hash(instr.attrs[i:]))),)
        node.applied = () if instr.opcode in _CONTROL or instr.opcode == "fusion" else \
            tuple(self._applied_hash(c, instr) for c in node.called)
        md = _metadata(instr.attrs)
        node.op_name = md.get("op_name") or None
        node.source = self._source(instr, md)

    def _attrs(self, instr: Instruction) -> tuple[dict, tuple, list[str]]:
        """(attributes by name, the ones that matter as a sorted tuple, called computations), read
        from the attributes before metadata; cached by that text, which repeats across instructions."""
        a = instr.attrs
        end = len(a)
        for tail in _ATTR_TAILS:
            i = a.find(tail)
            if 0 <= i < end:
                end = i
        head = a[:end]
        parsed = self.attr_cache.get(head)
        if parsed is None:
            attrs = dict(_split_attrs(head))
            key = tuple(sorted((k, v) for k, v in attrs.items() if k not in _IGNORED_ATTRS))
            found = sorted(_CALLED.findall(head), key=lambda kv: _CALL_KEYS.index(kv[0]))
            called = [c.strip().lstrip("%") for _, v in found for c in v.strip("{}").split(",") if c.strip()]
            parsed = self.attr_cache[head] = (attrs, key, called)
        return parsed

    def _source(self, instr: Instruction, md: dict) -> str | None:
        if "source_file" in md:
            return f"{md['source_file']}:{md.get('source_line', 0)}"
        fid = md.get("stack_frame_id")
        if not fid:
            return None
        if fid not in self._sources:
            frames = self.module.source_frames(instr)
            self._sources[fid] = f"{frames[0][0]}:{frames[0][1]}" if frames else None
        return self._sources[fid]

    def _context(self, node: _Node):
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
            _, attrs, called = self._attrs(i)
            applied = tuple(self._applied_hash(c, i) for c in called)
            operands = tuple(local.get(o, 0) for o in i.operands)
            local[i.name] = hash((i.opcode, shape, attrs, i.literal, applied, operands))
        root = next((i for i in comp.instructions if i.is_root), comp.instructions[-1])
        self._applied[name] = local[root.name]
        return local[root.name]


_METADATA = re.compile(r'metadata=\{((?:[^}"]|"(?:[^"\\]|\\.)*")*)\}')
_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)')


def _metadata(attrs: str) -> dict[str, str]:
    """`Instruction.metadata` with one regex (it is read for every instruction of both modules)."""
    i = attrs.find("metadata={")
    m = _METADATA.match(attrs, i) if i >= 0 else None
    if not m:
        return {}
    return {k: v[1:-1] if v.startswith('"') else v for k, v in _KV.findall(m.group(1))}


def _split_attrs(text: str) -> list[tuple[str, str]]:
    """`a=1, b={x, y}, c="s, t"` -> [(a, 1), (b, {x, y}), (c, "s, t")]: commas inside brackets or
    quotes do not split."""
    out = split_top_level(text)
    pairs = []
    for item in out:
        key, eq, value = item.strip().partition("=")
        if eq:
            pairs.append((key.strip(), value.strip()))
    return pairs


class _Matcher:
    def __init__(self, a: _Side, b: _Side):
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


def _match_fusions(m: _Matcher) -> tuple[dict[int, int], dict[int, int]]:
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


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 3] + "..."


def _shape_changes(x: _Node, y: _Node, cfg: DiffConfig) -> list[str]:
    if x.shape_key != y.shape_key:
        return [f"shape {_clip(x.shape_key, cfg.shape_chars)} -> {_clip(y.shape_key, cfg.shape_chars)}"]
    if x.instr.shape != y.instr.shape:
        return [f"layout {_clip(x.instr.shape, cfg.shape_chars)} -> {_clip(y.instr.shape, cfg.shape_chars)}"]
    return []


def _names(nodes: list[_Node], cfg: DiffConfig) -> str:
    shown = ", ".join(n.instr.name for n in nodes[:cfg.names_listed])
    return shown + (f" (+{len(nodes) - cfg.names_listed} more)" if len(nodes) > cfg.names_listed else "")


def _op_changes(m: _Matcher, x: _Node, y: _Node, cfg: DiffConfig) -> list[str]:
    out = []
    if x.opcode != y.opcode:
        out.append(f"opcode {x.opcode} -> {y.opcode}")
    out += _shape_changes(x, y, cfg)
    if x.attr_key != y.attr_key:
        xa, ya = dict(x.attr_key), dict(y.attr_key)
        for k in sorted(set(xa) | set(ya)):
            if xa.get(k) != ya.get(k):
                out.append(f"{k} differs" if k == "backend_config" else f"{k} {xa.get(k, '-')} -> {ya.get(k, '-')}")
    if x.instr.literal != y.instr.literal and x.opcode != "parameter":
        out.append(f"value {_clip(x.instr.literal, cfg.literal_chars)} -> {_clip(y.instr.literal, cfg.literal_chars)}")
    elif x.opcode == "parameter" and x.instr.literal != y.instr.literal:
        out.append(f"parameter {x.instr.literal} -> {y.instr.literal}")
    if x.applied != y.applied:
        out.append("applied computation differs (" + ", ".join(y.called) + ")")
    if len(x.operands) != len(y.operands):
        out.append(f"operands {len(x.operands)} -> {len(y.operands)}")
    else:
        A, B = m.a.nodes, m.b.nodes
        for k, (ox, oy) in enumerate(zip(x.operands, y.operands)):
            if m.ab.get(ox) != oy and A[ox].h != B[oy].h:
                out.append(f"operand {k} {x.operand_names[k]} -> {y.operand_names[k]}")
    return out


def _fusion_changes(m: _Matcher, fab: dict, x: _Node, y: _Node, changed_ops: set, cfg: DiffConfig) -> list[str]:
    out = []
    kx, ky = x.instr.fusion_kind, y.instr.fusion_kind
    if kx != ky:
        out.append(f"kind {kx} -> {ky}")
    out += _shape_changes(x, y, cfg)
    inner_x, inner_y = m.a.inner.get(x.idx, []), m.b.inner.get(y.idx, [])
    gone = [n for n in inner_x if n.idx not in m.ab or m.b.nodes[m.ab[n.idx]].container != y.idx]
    came = [n for n in inner_y if n.idx not in m.ba or fab.get(m.a.nodes[m.ba[n.idx]].container) != y.idx]
    if came:
        out.append(f"fused in: {_names(came, cfg)}")
    if gone:
        out.append(f"fused out: {_names(gone, cfg)}")
    changed = sum(1 for n in inner_y if n.idx in changed_ops)
    if changed:
        out.append(f"{changed} fused op{'s' if changed > 1 else ''} changed")
    return out


def _cost_fields(costs: dict, times: dict | None, node: _Node | None) -> tuple:
    if node is None or not node.top_level:
        return None, None, None
    c = costs.get(node.instr.name)
    t = times.get(node.instr.name) if times else None
    return (int(c.flops) if c else None, int(c.bytes_accessed) if c else None,
            float(t) if t is not None else None)


def _side_doc(side: _Side, costs: dict, times: dict | None) -> dict:
    entry = side.module.entry
    top = [n for n in side.nodes if n.top_level]
    count = sum(len(side.module.computations[c].instructions) for c in side.order)
    flops = sum(costs[i.name].flops for i in entry.instructions if i.name in costs)
    nbytes = sum(costs[i.name].bytes_accessed for i in entry.instructions if i.name in costs)
    time_s = None
    if times is not None:
        time_s = float(sum(times.get(n.instr.name, 0.0) for n in top))
    return {"module": side.module.name, "path": side.module.path, "instructions": count,
            "fusions": len(side.fusions), "fused_instructions": len(side.ops) - sum(n.top_level for n in side.ops),
            "flops": int(flops), "bytes_accessed": int(nbytes), "time_s": time_s}


def _match_computations(m: _Matcher) -> dict[str, str]:
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


def diff_modules(a: HloModule, b: HloModule, times_a: dict | None = None, times_b: dict | None = None,
                 config: DiffConfig = DEFAULT_DIFF_CONFIG) -> dict:
    """The `tpudiag.hlo_diff/1` document of module `a` (before) against `b` (after).

    `times_a`/`times_b`: seconds per instruction name (a compile report's `estimated_s`, or a
    profile's measured time), for the instructions outside fusions; None where there are none.

    The document: `a`/`b` (module, path, instructions in executed computations, fusions, fused
    instructions, flops and bytes_accessed as `hlo_cost.total_cost` counts them, time_s: the sum
    of the given times or None); `summary` (how many pairs are added, removed, changed, moved,
    unchanged; moved_into_fusions, moved_out_of_fusions); `computations` (A's executed
    computations and their counterparts); `pairs`, in B's program order with A-only instructions
    after their predecessor: a, b (instruction names, None on the side without it), status,
    opcode, computation, fusion_a/fusion_b (the fusion it sits in), fusion_kind_a/b (of a fusion
    instruction), shape_a/b, operands_a/b, literal_a/b (constants, parameter numbers), op_name,
    source, changes (readable lines), flops_a/b, bytes_accessed_a/b, time_a_s/time_b_s (None
    inside fusions: the fusion carries them).
    """
    shapes: dict = {}
    attr_cache: dict = {}
    sa, sb = _Side(a, shapes, attr_cache), _Side(b, shapes, attr_cache)
    m = _Matcher(sa, sb)
    m.run()
    fab, fba = _match_fusions(m)
    comps = _match_computations(m)
    costs_a, costs_b = module_costs(a), module_costs(b)

    def name(side: _Side, idx: int) -> str | None:
        return side.nodes[idx].instr.name if idx >= 0 else None

    rows: list[tuple[tuple, dict]] = []
    changed_ops: set[int] = set()
    summary = dict.fromkeys(STATUSES, 0)
    summary.update(moved_into_fusions=0, moved_out_of_fusions=0)

    def row(x: _Node | None, y: _Node | None, status: str, changes: list[str]) -> dict:
        n = y if y is not None else x
        fx = _cost_fields(costs_a, times_a, x)
        fy = _cost_fields(costs_b, times_b, y)
        summary[status] += 1
        return {
            "a": x.instr.name if x else None, "b": y.instr.name if y else None, "status": status,
            "opcode": n.opcode, "computation": y.comp if y else comps.get(x.comp, x.comp),
            "fusion_a": name(sa, x.container) if x else None, "fusion_b": name(sb, y.container) if y else None,
            "fusion_kind_a": x.instr.fusion_kind if x and x.is_fusion else None,
            "fusion_kind_b": y.instr.fusion_kind if y and y.is_fusion else None,
            "shape_a": x.instr.shape if x else None, "shape_b": y.instr.shape if y else None,
            "operands_a": x.operand_names if x else None, "operands_b": y.operand_names if y else None,
            "literal_a": _clip(x.instr.literal, config.literal_chars) if x and x.instr.literal else None,
            "literal_b": _clip(y.instr.literal, config.literal_chars) if y and y.instr.literal else None,
            "op_name": n.op_name, "source": n.source, "changes": changes,
            "flops_a": fx[0], "flops_b": fy[0], "bytes_accessed_a": fx[1], "bytes_accessed_b": fy[1],
            "time_a_s": fx[2], "time_b_s": fy[2],
        }

    A, B = sa.nodes, sb.nodes
    op_rows = {}
    for x_idx, y_idx in m.ab.items():
        x, y = A[x_idx], B[y_idx]
        changes = _op_changes(m, x, y, config)
        fx = A[x.container] if x.container >= 0 else None
        fy = B[y.container] if y.container >= 0 else None
        moved = None
        if fx is None and fy is not None:
            moved = f"moved into fusion {fy.instr.name}"
            summary["moved_into_fusions"] += 1
        elif fx is not None and fy is None:
            moved = f"moved out of fusion {fx.instr.name}"
            summary["moved_out_of_fusions"] += 1
        elif fx is not None and fab.get(fx.idx) != fy.idx:
            moved = f"moved from fusion {fx.instr.name} to {fy.instr.name}"
        if moved:
            op_rows[y_idx] = (x, "moved", [moved] + changes)
            continue
        if changes:
            changed_ops.add(y_idx)  # for its fusion's "N fused ops changed"
        op_rows[y_idx] = (x, "changed" if changes else "unchanged", changes)

    # Program order of B; an op only in A goes after the A op before it that has a counterpart.
    def b_key(y: _Node) -> tuple:
        return (sb.comp_rank[y.comp], y.idx, 0, 0)

    anchors: dict[int, tuple] = {}
    last, cur = None, None
    for x in sa.nodes:
        if x.comp != cur:
            cur, last = x.comp, None
        y_idx = (fab if x.is_fusion else m.ab).get(x.idx)
        if y_idx is not None and B[y_idx].comp == comps.get(x.comp):
            last = B[y_idx].idx
        elif y_idx is None:
            cb = comps.get(x.comp)
            rank = sb.comp_rank[cb] if cb is not None else len(sb.order) + sa.comp_rank[x.comp]
            anchors[x.idx] = (rank, -1 if last is None else last, 1, x.idx)

    for y in sb.nodes:
        if y.is_fusion:
            x_idx = fba.get(y.idx)
            if x_idx is None:
                rows.append((b_key(y), row(None, y, "added", [])))
            else:
                ch = _fusion_changes(m, fab, A[x_idx], y, changed_ops, config)
                rows.append((b_key(y), row(A[x_idx], y, "changed" if ch else "unchanged", ch)))
        elif y.idx in op_rows:
            x, status, changes = op_rows[y.idx]
            rows.append((b_key(y), row(x, y, status, changes)))
        else:
            rows.append((b_key(y), row(None, y, "added", [])))
    for x_idx, key in anchors.items():
        rows.append((key, row(A[x_idx], None, "removed", [])))
    rows.sort(key=lambda r: r[0])

    return {
        "schema": SCHEMA,
        "a": _side_doc(sa, costs_a, times_a),
        "b": _side_doc(sb, costs_b, times_b),
        "summary": summary,
        "computations": [{"a": ca, "b": comps.get(ca)} for ca in sa.order]
                        + [{"a": None, "b": cb} for cb in sb.order if cb not in set(comps.values())],
        "pairs": [r for _, r in rows],
    }


def has_changes(doc: dict) -> bool:
    """True when the diff found anything added, removed, changed or moved (`--fail-on-change`)."""
    s = doc["summary"]
    return any(s[k] for k in ("added", "removed", "changed", "moved"))
