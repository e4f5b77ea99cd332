"""Static cost of HLO instructions: FLOPs, transcendentals and bytes accessed, per op and per module.

Reads `parse.hlo` model objects (shapes through `parse.shapes`); returns frozen `Cost` records. No I/O.

The conventions are XLA's `HloCostAnalysis` (xla/service/hlo_cost_analysis.cc), which is what
`compiled.cost_analysis()` reports on CPU and, with padded shape sizes, on TPU:

- dot: 2 x output elements x product of the lhs contracting dims (an FMA is two FLOPs); the TPU
  compiler writes matmuls as `convolution(...), dim_labels=bf_io->bf`, which comes out the same.
- convolution: 2 x batch x output features x input features per group x, per spatial dim, the
  (output position, kernel tap) pairs that land on real input (padding and dilation holes skipped).
- elementwise ops: one FLOP per output element, or one transcendental for exp, log, tanh, rsqrt,
  logistic, erf, power, sin, cos, ... (convert, compare, select, bitcast-convert count as FLOPs too).
- reduce: (input elements - output elements) x the reducer's cost; reduce-window, scatter, map,
  select-and-scatter likewise; sort n*ceil(log2 n); all-reduce one FLOP per output element.
- fusion: the FLOPs of every op inside; bytes are only what crosses memory: each fusion operand
  read once (or only the slice a slice/dynamic-slice user takes), each output written once (a
  dynamic-update-slice root writes only its update), plus non-scalar constants inside.
- other ops: bytes = operand bytes + output bytes; slice/dynamic-slice/gather read only what they
  output; parameter, constant, tuple, get-tuple-element, bitcast, opt-barrier and the *-done
  halves of async pairs touch nothing.
- while / call / conditional / async-start: the cost of the called computations, counted once
  (a while's trip count is not known statically, as in XLA; `known_trip_count` reads the one
  XLA's CPU pipeline sometimes records); conditional: the costliest branch.

Where this deliberately differs from XLA:
- bytes are logical (`Shape.bytes`): no TPU tiling padding, no tuple pointer tables (`tuple` is 0).
- copy-start costs its operand plus the destination buffer (read + write, like `copy`); XLA adds
  the whole output tuple (destination, source alias, context) and the tuple again at copy-done,
  about twice the traffic. Async collectives (`*-start`) likewise count operand + result.
- custom-call: the kernel's own `cost_estimate` (Pallas `pl.CostEstimate`) where the backend
  config carries one, else 0 FLOPs and operand + output bytes; XLA reports -1 ("unknown").
- dynamic-slice/dynamic-update-slice count every start index, not only the first.
- a fused parameter read only by a nested fusion that is the fusion's root counts as read once;
  XLA counts 0 for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import (ASYNC_DONE, BOOKKEEPING, COLLECTIVE_START_TUPLE, ELEMENTWISE,
                                            NO_WORK_CALLS, TRANSCENDENTAL)
from tpudiag.errors import ParseError
from tpudiag.parse.hlo import HloModule, Instruction, WindowDim
from tpudiag.parse.shapes import Shape

FMA_FLOPS = 2  # XLA's kFmaFlops: a multiply-add is two FLOPs

# No computation and no memory traffic: views, bookkeeping, and the waiting half of async pairs
# (their transfer is counted at the start).
ZERO_COST = BOOKKEEPING | ASYNC_DONE


@dataclass(frozen=True)
class Cost:
    flops: int = 0
    transcendentals: int = 0
    bytes_accessed: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.transcendentals + other.transcendentals,
                    self.bytes_accessed + other.bytes_accessed)

    def to_dict(self) -> dict[str, int]:
        return {"flops": self.flops, "transcendentals": self.transcendentals, "bytes_accessed": self.bytes_accessed}


def arithmetic_intensity(cost: Cost) -> float | None:
    """FLOPs per byte accessed (transcendentals not included, as in XLA's roofline); None when the
    op touches no memory, where intensity is undefined."""
    return cost.flops / cost.bytes_accessed if cost.bytes_accessed > 0 else None


def _valid_positions(w: WindowDim, in_size: int, out_size: int, k_size: int) -> int:
    """(output position, kernel tap) pairs of one spatial dim that read a real input element: the
    count XLA's GetConvolutionFlops loop makes, in closed form per kernel tap (the loop over output
    positions is a Python loop of out_size x k_size steps: a strided window over a 65,536-long
    dimension, as a training step's cumulative sums compile to, took minutes)."""
    count = 0
    for k in range(k_size):
        count += _taps_on_input(w.stride, w.lhs_dilate, k * w.rhs_dilate - w.pad_lo, in_size, out_size)
    return count


def _taps_on_input(stride: int, lhs_dilate: int, offset: int, in_size: int, out_size: int) -> int:
    """Output positions o in [0, out_size) whose input index u = o * stride + offset lands on a real
    element of the lhs-dilated input: 0 <= u <= (in_size - 1) * lhs_dilate and u % lhs_dilate == 0."""
    if in_size <= 0 or out_size <= 0:
        return 0
    top = (in_size - 1) * lhs_dilate
    lo = max(0, -(offset // stride))  # the first o with u >= 0: ceil(-offset / stride)
    hi = min(out_size - 1, (top - offset) // stride)  # the last with u <= top (floor division)
    if hi < lo:
        return 0
    if lhs_dilate == 1:
        return hi - lo + 1
    # o * stride = -offset (mod lhs_dilate): solvable iff g = gcd(stride, lhs_dilate) divides offset,
    # then o = o0 (mod lhs_dilate / g).
    g = math.gcd(stride, lhs_dilate)
    if offset % g:
        return 0
    m = lhs_dilate // g
    o0 = (-offset // g) * pow(stride // g, -1, m) % m if m > 1 else 0
    first = lo + (o0 - lo) % m
    return 0 if first > hi else (hi - first) // m + 1


class _Coster:
    """Costs the instructions of one module, memoising computations (fusion bodies, loop bodies)."""

    def __init__(self, module: HloModule):
        # Operands and users come from the module's cached def-use graph, resolved in the
        # instruction's own computation (hand-written HLO may reuse a name elsewhere).
        self.module = module
        self._memo: dict[str, Cost] = {}
        self._active: set[str] = set()

    # -- shapes and operands ----------------------------------------------------------------------

    def shape(self, instr: Instruction) -> Shape:
        try:
            return instr.parsed_shape
        except ValueError as e:
            raise ParseError(self.module.path, f"instruction {instr.name}: {e}", line=instr.line or None) from None

    def operand(self, instr: Instruction, k: int) -> Instruction:
        name = instr.operands[k] if k < len(instr.operands) else None
        found = self.module.operand(instr, k)
        if found is None:
            raise ParseError(self.module.path, f"instruction {instr.name}: operand {k} ({name}) is not defined",
                             line=instr.line or None)
        return found

    def operand_shape(self, instr: Instruction, k: int) -> Shape:
        return self.shape(self.operand(instr, k))

    def operand_bytes(self, instr: Instruction, start: int = 0) -> int:
        return sum(self.operand_shape(instr, k).bytes for k in range(start, len(instr.operands)))

    def computation(self, name: str) -> Cost:
        if name in self._memo:
            return self._memo[name]
        comp = self.module.computations.get(name)
        if comp is None:
            raise ParseError(self.module.path, f"computation {name} is called but not defined")
        if name in self._active:  # HLO has no recursion; a cycle means a malformed module
            raise ParseError(self.module.path, f"computation {name} calls itself")
        self._active.add(name)
        total = Cost()
        for instr in comp.instructions:
            total += self.cost(instr)
        self._active.discard(name)
        self._memo[name] = total
        return total

    def _applied(self, name: str | None) -> Cost:
        """The cost of one application of a reducer, selector or scatterer (0 where there is none)."""
        return self.computation(name) if name else Cost()

    # -- the cost of one instruction --------------------------------------------------------------

    def cost(self, instr: Instruction) -> Cost:
        try:
            return self._cost(instr)
        except (IndexError, KeyError, ValueError) as e:  # operands or attributes that do not fit the op
            raise ParseError(self.module.path, f"cannot cost {instr.opcode} {instr.name}: {type(e).__name__} {e}",
                             line=instr.line or None) from None

    def _cost(self, instr: Instruction) -> Cost:
        op = instr.opcode
        if op in ZERO_COST:
            return Cost()
        if op == "fusion":
            return self._fusion(instr)
        if op in ("while", "call", "async-start"):
            # Cost of the called computations, once: the trip count is not known statically.
            total = Cost()
            for name in instr.called:
                total += self.computation(name)
            return total
        if op == "conditional":
            branches = [self.computation(name) for name in instr.called] or [Cost()]
            return Cost(max(c.flops for c in branches), max(c.transcendentals for c in branches),
                        max(c.bytes_accessed for c in branches))
        out = self.shape(instr)
        if op == "custom-call":
            if instr.custom_call_target in NO_WORK_CALLS:
                return Cost()
            estimate = _cost_estimate(instr)
            if estimate is not None:
                return estimate
        flops, transcendentals = self._compute(instr, out)
        return Cost(flops, transcendentals, self._bytes(instr, out))

    def _compute(self, instr: Instruction, out: Shape) -> tuple[int, int]:
        """(flops, transcendentals) of a non-fusion, non-control-flow instruction."""
        op = instr.opcode
        if op in ELEMENTWISE:
            return (0, out.elements) if op in TRANSCENDENTAL else (out.elements, 0)
        if op in ("dot", "ragged-dot"):
            lhs = self.operand_shape(instr, 0)
            width = math.prod(lhs.dims[d] for d in (instr.lhs_contracting_dims or ()))
            return FMA_FLOPS * out.elements * width, 0
        if op == "convolution":
            return self._convolution_flops(instr, out), 0
        if op in ("reduce", "reduce-window", "map", "scatter", "select-and-scatter"):
            return self._applied_flops(instr, out)
        if op == "sort":
            n = self.operand_shape(instr, 0).elements
            return n * max(n - 1, 0).bit_length(), 0  # n * ceil(log2 n)
        if op in ("all-reduce", "all-reduce-start"):
            # XLA assumes two replicas: one add per output element.
            return sum(s.elements for s in out.leaves()), 0
        if op == "rng":
            return 0, out.elements
        if op == "rng-bit-generator":
            return 0, sum(s.elements for s in out.leaves())
        if op == "fft":
            data = self.operand_shape(instr, 0).leaves()[0]
            logs = math.prod(max(n, 1).bit_length() - 1 for n in (instr.fft_length or ()))
            return FMA_FLOPS * 4 * logs * data.elements, 0  # 4 FMAs per complex multiply
        if op == "triangular-solve":
            a, b = self.operand_shape(instr, 0), self.operand_shape(instr, 1)
            return FMA_FLOPS * a.dims[-1] * b.elements, 0
        if op == "cholesky":
            a = self.operand_shape(instr, 0)
            return a.dims[-1] * a.elements // 3, 0
        return 0, 0

    def _applied_flops(self, instr: Instruction, out: Shape) -> tuple[int, int]:
        op = instr.opcode
        if op == "select-and-scatter":
            source = self.operand_shape(instr, 1).elements
            window = math.prod(w.size for w in instr.window)
            sel, sca = self._applied(instr.select), self._applied(instr.scatter)
            return (sel.flops * source * (window - 1) + sca.flops * source,
                    sel.transcendentals * source * (window - 1) + sca.transcendentals * source)
        sub = self._applied(instr.to_apply)
        first_out = out.leaves()[0]
        if op == "reduce":
            count = self.operand_shape(instr, 0).elements - first_out.elements
        elif op == "map":
            count = out.elements
        elif op == "scatter":
            count = self.operand_shape(instr, len(instr.operands) // 2 + 1).elements  # updates[0]
        else:  # reduce-window: window_size - 1 applications per output element
            window = instr.window
            size = math.prod(w.size for w in window)
            count = (size - 1) * first_out.elements
            # XLA's special case: a reduce-window that is a reduce of one dim broadcast back.
            reduced = [d for d, w in enumerate(window) if w.size != 1]
            padded = [w for w in window if w.pad_lo or w.pad_hi]
            if len(reduced) == 1 and len(padded) == 1 and not out.is_tuple:
                d = reduced[0]
                w = window[d]
                if w.pad_lo == w.pad_hi and w.size == 2 * w.pad_lo + 1 and w.pad_lo == out.dims[d] - 1:
                    count = first_out.elements // out.dims[d] + out.dims[d] - 1
        return sub.flops * count, sub.transcendentals * count

    def _convolution_flops(self, instr: Instruction, out: Shape) -> int:
        lhs, rhs = self.operand_shape(instr, 0), self.operand_shape(instr, 1)
        if instr.dim_labels is None:
            raise ParseError(self.module.path, f"convolution {instr.name} has no dim_labels", line=instr.line or None)
        lhs_l, rhs_l, out_l = instr.dim_labels

        def spatial(labels: str) -> list[int]:  # dims of spatial 0, 1, 2, ... in order
            return [labels.index(c) for c in sorted(c for c in labels if c.isdigit())]

        in_features = lhs.dims[lhs_l.index("f")] // instr.feature_group_count
        batch = lhs.dims[lhs_l.index("b")] // instr.batch_group_count
        out_features = out.dims[out_l.index("f")]
        window = instr.window
        positions = 1
        for d, (li, ki, oi) in enumerate(zip(spatial(lhs_l), spatial(rhs_l), spatial(out_l))):
            w = window[d] if d < len(window) else WindowDim(size=rhs.dims[ki])
            positions *= _valid_positions(w, lhs.dims[li], out.dims[oi], rhs.dims[ki])
        return FMA_FLOPS * in_features * out_features * batch * positions

    def _bytes(self, instr: Instruction, out: Shape) -> int:
        op = instr.opcode
        if op == "slice":
            return 2 * out.bytes
        if op == "dynamic-slice":
            return 2 * out.bytes + self.operand_bytes(instr, 1)
        if op == "dynamic-update-slice":
            return 2 * self.operand_shape(instr, 1).bytes + self.operand_bytes(instr, 2)
        if op == "gather":
            return 2 * out.bytes + self.operand_shape(instr, 1).bytes
        if op == "scatter":
            n = len(instr.operands) // 2  # scatter(operands..., indices, updates...)
            updates = sum(self.operand_shape(instr, k).bytes for k in range(n + 1, 2 * n + 1))
            return 3 * updates + self.operand_shape(instr, n).bytes
        if op == "transpose" and self._transpose_is_bitcast(instr, out):
            return 0
        if op == "slice-start" and out.is_tuple and len(out.tuple_shapes) >= 2:
            # TPU async slice: ((operand), slice, context). It reads and writes the slice only.
            return 2 * out.tuple_shapes[1].bytes
        if op == "copy-start":  # read the source, write the destination (output tuple element 0)
            return self.operand_bytes(instr) + out.leaves()[0].bytes
        if op in COLLECTIVE_START_TUPLE and out.is_tuple and len(out.tuple_shapes) >= 2:
            return self.operand_bytes(instr) + out.tuple_shapes[1].bytes  # (operands, results, ...)
        if op == "send":
            return self.operand_shape(instr, 0).bytes
        if op == "recv":
            return out.leaves()[0].bytes
        if op == "triangular-solve":  # half of the triangular matrix is read
            return out.bytes + self.operand_shape(instr, 0).bytes // 2 + self.operand_shape(instr, 1).bytes
        if op == "cholesky":  # half read, half written
            return self.operand_shape(instr, 0).bytes
        return self.operand_bytes(instr) + out.bytes

    def _transpose_is_bitcast(self, instr: Instruction, out: Shape) -> bool:
        src = self.operand_shape(instr, 0)
        perm = instr.dimensions
        if perm is None or out.layout is None or src.layout is None:
            return False
        return tuple(perm[d] for d in out.layout.minor_to_major) == src.layout.minor_to_major

    # -- fusions ----------------------------------------------------------------------------------

    def _fusion(self, instr: Instruction) -> Cost:
        if not instr.called:
            raise ParseError(self.module.path, f"fusion {instr.name} calls no computation", line=instr.line or None)
        inner = self.computation(instr.called[0])
        body = self.module.computations[instr.called[0]]
        if not body.instructions:
            raise ParseError(self.module.path, f"fusion {instr.name} calls an empty computation",
                             line=instr.line or None)
        if instr.fusion_kind == "kCustom":  # XLA costs a custom gather/scatter fusion as that op
            for i in body.instructions:
                if i.opcode in ("gather", "scatter"):
                    return self.cost(i)
        out = self.shape(instr)
        root = body.root
        written = 0
        for k, leaf in enumerate(out.tuple_shapes if out.is_tuple else (out,)):
            producer = root
            if out.is_tuple and root.opcode == "tuple" and k < len(root.operands):
                producer = self.operand(root, k)
            if not leaf.is_tuple and producer.opcode == "dynamic-update-slice":
                written += self.operand_shape(producer, 1).bytes  # updated in place: only the update
            else:
                written += leaf.bytes
        # Non-scalar constants inside are read from memory (XLA: immediate_constant_max_elements = 1).
        constants = sum(s.bytes for i in body.instructions if i.opcode == "constant"
                        for s in [self.shape(i)] if s.elements > 1)
        read = sum(self._param_read_bytes(p) for p in body.parameters)
        return Cost(inner.flops, inner.transcendentals, written + constants + read)

    def _param_read_bytes(self, param: Instruction) -> int:
        """Bytes a fused parameter (or a get-tuple-element of a tuple parameter) is read with:
        XLA's FusionParameterReadBytes. Slicing users read only their slice; other users share one
        read, except broadcast and reshape, which each count the whole operand."""
        shape = self.shape(param)
        if shape.is_tuple:
            return sum(self._param_read_bytes(u) for u in self.module.users_of(param)
                       if u.opcode == "get-tuple-element")
        size, shared = 0, False

        def share() -> int:
            nonlocal shared
            if shared:
                return 0
            shared = True
            return shape.bytes

        for user in self.module.users_of(param):
            op = user.opcode
            if op == "fusion":
                size += self._nested_fusion_read_bytes(param, user)
            elif op == "slice":
                size += self.shape(user).bytes
            elif op == "dynamic-slice":
                size += self.shape(user).bytes if user.operands[0] == param.name else share()
            elif op == "dynamic-update-slice":
                size += share() if user.operands[0] != param.name else 0  # operand 0 aliases the output
            elif op in ("broadcast", "reshape"):
                size += shape.bytes
            else:
                size += share()
        return size

    def _nested_fusion_read_bytes(self, param: Instruction, fusion: Instruction) -> int:
        """A fused parameter read through a nested fusion (TPU output fusions wrap operands in
        `bitcast_fusion`s): XLA's rule, which looks at the nested fusion's own users."""
        body = self.module.computations.get(fusion.called[0]) if fusion.called else None
        if body is None:
            return 0
        params = body.parameters
        root = body.root
        users = self.module.users_of(fusion)
        size = 0
        for idx in (k for k, name in enumerate(fusion.operands) if name == param.name):
            if idx >= len(params):
                continue
            inner = params[idx]
            if not users:  # the nested fusion is the root; XLA counts nothing here, we count the read
                size += self._param_read_bytes(inner)
                continue
            simple = not root.operands or inner.name == root.operands[0]
            shared = False
            for user in users:
                first = bool(user.operands) and user.operands[0] == fusion.name
                if simple and user.opcode == "slice":
                    size += self.shape(user).bytes
                elif simple and user.opcode in ("dynamic-slice", "dynamic-update-slice"):
                    if user.opcode == "dynamic-slice" and first:
                        size += self.shape(user).bytes
                    elif not shared and not (user.opcode == "dynamic-update-slice" and first):
                        shared = True
                        size += self.shape(fusion).bytes
                elif not shared:
                    shared = True
                    size += self._param_read_bytes(inner)
        return size


def _find_key(config, key: str):
    """The first value under `key` in a JSON tree, depth first in key order (text order)."""
    if isinstance(config, dict):
        if key in config:
            return config[key]
        children = config.values()
    elif isinstance(config, list):
        children = config
    else:
        return None
    for child in children:
        found = _find_key(child, key)
        if found is not None:
            return found
    return None


def _cost_estimate(instr: Instruction) -> Cost | None:
    """A custom call's own estimate: Pallas writes `pl.CostEstimate` into the backend config as
    `"cost_estimate":{"flops":"1234","transcendentals":"5","bytes_accessed":"678",...}` (inside
    `custom_call_config` on TPU)."""
    found = _find_key(instr.backend_config, "cost_estimate")
    if not isinstance(found, dict):
        return None

    def count(name: str) -> int:
        value = found.get(name, 0)
        try:
            return int(value)  # written as a number or as a decimal string
        except (TypeError, ValueError):
            return 0

    return Cost(count("flops"), count("transcendentals"), count("bytes_accessed"))


def known_trip_count(instr: Instruction) -> int | None:
    """`Instruction.known_trip_count`: a while loop's trip count where XLA recorded it, else None.
    The costs here count a loop body once whatever this says, as XLA does."""
    return instr.known_trip_count


def op_cost(module: HloModule, instr: Instruction) -> Cost:
    """The cost of one instruction of `module` (a fusion, a while loop and a call include what
    they run). For many instructions, `module_costs` is faster: it indexes the module once."""
    return _Coster(module).cost(instr)


def module_costs(module: HloModule) -> dict[str, Cost]:
    """Cost of every instruction outside fused computations, by instruction name (the same set of
    names as `categorize.index_module`). Loop and call bodies appear both as their own
    instructions and inside the while/call that runs them: do not sum these values; use
    `total_cost` for the module."""
    coster = _Coster(module)
    fused = module.fused_computations()
    return {i.name: coster.cost(i) for c in module.computations.values() if c.name not in fused
            for i in c.instructions}


def total_cost(module: HloModule) -> Cost:
    """The module's cost as `compiled.cost_analysis()` sums it: the entry computation's
    instructions, each while/call/conditional including its body once."""
    entry = module.entry
    if entry is None:
        raise ParseError(module.path, "no ENTRY computation: the module's total cost is undefined")
    coster = _Coster(module)
    return coster.computation(entry.name)


def has_cost_estimate(instr: Instruction) -> bool:
    """Whether a custom call carries its kernel's own cost estimate (`pl.CostEstimate`)."""
    return _cost_estimate(instr) is not None
