"""The fusion report: what each fusion holds and costs, and where tensors leave one kernel for another.

Reads one optimized `parse.hlo.HloModule` (CPU or TPU dump) and, optionally, per-instruction times
that the caller already has (measured CPU self time, or the compile report's estimated TPU time).
Returns plain JSON-safe rows, and the `tpudiag.fusions/1` document that holds them:

    {"schema": "tpudiag.fusions/1", "module": {"name", "path"}, "time_source": str | None,
     "fusions": [fusion row...], "breaks": [break row...], "totals": {...}}

`fusion_table`: one row per fusion instruction of an executed computation (the entry, while
bodies and conditions, branches, call targets: `HloModule.executed_computations`). Bytes
and FLOPs are `hlo_cost`'s: `bytes_out` is what the fusion writes (each output once; a
dynamic-update-slice root writes only its update), `bytes_in` is the rest of `hlo_cost`'s
`bytes_accessed` (operands, or the slice a slicing user takes, plus non-scalar constants inside),
so `bytes_in + bytes_out` is exactly the cost model's figure and the read rules live in one place.

`fusion_breaks`: every producer -> consumer edge where the producer materializes a tensor
(a fusion, an unfused op, a collective's result; not a parameter, constant, view or tuple) and
another instruction reads it, so the tensor goes to memory and comes back. Edges are followed
through views (get-tuple-element, bitcast, tuple, copy-start/copy-done, opt-barrier) and into and
out of while loops, calls and conditionals; `via` lists what was passed through. A reason is
given only where the graph shows it, in this order (`reasons` has all that apply):

- custom call boundary: either side is a custom-call (a Pallas kernel, `online-softmax`), or a
  kCustom fusion (a library call such as XLA:CPU's `__ynn_fusion`, emitted whole);
- collective boundary: either side is a collective (or a fusion or async op around one);
- loop boundary: the tensor enters or leaves a while loop, or is carried to its next iteration;
- reduction feeding a broadcast: the tensor is a reduce's result (inside the producer, or up to
  `UPSTREAM_HOPS` unfused elementwise ops before it), and the consumer broadcasts it;
- several users: the tensor has more than one reader (the program's output counts as one);
- mismatched iteration spaces: the tensor's element count is not that of any output of the consumer;

otherwise "reason not inferable". `evidence` says what the graph showed, either way.

Not done here: deciding what XLA *should* have fused, or timing anything. Bytes are logical
(`Shape.bytes`): a tensor that memory-space assignment put in `S(1)` (VMEM on TPU) never reached
HBM, so each break carries its `memory_space`. No I/O.
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from dataclasses import dataclass

from tpudiag.analyze.hlo.categories import index_module
from tpudiag.analyze.hlo.cost import arithmetic_intensity, module_costs
from tpudiag.analyze.hlo.vocabulary import BOOKKEEPING, ELEMENTWISE, IDS, VIEWS
from tpudiag.parse.hlo import HloModule, Instruction
from tpudiag.parse.shapes import Shape, parse_shape
from tpudiag.results.fusions import SCHEMA, FusionBreak, FusionReport, FusionRow, FusionTotals, ModuleRef

CUSTOM_CALL = "custom call boundary"
COLLECTIVE = "collective boundary"
LOOP = "loop boundary"
REDUCE_BROADCAST = "reduction feeding a broadcast"
SEVERAL_USERS = "several users"
MISMATCHED = "mismatched iteration spaces"
NOT_INFERABLE = "reason not inferable"
# Most decisive first: XLA's producer-consumer fusion does not reach into a custom call, a
# collective or across a while loop's state, so when one of those holds it is the reason given;
# the structural ones follow.
REASONS = (CUSTOM_CALL, COLLECTIVE, LOOP, REDUCE_BROADCAST, SEVERAL_USERS, MISMATCHED)

# How many unfused instructions the "reduction feeding a broadcast" check walks back from the
# producer to find the reduce: 2 covers layernorm's `rsqrt(mean + eps)` and `sum * (1/n)` fusions
# that TPU compiles (libtpu 0.0.42) place between the reduce fusion and the broadcasting consumer.
UPSTREAM_HOPS = 2

# Instructions whose output is not a new tensor: inputs, literals and ids, views and tuples, the
# loop/call instructions (their results are their bodies'), the starting half of async pairs (the
# tensor appears at the `-done`), and copy-start/copy-done, which move an existing tensor between
# memory spaces (they are followed through, as views).
_NOT_PRODUCERS = BOOKKEEPING | IDS | frozenset({
    "rng-get-and-update-state", "copy-start", "copy-done", "while", "call", "conditional", "async-update",
    "send", "send-done", "recv",
})
# Ops that keep the tensor's elements one-to-one (the reduce/broadcast walks follow them).
_ONE_TO_ONE = ELEMENTWISE | {"bitcast", "reshape", "copy", "transpose"}
_EVIDENCE_NAMES = 4  # user names listed in "several users" evidence before "and N more"


# -- fusion table ---------------------------------------------------------------------------------


def _fused_instructions(module: HloModule, fusion: Instruction):
    """Every instruction inside a fusion, nested fusions opened (not listed themselves)."""
    return (i for i in module.walk(fusion.called[:1], into=("fusion",)) if i.opcode != "fusion")


def _bytes_out(module: HloModule, fusion: Instruction) -> int:
    """What the fusion writes, by `hlo_cost`'s rules: each output once, a dynamic-update-slice root
    only its update; a kCustom gather/scatter fusion is costed as that op (its output / its updates)."""
    body = module.computations[fusion.called[0]]
    if fusion.fusion_kind == "kCustom":
        for i in body.instructions:
            if i.opcode == "gather":
                return i.parsed_shape.bytes
            if i.opcode == "scatter":
                n = len(i.operands) // 2
                return sum(_defined(module, o).parsed_shape.bytes for o in i.operands[n + 1:2 * n + 1])
    out = fusion.parsed_shape
    root = body.root
    written = 0
    for k, leaf in enumerate(out.tuple_shapes if out.is_tuple else (out,)):
        producer = root
        if out.is_tuple and root.opcode == "tuple" and k < len(root.operands):
            producer = _defined(module, root.operands[k])
        if not leaf.is_tuple and producer.opcode == "dynamic-update-slice":
            written += _defined(module, producer.operands[1]).parsed_shape.bytes
        else:
            written += leaf.bytes
    return written


def fusion_table(module: HloModule, times: dict[str, float] | None = None,
                 time_source: str | None = None, costs: dict | None = None) -> list[dict]:
    """One row per fusion instruction of the executed computations.

    `times`: seconds by instruction name (measured self time, or an estimate), and `time_source`
    says which; both are passed through. Rows are ordered by `time_s` (when given), then by bytes
    moved, then name. `costs`: the module's `module_costs`, when the caller has them already.
    """
    costs = module_costs(module) if costs is None else costs
    rows = []
    for comp_name in module.executed_computations:
        for instr in module.computations[comp_name].instructions:
            if instr.opcode != "fusion" or not instr.called:
                continue
            inner = list(_fused_instructions(module, instr))
            ops = Counter(i.opcode for i in inner if i.opcode != "parameter")
            sources = Counter(s for s in (module.source(i) for i in inner) if s)
            if not sources and module.source(instr):
                sources[module.source(instr)] += 1  # nothing inside has metadata: the fusion's own
            cost = costs[instr.name]
            out = _bytes_out(module, instr)
            t = None if times is None else times.get(instr.name)
            rows.append({
                "name": instr.name, "computation": comp_name, "kind": instr.fusion_kind,
                "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
                "bytes_in": cost.bytes_accessed - out, "bytes_out": out, "flops": cost.flops,
                "transcendentals": cost.transcendentals, "arithmetic_intensity": arithmetic_intensity(cost),
                "sources": [s for s, _ in sorted(sources.items(), key=lambda kv: (-kv[1], kv[0]))],
                "time_s": None if t is None else float(t), "time_source": time_source if t is not None else None,
            })
    rows.sort(key=lambda r: (r["time_s"] is None, -(r["time_s"] or 0.0), -(r["bytes_in"] + r["bytes_out"]), r["name"]))
    return rows


# -- fusion breaks --------------------------------------------------------------------------------


def _defined(module: HloModule, name: str) -> Instruction:
    """The instruction `name` of the module (KeyError if undefined: a malformed module)."""
    found = module.instruction(name)
    if found is None:
        raise KeyError(name)
    return found


def _leaf(shape: Shape, path: tuple[int, ...]) -> Shape | None:
    for k in path:
        if not shape.is_tuple or k >= len(shape.tuple_shapes):
            return None
        shape = shape.tuple_shapes[k]
    return shape


def _leaf_paths(shape: Shape, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    if not shape.is_tuple:
        return [prefix] if shape.is_array else []
    return [p for k, s in enumerate(shape.tuple_shapes) for p in _leaf_paths(s, prefix + (k,))]


def _plain(shape: Shape) -> str:
    """`f32[32,256]`: the shape without its layout."""
    return f"{shape.element_type}[{','.join(str(d) for d in shape.dims)}]"


def _elements(text: str) -> int:
    s = parse_shape(text)
    return s.elements if not s.is_tuple else -1


@dataclass
class _Use:
    consumer: Instruction
    positions: set[int]
    via: list[str]
    loop: str | None  # how the path crossed a while loop, if it did


class _Graph:
    def __init__(self, module: HloModule):
        self.module = module
        self.executed = module.executed_computations
        self.info = index_module(module)
        # computation -> (role, calling instruction) for loop bodies and conditions, branches, call
        # targets: the module's callers, from executed computations, a while's by its role.
        self.callers: dict[str, list[tuple[str, Instruction]]] = {}
        for name in self.executed:
            for i in module.computations[name].instructions:
                if i.opcode == "while":
                    for role, comp in (("body", i.body), ("condition", i.condition)):
                        if comp:
                            self.callers.setdefault(comp, []).append((role, i))
                elif i.opcode in ("call", "conditional"):
                    for c in i.called:
                        self.callers.setdefault(c, []).append((i.opcode, i))

    def by_name(self, name: str) -> Instruction:
        return _defined(self.module, name)

    def param(self, comp: str, number: int) -> Instruction | None:
        return self.module.computations[comp].parameter(number)

    def is_producer(self, instr: Instruction) -> bool:
        op = instr.opcode
        return op not in _NOT_PRODUCERS and not op.endswith("-start")

    # The walk: where does the tensor at `path` of `producer`'s output get read?
    def uses(self, producer: Instruction, path: tuple[int, ...]) -> tuple[list[_Use], list[str]]:
        uses: dict[str, _Use] = {}
        escapes: list[str] = []
        todo = deque([(producer, path, [], None)])
        seen = set()
        while todo:
            node, p, via, loop = todo.popleft()
            if (node.name, p) in seen:
                continue
            seen.add((node.name, p))
            comp = node.computation
            if node.is_root:
                self._leave(node, comp, p, via, loop, todo, escapes)
            for user, pos in self.module.uses_of(node):
                op = user.opcode
                step = via + [user.name]
                if op == "get-tuple-element":
                    if p and p[0] == user.index:
                        todo.append((user, p[1:], step, loop))
                elif op == "tuple":
                    todo.append((user, (pos,) + p, step, loop))
                elif op in VIEWS or (op == "add-dependency" and pos == 0):
                    todo.append((user, p, step, loop))
                elif op == "copy-start":  # (destination, source, context): the tensor lands in element 0
                    todo.append((user, (0,) + p, step, loop))
                elif op == "copy-done":
                    if p and p[0] == 0:
                        todo.append((user, p[1:], step, loop))
                elif op == "while":
                    for comp_name in (user.body or "", user.condition or ""):
                        prm = self.param(comp_name, 0) if comp_name in self.module.computations else None
                        if prm is not None:
                            todo.append((prm, p, step + [prm.name], loop or f"enters while `{user.name}`"))
                elif op == "call" and user.called:
                    prm = self.param(user.called[0], pos)
                    if prm is not None:
                        todo.append((prm, p, step + [prm.name], loop))
                elif op == "conditional" and pos > 0 and pos - 1 < len(user.called):
                    prm = self.param(user.called[pos - 1], 0)
                    if prm is not None:
                        todo.append((prm, p, step + [prm.name], loop))
                elif op in ("after-all",) or (op == "add-dependency" and pos > 0):
                    continue  # ordering tokens: nothing is read
                elif user is not producer:
                    u = uses.setdefault(user.name, _Use(user, set(), via, loop))
                    u.positions.add(pos)  # the same tensor at this operand, whatever the route
        return list(uses.values()), escapes

    def _leave(self, node, comp, p, via, loop, todo, escapes):
        """The tensor is (part of) a computation's result: follow it to whoever runs the computation."""
        entry = self.module.entry
        if entry is not None and comp == entry.name:
            escapes.append("the program's output")
            return
        for role, caller in self.callers.get(comp, []):
            if role == "condition":
                continue  # the loop's predicate: read by the while itself
            if role == "body":
                todo.append((caller, p, via + [caller.name], loop or f"leaves while `{caller.name}`"))
                for c in (comp, caller.condition or ""):
                    prm = self.param(c, 0) if c in self.module.computations else None
                    if prm is not None:
                        todo.append((prm, p, via + [caller.name, prm.name],
                                     loop or f"is carried to the next iteration of while `{caller.name}`"))
            else:
                todo.append((caller, p, via + [caller.name], loop))

    # -- reasons --

    def boundary(self, side: str, instr: Instruction) -> tuple[str, str] | None:
        if instr.opcode == "custom-call":
            return CUSTOM_CALL, f"{side} `{instr.name}` is a custom-call (`{instr.custom_call_target}`)"
        if instr.opcode == "fusion" and instr.fusion_kind == "kCustom":
            config = (instr.backend_config or {}).get("fusion_config")
            kind = config.get("kind") if isinstance(config, dict) else None
            what = f" (`{kind}`)" if isinstance(kind, str) and kind else ""
            return CUSTOM_CALL, f"{side} `{instr.name}` is a kCustom fusion{what}, emitted whole as one call"
        oi = self.info.get(instr.name)
        if oi is not None and oi.bound == "communication":
            return COLLECTIVE, f"{side} `{instr.name}` is a collective ({instr.opcode})"
        return None

    def reduce_origin(self, producer: Instruction, path: tuple[int, ...]):
        """(reduce, the unfused instruction holding it, whether no op came after it) when the tensor
        is a reduce's result, maybe through one-to-one ops inside the producer and up to
        UPSTREAM_HOPS unfused ones before it; else None."""
        todo = [(producer, path, producer, 0, True)]
        seen = set()
        while todo:
            instr, p, holder, hops, direct = todo.pop()
            if (instr.name, p) in seen:
                continue
            seen.add((instr.name, p))
            op = instr.opcode
            if op == "fusion" and instr.called:
                todo.append((self.module.computations[instr.called[0]].root, p, holder, hops, direct))
            elif op == "tuple":
                if p and p[0] < len(instr.operands):
                    todo.append((self.by_name(instr.operands[p[0]]), p[1:], holder, hops, direct))
            elif op == "get-tuple-element":
                todo.append((self.by_name(instr.operands[0]), (instr.index,) + p, holder, hops, direct))
            elif op == "reduce":
                out = _leaf(instr.parsed_shape, p)
                src = self.by_name(instr.operands[0]).parsed_shape
                if out is not None and src.elements > out.elements:
                    return instr, holder, direct
            elif op == "parameter":
                caller = self.module.fusion_callers.get(instr.computation)
                n = instr.parameter_number
                if caller is None or n is None or n >= len(caller.operands):
                    continue
                outer = self.by_name(caller.operands[n])
                if caller.computation in self.executed:  # leaving the top-level fusion: one hop upstream
                    outer, p2 = self.resolve(outer, p)
                    if outer is None or hops >= UPSTREAM_HOPS or not self.is_producer(outer):
                        continue
                    todo.append((outer, p2, outer, hops + 1, False))
                else:
                    todo.append((outer, p, holder, hops, direct))
            elif op in _ONE_TO_ONE and not p:
                n = _elements(instr.shape)
                for o in instr.operands:
                    oi = self.module.instruction(o)
                    if oi is None or _elements(oi.shape) != n:
                        continue
                    if instr.computation in self.executed:  # an unfused op: its operands are one hop upstream
                        oi, p2 = self.resolve(oi, ())
                        if oi is None or hops >= UPSTREAM_HOPS or not self.is_producer(oi):
                            continue
                        todo.append((oi, p2, oi, hops + 1, False))
                    else:
                        todo.append((oi, (), holder, hops, False))
        return None

    def resolve(self, instr: Instruction, path: tuple[int, ...]) -> tuple[Instruction | None, tuple[int, ...]]:
        """Back through views and tuples to the instruction that made the tensor, and where in its output."""
        while instr.opcode in VIEWS or instr.opcode in ("get-tuple-element", "copy-done", "copy-start", "tuple"):
            if instr.opcode == "tuple":
                if not path or path[0] >= len(instr.operands):
                    return None, path
                instr, path = self.by_name(instr.operands[path[0]]), path[1:]
                continue
            if instr.opcode == "get-tuple-element":
                path = (instr.index,) + path
            elif instr.opcode == "copy-done":
                path = (0,) + path
            elif instr.opcode == "copy-start":
                if not path or path[0] != 0:
                    return None, path
                path = path[1:]
            instr = self.by_name(instr.operands[0])
        return instr, path

    def iteration_spaces(self, instr: Instruction) -> list[tuple[str, int]]:
        """(shape, elements) of what the instruction loops over: each array output, and for a reduce
        (alone, or inside a fusion) its input, which is what a reduction's loop runs over."""
        out = instr.parsed_shape
        spaces = [(_plain(s), s.elements) for s in out.leaves() if s.is_array]
        reduces = [instr] if instr.opcode == "reduce" else [
            i for i in (_fused_instructions(self.module, instr) if instr.opcode == "fusion" else ())
            if i.opcode == "reduce"]
        for r in reduces:
            src = self.by_name(r.operands[0]).parsed_shape
            spaces.append((_plain(src), src.elements))
        seen, unique = set(), []
        for t, n in spaces:
            if t not in seen:
                seen.add(t)
                unique.append((t, n))
        return unique

    def broadcast_use(self, consumer: Instruction, positions: set[int], elements: int) -> Instruction | None:
        """The broadcast that spreads the tensor inside the consumer (through one-to-one ops and
        nested fusions), or the consumer itself when it is a broadcast."""
        if consumer.opcode == "broadcast":
            return consumer if _elements(consumer.shape) > elements else None
        if consumer.opcode != "fusion" or not consumer.called:
            return None
        todo = [self.param(consumer.called[0], k) for k in positions]
        seen = set()
        while todo:
            x = todo.pop()
            if x is None or x.name in seen:
                continue
            seen.add(x.name)
            for user, pos in self.module.uses_of(x):
                if user.opcode == "broadcast" and _elements(user.shape) > elements:
                    return user
                if user.opcode in _ONE_TO_ONE and _elements(user.shape) == elements:
                    todo.append(user)
                elif user.opcode == "fusion" and user.called:
                    todo.append(self.param(user.called[0], pos))
        return None


def _kind(instr: Instruction) -> str:
    return f"fusion:{instr.fusion_kind}" if instr.opcode == "fusion" else instr.opcode


def _count(n: int) -> str:
    return f"{n:,} element" + ("" if n == 1 else "s")


def _names(names: list[str]) -> str:
    shown = ", ".join(n if n.startswith("the ") else f"`{n}`" for n in names[:_EVIDENCE_NAMES])
    return shown + (f" and {len(names) - _EVIDENCE_NAMES} more" if len(names) > _EVIDENCE_NAMES else "")


def _explain(g: _Graph, producer: Instruction, leaf: Shape, use: _Use, readers: list[str],
             origin) -> tuple[list[str], list[str]]:
    """(reasons in REASONS order, evidence) for one break; `origin()` is the producer's reduce origin."""
    c = use.consumer
    reasons, evidence = [], []
    for side, x in (("producer", producer), ("consumer", c)):
        b = g.boundary(side, x)
        if b:
            reasons.append(b[0])
            evidence.append(b[1])
    if use.loop:
        reasons.append(LOOP)
        evidence.append(f"the tensor {use.loop}")
    bcast = g.broadcast_use(c, use.positions, leaf.elements)
    found = origin() if bcast is not None else None
    if found:
        red, holder, direct = found
        src = _plain(g.by_name(red.operands[0]).parsed_shape)
        what = f"reduce `{red.name}` ({src} -> {_plain(leaf)})"
        if red is producer:
            said = f"`{producer.name}` is a reduce ({src} -> {_plain(leaf)})"
        elif holder is producer:
            said = f"`{producer.name}` outputs {what}" + ("" if direct else " through elementwise/reshape ops")
        else:
            said = f"`{producer.name}` derives elementwise from {what} in `{holder.name}`"
        reasons.append(REDUCE_BROADCAST)
        evidence.append(f"{said}; `{c.name}` broadcasts it (`{bcast.name}` -> {_plain(bcast.parsed_shape)})")
    if len(readers) > 1:
        reasons.append(SEVERAL_USERS)
        evidence.append(f"{len(readers)} users: {_names(readers)}")
    spaces = g.iteration_spaces(c)
    if spaces and leaf.elements not in [n for _, n in spaces]:
        reasons.append(MISMATCHED)
        evidence.append(f"{_plain(leaf)} ({_count(leaf.elements)}) feeds `{c.name}`, which iterates over "
                        + " and ".join(f"{t} ({_count(n)})" for t, n in spaces))
    reasons = [r for r in REASONS if r in reasons]  # once each, most decisive first
    if not reasons:
        evidence.append(f"one user; {_count(leaf.elements)} on both sides; no custom call, collective or loop "
                        f"between them; not a reduce feeding a broadcast")
    return reasons, evidence


def fusion_breaks(module: HloModule) -> list[dict]:
    """Every unfused producer -> consumer edge of the executed computations, largest tensor first."""
    g = _Graph(module)
    rows = []
    for comp_name in g.executed:
        for producer in module.computations[comp_name].instructions:
            if not g.is_producer(producer):
                continue
            out = producer.parsed_shape
            for path in _leaf_paths(out):
                leaf = _leaf(out, path)
                uses, escapes = g.uses(producer, path)
                readers = [u.consumer.name for u in uses] + escapes
                origin = functools.cache(functools.partial(g.reduce_origin, producer, path))  # on demand, once
                for use in uses:
                    reasons, evidence = _explain(g, producer, leaf, use, readers, origin)
                    rows.append({
                        "producer": producer.name, "producer_kind": _kind(producer),
                        "output_index": path[0] if path else None,
                        "consumer": use.consumer.name, "consumer_kind": _kind(use.consumer),
                        "bytes": leaf.bytes, "shape": _plain(leaf), "memory_space": leaf.memory_space,
                        "reason": reasons[0] if reasons else NOT_INFERABLE, "reasons": reasons,
                        "evidence": "; ".join(evidence), "via": list(use.via), "users": len(readers),
                    })
    rows.sort(key=lambda r: (-r["bytes"], r["producer"], r["output_index"] or 0, r["consumer"]))
    return rows


def build_fusion_report(module: HloModule, times: dict[str, float] | None = None,
                        time_source: str | None = None, costs: dict | None = None) -> FusionReport:
    """The `tpudiag.fusions/1` document for one module (`costs`: its `module_costs`, if computed)."""
    fusions = fusion_table(module, times, time_source, costs)
    breaks = fusion_breaks(module)
    hbm = [b for b in breaks if b["memory_space"] == 0]
    return FusionReport(
        schema=SCHEMA,
        module=ModuleRef(name=module.name, path=module.path),
        time_source=time_source if times is not None else None,
        fusions=tuple(FusionRow(**{**f, "sources": tuple(f["sources"])}) for f in fusions),
        breaks=tuple(FusionBreak(**{**b, "reasons": tuple(b["reasons"]), "via": tuple(b["via"])}) for b in breaks),
        totals=FusionTotals(
            fusions=len(fusions),
            fusion_bytes=sum(f["bytes_in"] + f["bytes_out"] for f in fusions),
            breaks=len(breaks),
            break_bytes=sum(b["bytes"] for b in breaks),
            break_bytes_default_memory=sum(b["bytes"] for b in hbm),
            breaks_not_inferable=sum(b["reason"] == NOT_INFERABLE for b in breaks),
        ),
    )


def fusion_summary(report: FusionReport, top: int = 5) -> dict:
    """The short form embedded in profile and compile reports: totals and the largest breaks."""
    keep = ("producer", "consumer", "bytes", "shape", "memory_space", "reason")
    return {"module": report.module.name, **report.totals.to_dict(),
            "top_breaks": [{k: getattr(b, k) for k in keep} for b in report.breaks[:top]]}
