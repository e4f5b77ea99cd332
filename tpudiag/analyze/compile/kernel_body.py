"""The MXU work of a Pallas TPU kernel, read from its own body: for a kernel that gives no cost
estimate of its own (JAX's splash attention gives none), whose op would otherwise count 0 FLOPs.

A Pallas TPU kernel reaches the compiled step as a `tpu_custom_call` whose backend config holds the
kernel's Mosaic module (MLIR bytecode, base64). Its entry function carries the grid
(`iteration_bounds`) and runs once per grid step; its matmuls (`tpu.matmul`) have static shapes.
The MXU work is each matmul's 2 x M x N x K, times the constant trip counts of the loops around it,
summed over the grid steps that run it.

A matmul under `scf.if` on a value the kernel loads from a scalar-prefetched table indexed by the
grid (splash attention's block mask: a causal mask's blocks above the diagonal are skipped) runs on
the steps where that condition holds. Where the table is a constant of the step (its values written
beside the optimized HLO by the compile worker: `kernel_tables`), the condition is evaluated for
every grid step; where it cannot be (values not known, an operation the evaluator does not follow,
more than MAX_STEPS steps), every step is counted and the work says so (`resolved`). A loop whose
trip count is not a constant counts one trip.

What it leaves out: the kernel's vector and transcendental work (softmax's exp and reductions, which
bound attention at a head dimension of 128 on some chips), its DMA, and an f32 matmul's extra MXU
passes. So, resolved, the work is a floor on the kernel's time, not an estimate of it; unresolved,
it also counts the steps a kernel skips. Reading the body needs
jax's MLIR bindings with the TPU dialect; without them (or with a body they cannot read) there is
no figure.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, replace

# A grid of more steps than this is counted densely: each step's guards are evaluated in Python
# (a few microseconds a step).
MAX_STEPS = 1 << 20


def _unsigned(f):
    def cmp(a, b):
        if a < 0 or b < 0:
            raise _Unknown("an unsigned comparison of a negative value")
        return f(a, b)
    return cmp


def _div(f):
    def div(a, b):
        if b == 0:
            raise _Unknown("division by zero")
        return f(a, b)
    return div


_CMP = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "slt": lambda a, b: a < b,
        "sle": lambda a, b: a <= b, "sgt": lambda a, b: a > b, "sge": lambda a, b: a >= b,
        "ult": _unsigned(lambda a, b: a < b), "ule": _unsigned(lambda a, b: a <= b),
        "ugt": _unsigned(lambda a, b: a > b), "uge": _unsigned(lambda a, b: a >= b)}
_BIN = {"arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b,
        "arith.andi": lambda a, b: a & b, "arith.ori": lambda a, b: a | b, "arith.xori": lambda a, b: a ^ b,
        "arith.maxsi": max, "arith.minsi": min, "arith.maxui": _unsigned(max), "arith.minui": _unsigned(min),
        "arith.shli": lambda a, b: a << b, "arith.shrsi": lambda a, b: a >> b,
        "arith.shrui": _unsigned(lambda a, b: a >> b),
        # C semantics (round toward zero) for divsi/remsi; floor and ceiling for their own ops
        "arith.divsi": _div(lambda a, b: abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)),
        "arith.remsi": _div(lambda a, b: a - b * (abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1))),
        "arith.divui": _div(_unsigned(lambda a, b: a // b)), "arith.remui": _div(_unsigned(lambda a, b: a % b)),
        "arith.floordivsi": _div(lambda a, b: a // b), "arith.ceildivsi": _div(lambda a, b: -(-a // b))}
_CASTS = ("arith.index_cast", "arith.extsi", "arith.trunci")  # values as loaded: signed
_UNSIGNED_CASTS = ("arith.extui", "arith.index_castui")  # the same where the value is not negative
_PREDICATES = ("eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge")


@dataclass(frozen=True)
class KernelWork:
    flops: int  # MXU work over the grid steps that run it
    dense_flops: int  # every grid step counted
    steps: int  # grid steps
    active: int  # grid steps that run some of the matmuls (all of them where one is not guarded)
    matmuls: int  # tpu.matmul ops in the body
    guarded: bool  # some of the work runs under a branch (`scf.if`) of the body
    resolved: bool  # that condition was evaluated from the table's values (False: every step counted)
    dynamic: int = 0  # grid axes sized at run time (their sizes: the custom call's leading operands)
    bounds: tuple = ()  # the grid, the axes sized at run time at their sizes
    # every branch some of the matmuls run under reads a scalar-prefetched table (none on grid ids alone)
    table_gated: bool = False
    parallel: int = 1  # grid steps over the axes whose dimension semantics are `parallel`
    # ((the value, 1, 0 or None where unknown, of each `scf.if` condition on a table, in walk order), the
    # active steps that have them), most steps first; () where the steps were not evaluated
    signatures: tuple = ()


class _Unknown(Exception):
    """A value the guard evaluator cannot follow."""


def _module(body: bytes):
    """The kernel's Mosaic module, deserialized (a context that knows the TPU dialect)."""
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        ctx.allow_unregistered_dialects = True
        module = ir.Module.parse(body)
        PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
    return ctx, module


def kernel_body(backend_config) -> bytes | None:
    """The Mosaic module's bytes from a `tpu_custom_call`'s backend config; None when it has none."""
    cfg = (backend_config or {}).get("custom_call_config") if isinstance(backend_config, dict) else None
    body = cfg.get("body") if isinstance(cfg, dict) else None
    if not isinstance(body, str) or not body:
        return None
    try:
        return base64.b64decode(body, validate=True)
    except ValueError:
        return None


def _attrs(op) -> dict:
    """An operation's attributes by name (iterating the bindings' map gives names, or named
    attributes in some versions)."""
    out = {}
    for a in op.attributes:
        if isinstance(a, str):
            out[a] = op.attributes[a]
        else:
            out[a.name] = a.attr
    return out


def _ints(attr) -> list[int]:
    return [int(x) for x in re.findall(r"(?<![\w.])-?\d+", str(attr))]


def _shape(t) -> list[int]:
    m = re.match(r"(?:vector|memref|tensor)<([\dx]+)x[a-z]", str(t))
    return [int(d) for d in m.group(1).split("x")] if m else []


def _matmul_flops(op) -> int:
    """2 x (result elements) x K of a `tpu.matmul`; K from its dimension numbers (the lhs's
    contracting dimensions), else the lhs's last dimension (its first where `transpose_lhs`)."""
    lhs, out = _shape(op.operands[0].type), _shape(op.results[0].type)
    if not lhs or not out:
        return 0
    attrs = _attrs(op)
    k = lhs[-1]
    if "dimension_numbers" in attrs:
        m = re.search(r"<\[([\d, ]*)\]", str(attrs["dimension_numbers"]))
        if m:  # no contracting dimension: an outer product, K 1
            k = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d.strip())
    elif "transpose_lhs" in attrs and str(attrs["transpose_lhs"]) == "true":
        k = lhs[0]
    return 2 * math.prod(out) * k


class _Guards:
    """Compiles a condition's SSA value into a function of the grid step: arith on the grid ids,
    constants and loads from scalar-prefetched tables (`memref.load %table[...]`)."""

    def __init__(self, grid_args, tables):
        self.grid = grid_args  # block arguments: the grid ids
        self.tables = tables  # [(block argument, (shape, flat values) or None where unknown)]

    def compile(self, v):
        from jaxlib.mlir import ir

        if isinstance(v.owner, ir.Block):  # a block argument
            for n, g in enumerate(self.grid):
                if g == v:
                    return lambda ids, n=n: ids[n]
            raise _Unknown("block argument")
        op = v.owner
        name = op.name
        attrs = _attrs(op)
        if name == "arith.constant":
            text = str(attrs.get("value", ""))
            got = 1 if text.startswith("true") else 0 if text.startswith("false") else _ints(text)
            if isinstance(got, list):
                if len(got) != 1:
                    raise _Unknown("constant")
                got = got[0]
            return lambda ids, c=got: c
        if name in _CASTS:
            return self.compile(op.operands[0])
        if name in _UNSIGNED_CASTS:
            f = self.compile(op.operands[0])

            def nonnegative(ids):
                v = f(ids)
                if v < 0:
                    raise _Unknown("an unsigned cast of a negative value")
                return v
            return nonnegative
        if name in _BIN:
            a, b, f = self.compile(op.operands[0]), self.compile(op.operands[1]), _BIN[name]
            return lambda ids: f(a(ids), b(ids))
        if name == "arith.cmpi":
            f = _CMP[_PREDICATES[_ints(attrs["predicate"])[0]]]
            a, b = self.compile(op.operands[0]), self.compile(op.operands[1])
            return lambda ids: int(f(a(ids), b(ids)))
        if name == "arith.select":
            c, a, b = (self.compile(op.operands[i]) for i in range(3))
            return lambda ids: a(ids) if c(ids) else b(ids)
        if name == "memref.load":
            table = next((t for arg, t in self.tables if arg == op.operands[0]), None)
            if table is None:
                raise _Unknown("load from a table whose values are not known")
            shape, flat = table
            index = [self.compile(i) for i in list(op.operands)[1:]]
            if len(index) != len(shape):
                raise _Unknown("index")

            def load(ids):
                pos = 0
                for f, s in zip(index, shape):
                    i = f(ids)
                    if not 0 <= i < s:
                        raise _Unknown("index out of the table")
                    pos = pos * s + i
                return flat[pos]
            return load
        raise _Unknown(name)


def _walk(block, mult, guard, found):
    """Collect (flops x constant loop trips, the conditions around it) for each matmul under `block`."""
    for op in block.operations:
        name = op.operation.name
        if name == "tpu.matmul":
            found.append((_matmul_flops(op.operation) * mult, guard))
            continue
        trips = 1
        if name == "scf.for":
            try:
                lb, ub, step = (_Guards([], []).compile(op.operation.operands[i])(()) for i in range(3))
                trips = max(0, -(-(ub - lb) // step)) if step > 0 else 1
            except _Unknown:
                trips = 1  # a data-dependent loop: one trip
        regions = list(op.operation.regions)
        for r, region in enumerate(regions):
            cond = guard
            if name == "scf.if":  # then-region under the condition, else-region under its negation
                cond = (*guard, (op.operation.operands[0], r == 0))
            for b in region.blocks:
                _walk(b, mult * trips, cond, found)


def _table_ifs(block, tables, found: list) -> list:
    """The `scf.if`s under `block` whose condition reads one of `tables`, in walk order (the order
    `step_probe` finds them in again)."""
    for op in block.operations:
        if op.operation.name == "scf.if" and _reads_table(op.operation.operands[0], tables):
            found.append(op.operation)
        for region in op.operation.regions:
            for inner in region.blocks:
                _table_ifs(inner, tables, found)
    return found


def _value(f, ids):
    """A compiled condition's value at a grid step: 0 or 1, or None where it cannot be evaluated."""
    try:
        return int(bool(f(ids))) if f is not None else None
    except (_Unknown, TypeError, ValueError, IndexError, OverflowError):
        return None


def _entry(module):
    """The kernel's entry function (the one with a grid) as (op, iteration bounds, number of
    scalar-prefetched tables, dimension semantics per axis), or None where the body has no grid."""
    for op in module.body.operations:
        attrs = _attrs(op.operation)
        if "iteration_bounds" in attrs:
            prefetch = _ints(attrs["scalar_prefetch"])[0] if "scalar_prefetch" in attrs else 0
            semantics = re.findall(r"dimension_semantics<(\w+)>", str(attrs.get("dimension_semantics", "")))
            return op, _ints(attrs["iteration_bounds"]), prefetch, semantics
    return None


def kernel_work(body: bytes, operands: list | None = None) -> KernelWork | None:
    """The kernel's MXU work. `operands`: for each operand of the custom call in order, its values
    (flat, row-major) where the step holds it as a constant, else None: first one scalar for each grid
    axis sized at run time, then the scalar-prefetched tables. None when the body cannot be read, has
    no grid or no matmul, or a grid axis sized at run time is not a known constant."""
    operands = list(operands or [])
    try:
        ctx, module = _module(body)
    except Exception:  # noqa: BLE001 - a body these bindings cannot read: no figure
        return None
    with ctx:
        found = _entry(module)
        if found is None:
            return None
        main, bounds, prefetch, semantics = found
        dynamic = sum(1 for b in bounds if b < 0)  # axes sized at run time: the leading operands
        sizes = iter(operands[:dynamic])
        for d, b in enumerate(bounds):
            if b < 0:
                got = next(sizes, None)
                bounds[d] = got[0] if got and len(got) == 1 else 0
        if not bounds or any(b < 1 for b in bounds):  # a size not known, or an empty grid
            return None
        entry = main.operation.regions[0].blocks[0]
        args = list(entry.arguments)
        grid_args = args[:len(bounds)]
        table_args = []
        tables = operands[dynamic:]
        for n, arg in enumerate(args[len(bounds):len(bounds) + prefetch]):
            vals = tables[n] if n < len(tables) else None
            shape = _shape(arg.type)
            table_args.append((arg, (shape, list(vals)) if vals is not None and len(vals) == math.prod(shape)
                               else None))
        found: list = []
        _walk(entry, 1, (), found)
        if not found:
            return None
        steps = math.prod(bounds)
        per_step = sum(f for f, _ in found)
        dense = per_step * steps
        guarded = [(f, g) for f, g in found if g]
        table_values = [a for a, _ in table_args]
        gated = bool(guarded) and all(_reads_table(v, table_values) for _, g in guarded for v, _ in g)
        parallel = math.prod(b for b, sem in zip(bounds, semantics) if sem == "parallel") \
            if len(semantics) == len(bounds) else 1
        shape = dict(dynamic=dynamic, bounds=tuple(bounds), table_gated=gated, parallel=parallel)
        dense_work = KernelWork(dense, dense, steps, steps, len(found), bool(guarded), not guarded, **shape)
        ifs_ops = _table_ifs(entry, table_values, [])
        if steps > MAX_STEPS or not (guarded or ifs_ops):  # nothing to evaluate step by step
            return dense_work if guarded else replace(dense_work, signatures=(((), steps),))
        ev = _Guards(grid_args, table_args)
        unguarded = sum(f for f, g in found if not g)
        total, active = unguarded * steps, 0
        by_guard: dict[tuple, int] = {}  # matmuls under the same conditions: their work together
        for f, g in guarded:
            by_guard[g] = by_guard.get(g, 0) + f
        ifs = []  # the conditions on the tables, each compiled where it can be
        for op in ifs_ops:
            try:
                ifs.append(ev.compile(op.operands[0]))
            except _Unknown:
                ifs.append(None)
        signatures: dict[tuple, int] = {}
        try:
            conds = {}  # each distinct condition value, compiled once
            checks = []
            for g, f in by_guard.items():
                for v, _ in g:
                    if v not in conds:
                        conds[v] = ev.compile(v)
                checks.append((f, [(conds[v], want) for v, want in g]))
            for ids in _grid(bounds):
                seen, ran = {}, bool(unguarded)
                for f, needs in checks:
                    if all(_holds(seen, c, want, ids) for c, want in needs):
                        total += f
                        ran = True
                if ran:
                    active += 1
                    key = tuple(_value(f, ids) for f in ifs)
                    signatures[key] = signatures.get(key, 0) + 1
        except (_Unknown, TypeError, ValueError, IndexError, OverflowError):
            return dense_work
        ranked = tuple(sorted(signatures.items(), key=lambda kv: (-kv[1], str(kv[0]))))
        return KernelWork(total, dense, steps, active, len(found), bool(guarded), True, signatures=ranked, **shape)


def _holds(seen: dict, cond, want: bool, ids) -> bool:
    """Whether `cond` (a compiled condition) is `want` at grid step `ids`; each evaluated once a step."""
    key = id(cond)
    if key not in seen:
        seen[key] = bool(cond(ids))
    return seen[key] == want


def _grid(bounds):
    ids = [0] * len(bounds)
    for _ in range(math.prod(bounds)):
        yield tuple(ids)
        for d in reversed(range(len(bounds))):
            ids[d] += 1
            if ids[d] < bounds[d]:
                break
            ids[d] = 0


# The grid steps of a kernel's two step probes along its last axis: the difference of their static
# cycles is one step's. Neither reaches the axis's last step, where a kernel writes its output block
# back (splash attention writes its output once a row of key blocks is done), so the axis must have
# more than STEP_PROBE[1] steps.
STEP_PROBE = (2, 3)

# HLO element types as StableHLO spells them (a probe's operands and results).
_TENSOR_TYPES = {"bf16": "bf16", "f32": "f32", "f16": "f16", "f64": "f64", "s8": "i8", "s16": "i16", "s32": "i32",
                 "s64": "i64", "u8": "ui8", "u16": "ui16", "u32": "ui32", "u64": "ui64", "pred": "i1",
                 "f8e4m3fn": "f8E4M3FN", "f8e5m2": "f8E5M2", "s4": "i4", "u4": "ui4"}


def _tensor(shape: str) -> tuple[str, int] | None:
    """(the StableHLO tensor type of an HLO array shape, its rank); None where it has no spelling here."""
    m = re.match(r"(\w+)\[([\d,]*)\]", shape or "")
    if not m or m.group(1) not in _TENSOR_TYPES:
        return None
    dims = [d for d in m.group(2).split(",") if d]
    return "tensor<" + "".join(f"{d}x" for d in dims) + _TENSOR_TYPES[m.group(1)] + ">", len(dims)


def _reads_table(value, tables, depth: int = 0) -> bool:
    """Whether `value` is computed from a load of one of `tables` (the scalar-prefetch arguments)."""
    from jaxlib.mlir import ir

    owner = value.owner
    if isinstance(owner, ir.Block) or depth > 16:
        return False
    if owner.name == "memref.load" and any(owner.operands[0] == t for t in tables):
        return True
    return any(_reads_table(v, tables, depth + 1) for v in owner.operands)


def _layout(rank: int) -> str:
    """Row-major, as Pallas lowers a kernel's operands and results."""
    if not rank:
        return "dense<> : tensor<0xindex>"
    return f"dense<[{', '.join(str(d) for d in reversed(range(rank)))}]> : tensor<{rank}xindex>"


def step_probe(backend_config: dict, operand_shapes: list[str], result_shape: str, steps: int, work: KernelWork,
               signature: tuple) -> str | None:
    """A StableHLO module holding the kernel alone with its body rewritten: the grid cut to `steps`
    along its last axis (every other axis to 1; an axis sized at run time takes its size from `work`,
    and its operand is dropped), and every `scf.if` whose condition reads one of its scalar-prefetched
    tables set to its value in `signature` (one of `work.signatures`; an unknown value to false), so
    that each step does the work of the grid steps that have that signature (the static profile does
    not follow a branch on a table's values). Operands and results are row-major, as Pallas lays them
    out. None where the body cannot be read or rewritten, its last axis has no more than
    STEP_PROBE[1] steps, the signature does not fit the body, or a shape has no StableHLO spelling."""
    import io
    import json

    body = kernel_body(backend_config)
    args = [_tensor(s) for s in operand_shapes[work.dynamic:]]
    results = [_tensor(s) for s in re.findall(r"\w+\[[\d,]*\]", result_shape or "")]
    if body is None or not results or None in args or None in results:
        return None
    try:
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import arith
        from jaxlib.mlir.passmanager import PassManager

        ctx, module = _module(body)
        with ctx, ir.Location.unknown():
            found = _entry(module)
            if found is None:
                return None
            main, bounds, prefetch, _ = found
            if len(bounds) != len(work.bounds) or work.bounds[-1] <= STEP_PROBE[1]:
                return None
            main.operation.attributes["iteration_bounds"] = ir.DenseI64ArrayAttr.get([1] * (len(bounds) - 1) + [steps])
            entry = main.operation.regions[0].blocks[0]
            ifs = _table_ifs(entry, list(entry.arguments)[len(bounds):len(bounds) + prefetch], [])
            if len(ifs) != len(signature):
                return None
            for op, value in zip(ifs, signature):
                with ir.InsertionPoint(op):
                    const = arith.ConstantOp(ir.IntegerType.get_signless(1), int(bool(value)))
                op.operands[0] = const.result
            PassManager.parse("builtin.module(mosaic-serde{serialize=true})").run(module.operation)
            buf = io.BytesIO()
            module.operation.write_bytecode(buf, desired_version=0)
    except Exception:  # noqa: BLE001 - bindings that cannot read or rewrite this body: no probe
        return None
    config = json.loads(json.dumps(backend_config))
    ccc = config["custom_call_config"]
    ccc.pop("debug_locations", None)  # they name the original body's operations
    if work.dynamic:  # the fields indexed by operand follow the dropped leading operands
        fusion = ccc.get("allow_input_fusion")
        if isinstance(fusion, list) and len(fusion) == len(operand_shapes):  # else it counts the kernel's own
            ccc["allow_input_fusion"] = fusion[work.dynamic:]
        if isinstance(ccc.get("input_memory_space_colors"), list):
            ccc["input_memory_space_colors"] = [
                {**c, "operand_index": c["operand_index"] - work.dynamic}
                for c in ccc["input_memory_space_colors"] if c.get("operand_index", 0) >= work.dynamic]
        ccc.pop("operand_to_metadata", None)  # metadata by operand: not needed to compile the probe
    ccc["body"] = base64.b64encode(buf.getvalue()).decode()
    escaped = json.dumps(config).replace("\\", "\\5C").replace('"', "\\22")
    types = [t for t, _ in results]
    n = len(results)
    out_type = f"({', '.join(types)})" if n > 1 else types[0]
    params = ", ".join(f"%a{i}: {t}" for i, (t, _) in enumerate(args))
    operands = ", ".join(f"%a{i}" for i in range(len(args)))
    returned = ", ".join(f"%0#{i}" for i in range(n)) if n > 1 else "%0"
    layouts = (f"operand_layouts = [{', '.join(_layout(r) for _, r in args)}], "
               f"result_layouts = [{', '.join(_layout(r) for _, r in results)}]")
    return "\n".join([
        "module @kernel_step_probe attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {",
        f"  func.func public @main({params}) -> ({', '.join(types)}) {{",
        f"    %0{':' + str(n) if n > 1 else ''} = stablehlo.custom_call @tpu_custom_call({operands}) "
        f"{{backend_config = \"{escaped}\", {layouts}}} : ({', '.join(t for t, _ in args)}) -> {out_type}",
        f"    return {returned} : {', '.join(types)}",
        "  }", "}"]) + "\n"
