"""Finds the op patterns a custom kernel replaces in an optimized HLO module (TPU or CPU).

Reads a `parse.hlo` module through `dataflow.Dataflow` (fusion boundaries erased); returns
`PatternMatch`es: which pattern, the top-level ops that execute it (where its time is), the inner
instructions that anchor it, their Python source lines, and the shapes a kernel needs. No I/O.

Each detector anchors on the one op a pattern cannot do without and checks its neighbourhood,
walking through the ops that only move or re-type values (convert, bitcast, copy, reshape,
transpose), so casts, scales, masks and head repeats between the pieces do not hide it:

- attention: an `exponential` fed by a matmul (the scores, through scale, mask, bias and the
  max-subtraction) whose result reaches a second matmul (probabilities x V). The reduced dimension
  of its row sum is the key length; the dimension before it the query length (1: decode). A K that
  comes from a gather or dynamic-slice is a KV cache. libtpu's own `online-softmax` kernel counts
  as attention XLA already replaced.
- RMSNorm / LayerNorm: an `rsqrt` of a row sum of `x * x` (LayerNorm: of `(x - mean)^2`); an `add`
  producing x is the residual add before it.
- cross-entropy: a `log` of a row sum of exponentials over at least `VOCAB_MIN` classes (a
  log-softmax or logsumexp), with the labels picked by a gather or a one-hot compare.
- rotary embedding: a value multiplied by a cosine and by a sine (computed in place) whose halves
  are recombined by a concatenate, add or subtract.
- sampling: a `sort` or TopK over at least `SAMPLING_MIN` candidates, with a cumulative sum over the
  sorted values for top-p.
- MoE: `ragged-dot` (XLA's own grouped matmul: replaced already), or a matmul fed by a one-hot
  (a compare against an iota) over the experts.
- dequantize-then-matmul: a matmul fed by a `convert` from an 8-bit or 4-bit type, scaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpudiag.analyze.hlo.dataflow import MATMUL, TRANSPARENT, Dataflow
from tpudiag.analyze.hlo.cost import op_cost
from tpudiag.model import Model
from tpudiag.parse.hlo import HloModule, Instruction

VOCAB_MIN = 8192  # classes: below this a plain log-softmax is cheap next to the matmul that made the logits
MOE_MAX_EXPERTS = 256  # a one-hot over more "experts" is a one-hot of labels or tokens, not a router
SAMPLING_MIN = 1024  # candidates sorted per row: fewer is a small sort, not a sampler over a vocabulary
_QUANT = ("s8", "u8", "s4", "u4", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz")
# Walked through between the scores matmul and the exp: scale, mask, bias, max-subtraction.
_SCORES_PATH = TRANSPARENT | {"multiply", "divide", "select", "add", "subtract", "broadcast", "maximum", "minimum"}
# Walked through between the exp and the PV matmul: normalisation and casts.
_PROBS_PATH = TRANSPARENT | {"divide", "multiply", "broadcast", "select"}


@dataclass(frozen=True)
class PatternMatch(Model):
    pattern: str  # attention | attention_decode | rmsnorm | layernorm | cross_entropy | rope | sampling | moe | dequant_matmul
    module: str
    ops: tuple[str, ...]  # top-level instructions that execute it, in program order
    anchors: tuple[str, ...]  # the instructions that identify it
    source: tuple[str, ...]  # Python source lines of the anchors, most frequent first
    shapes: dict = field(default_factory=dict)  # what a kernel at these shapes needs (per pattern)
    notes: tuple[str, ...] = ()  # causal mask, f32 softmax, with residual add, ...
    replaced_by_xla: str | None = None  # XLA's own kernel already does it (no suggestion)


def _dims(instr: Instruction) -> tuple[int, ...]:
    s = instr.parsed_shape
    return s.dims if s.is_array else ()


def _etype(instr: Instruction) -> str:
    s = instr.parsed_shape
    return s.element_type if s.is_array else ""


def _reducer_is(module: HloModule, instr: Instruction, opcode: str) -> bool:
    comp = module.computations.get(instr.to_apply or "")
    root = comp.root if comp else None
    return root is not None and root.opcode == opcode


class _Finder:
    def __init__(self, module: HloModule):
        self.m = module
        self.g = Dataflow(module)
        self.order = {id(i): n for n, i in enumerate(module.instructions())}

    # -- walking ----------------------------------------------------------------------------------
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
        if instr.opcode != "reduce" or not _reducer_is(self.m, instr, "add"):
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
                    seen_types.add(_etype(o))
                    if o.opcode in TRANSPARENT | {"broadcast", "dynamic-slice", "slice", "gather", "multiply"}:
                        nxt.append(o)
            frontier = nxt
        for t in ("bf16", "f16", "f32"):
            if t in seen_types:
                return t
        return _etype(instr)

    def reduce_of(self, instr: Instruction, opcode: str) -> Instruction | None:
        r, _ = self.forward(instr, TRANSPARENT | {"broadcast"},
                            lambda u: u.opcode == "reduce" and _reducer_is(self.m, u, opcode), depth=4)
        return r

    # -- the match record -------------------------------------------------------------------------
    def match(self, pattern: str, anchors: list[Instruction], covered: list[Instruction], shapes: dict,
              notes=(), replaced=None) -> PatternMatch:
        tops = {}
        for i in [*anchors, *covered]:
            t = self.g.top(i)
            if t.opcode not in ("parameter", "constant"):
                tops[id(t)] = t
        ops = sorted(tops.values(), key=lambda t: self.order.get(id(t), 0))
        lines: dict[str, int] = {}
        for i in [*anchors, *covered]:
            src = self.m.source(i)
            if src:
                lines[src] = lines.get(src, 0) + 1
        return PatternMatch(pattern=pattern, module=self.m.name, ops=tuple(t.name for t in ops),
                            anchors=tuple(a.name for a in anchors),
                            source=tuple(sorted(lines, key=lambda s: (-lines[s], s))),
                            shapes=shapes, notes=tuple(notes), replaced_by_xla=replaced)

    # -- detectors --------------------------------------------------------------------------------
    def attention(self) -> list[PatternMatch]:
        out = []
        for x in self.g.instructions:
            if x.opcode == "custom-call" and "online-softmax" in (x.attrs or "") + x.name:
                # The kernel takes the scores (the QK^T fusion's output, which carries the source
                # line) and V: softmax and PV run inside it, the scores are still written out.
                scores = self.m.operand(x, 0)
                covered = [scores] if scores is not None and scores.opcode not in ("parameter", "constant") else []
                shapes, notes = {"dtype": _etype(x)}, ["libtpu rewrote this all-bf16 attention into its own kernel"]
                s = scores.parsed_shape if scores is not None else None
                if s is not None and s.is_array and len(s.dims) >= 3:
                    shapes.update(batch_heads=math.prod(s.dims[:-2]), q_len=s.dims[-2], kv_len=s.dims[-1])
                    notes.append(f"its input is the {s.dims[-2]}x{s.dims[-1]} score matrix ({s.bytes / 2**20:.3g} MiB), "
                                 "materialized by the QK^T fusion: softmax and PV are fused, QK^T is not")
                out.append(self.match("attention", [x], covered, shapes, tuple(notes), replaced="online-softmax"))
                continue
            if x.opcode != "exponential":
                continue
            qk, spath = self.back(x, _SCORES_PATH, self.is_matmul)
            if qk is None:
                continue
            pv, ppath = self.forward(x, _PROBS_PATH, self.is_matmul)
            if pv is None:
                continue
            red = self.reduce_of(x, "add")
            if red is None or red is pv:  # XLA may recompute the exp apart from its row sum: the row max then
                red = self.back(x, _SCORES_PATH, lambda o: o.opcode == "reduce"
                                and _reducer_is(self.m, o, "maximum"), depth=8)[0]
            if red is None or not red.dimensions:
                continue
            scores = _dims(self.g.operand(red, 0) or x)
            if not scores:
                continue
            kd = red.dimensions[-1]
            kv_len = scores[kd]
            q_len = scores[kd - 1] if kd >= 1 and len(scores) >= 3 else 1
            rows = max(1, _elems(scores) // max(1, kv_len))
            head_dim = max(1, _elems(_dims(pv)) // rows)
            notes = [f"softmax in {_etype(x)}"]
            if any(p.opcode == "select" for p in spath):
                notes.append("masked (select before the softmax)")
            k_src = self.back(qk, TRANSPARENT | {"broadcast", "multiply", "concatenate", "pad", "slice"},
                              lambda o: o.opcode in ("gather", "dynamic-slice"), depth=6)[0]
            # One query per sequence; with grouped heads XLA may keep the group as a dimension of size <= 8.
            decode = q_len == 1 or k_src is not None and q_len <= 8
            if k_src is not None:
                notes.append(f"keys read through a {k_src.opcode} (a KV cache)")
            kv_rows = rows // max(1, q_len)  # one K/V row per (batch, kv head): grouped heads share it
            if decode:
                q_len = 1
            shapes = {"batch_heads": rows // max(1, q_len), "q_len": q_len, "kv_len": kv_len, "head_dim": head_dim,
                      "kv_batch_heads": kv_rows,
                      "dtype": self.stored_dtype(qk), "softmax_dtype": _etype(x)}
            out.append(self.match("attention_decode" if decode else "attention", [qk, x, pv],
                                  [*spath, *ppath, red], shapes, notes))
        return _dedupe(out)

    def norms(self) -> list[PatternMatch]:
        out = []
        for r in self.g.instructions:
            if r.opcode != "rsqrt":
                continue
            red, path = self.back(r, TRANSPARENT | {"add", "multiply", "divide", "broadcast"},
                                  lambda o: o.opcode == "reduce" and _reducer_is(self.m, o, "add"), depth=6)
            if red is None or not red.dimensions:
                continue
            sq = self.g.source(self.g.operand(red, 0))
            if sq is None or sq.opcode != "multiply":
                continue
            a, b = (self.g.source(self.g.operand(sq, k)) for k in (0, 1))
            if a is None or a is not b:
                continue
            layer = a.opcode == "subtract"
            x = self.g.source(self.g.operand(a, 0)) if layer else a
            dims = _dims(red) and _dims(self.g.operand(red, 0))
            hidden = 1
            for d in red.dimensions:
                hidden *= dims[d] if d < len(dims) else 1
            rows = max(1, _elems(dims) // max(1, hidden))
            notes = []
            residual = x is not None and x.opcode == "add" and all(
                _dims(o) == _dims(x) for o in self.g.operands(x))
            if residual:
                notes.append("with the residual add before it")
            covered = [red, sq, *path, *self.forward(r, TRANSPARENT | {"broadcast"},
                                                     lambda u: u.opcode == "multiply", depth=3)[1]]
            if residual:
                covered.append(x)
            shapes = {"rows": rows, "hidden": hidden, "dtype": _etype(x) if x is not None else _etype(sq)}
            out.append(self.match("layernorm" if layer else "rmsnorm", [r], covered, shapes, notes))
        return _dedupe(out)

    def cross_entropy(self) -> list[PatternMatch]:
        out = []
        for lg in self.g.instructions:
            if lg.opcode != "log":
                continue
            red, _ = self.back(lg, TRANSPARENT | {"add", "broadcast"},
                               lambda o: o.opcode == "reduce" and _reducer_is(self.m, o, "add"), depth=4)
            if red is None or not red.dimensions:
                continue
            ex = self.g.source(self.g.operand(red, 0))
            if ex is None or ex.opcode != "exponential":
                continue
            dims = _dims(ex)
            vocab = dims[red.dimensions[-1]] if dims else 0
            if vocab < VOCAB_MIN:
                continue
            logits = self.back(ex, _SCORES_PATH, lambda o: o.opcode in MATMUL, depth=8)[0]
            pick = None
            for cand in self.g.instructions:
                if cand.opcode == "gather" and vocab in _dims(self.g.operand(cand, 0) or cand):
                    pick = cand
                    break
                if cand.opcode == "compare" and vocab in _dims(cand):
                    pick = cand
                    break
            notes = [f"vocabulary {vocab}"]
            if logits is not None:
                notes.append("logits from a matmul in the same module (an LM head)")
            notes.append("labels picked by " + (pick.opcode if pick is not None else "no gather or one-hot found"))
            rows = max(1, _elems(dims) // vocab)
            shapes = {"rows": rows, "vocab": vocab, "dtype": _etype(ex)}
            out.append(self.match("cross_entropy", [lg, red, ex], [p for p in (pick,) if p is not None], shapes, notes))
        return _dedupe(out)

    def rope(self) -> list[PatternMatch]:
        trig = {}
        for m in self.g.instructions:
            if m.opcode != "multiply":
                continue
            ops = self.g.operands(m)
            kinds = [self.back(o, TRANSPARENT | {"broadcast", "slice"}, lambda t: t.opcode in ("cosine", "sine"),
                               depth=4)[0] if o.opcode not in ("cosine", "sine") else o for o in ops]
            for o, t in zip(ops, kinds):
                if t is None:
                    continue
                other = next((p for p in ops if p is not o), None)
                x = self.g.source(other, TRANSPARENT | {"slice", "broadcast"}) if other is not None else None
                if x is not None:
                    trig.setdefault(id(x), (x, {}))[1].setdefault(t.opcode, []).append(m)
        out = []
        for x, kinds in trig.values():
            if "cosine" not in kinds or "sine" not in kinds:
                continue
            muls = kinds["cosine"] + kinds["sine"]
            combine = self.forward(muls[0], TRANSPARENT, lambda u: u.opcode in ("concatenate", "add", "subtract"),
                                   depth=3)[0]
            if combine is None:
                continue
            dims = _dims(x)
            shapes = {"shape": list(dims), "dtype": _etype(x)}
            out.append(self.match("rope", muls[:1], [*muls, combine], shapes, ["cos and sin computed in place"]))
        return _dedupe(out)

    def sampling(self) -> list[PatternMatch]:
        out = []
        for s in self.g.instructions:
            topk = s.opcode == "custom-call" and (s.custom_call_target or "").lower() in ("topk", "tpu_topk")
            if s.opcode != "sort" and not topk:
                continue
            dims = _dims(self.g.operand(s, 0) or s)
            if not dims or dims[-1] < SAMPLING_MIN or not _etype(self.g.operand(s, 0) or s).startswith(("f", "bf")):
                continue
            cum = self.forward(s, TRANSPARENT | {"exponential", "divide", "subtract", "broadcast", "slice"},
                               lambda u: u.opcode == "reduce-window", depth=6)[0]
            notes = ["TopK" if topk else "full sort of the candidates"]
            if cum is not None:
                notes.append("cumulative sum over the sorted probabilities (top-p)")
            shapes = {"rows": max(1, _elems(dims) // dims[-1]), "vocab": dims[-1],
                      "dtype": _etype(self.g.operand(s, 0) or s)}
            out.append(self.match("sampling", [s], [c for c in (cum,) if c is not None], shapes, notes))
        return _dedupe(out)

    def moe(self) -> list[PatternMatch]:
        out = []
        for d in self.g.instructions:
            if d.opcode == "ragged-dot" or (d.opcode == "custom-call" and "ragged" in (d.custom_call_target or "")
                                             + d.name):
                out.append(self.match("moe", [d], [], {"dtype": _etype(d)}, ["ragged_dot"],
                                      replaced="ragged-dot" if d.opcode == "custom-call" else None))
        for c in self.g.instructions:
            if c.opcode != "compare" or c.attributes.get("direction") != "EQ":
                continue
            iota = self.back(c, TRANSPARENT | {"broadcast"}, lambda t: t.opcode == "iota", depth=3)[0]
            if iota is None:
                continue
            dims = _dims(c)
            experts = dims[iota.attributes and int(iota.attributes.get("iota_dimension", "0"))] \
                if dims and _dims(iota) == dims else max(dims, default=1)
            # Experts are few and get a dimension of their own in the dispatched activations: a one-hot of
            # labels (a loss over classes) has neither.
            dispatch = [d for d in self.reachable(c, self.is_matmul, depth=16)
                        if len(_dims(d)) >= 3 and experts in _dims(d)]
            if experts > MOE_MAX_EXPERTS or not dispatch:
                continue
            mms = dispatch
            tokens = max((x for x in dims if x != experts), default=1)
            shapes = {"tokens": tokens, "experts": experts, "matmuls": len(mms), "dtype": _etype(mms[0]),
                      # For a bound: the dense dispatch's FLOPs, and its expert weights (each matmul's
                      # largest operand) that any kernel must read once.
                      "dense_flops": sum(op_cost(self.m, d).flops for d in mms),
                      "weight_bytes": sum(max((o.parsed_shape.bytes for o in self.g.operands(d)
                                               if o.parsed_shape.is_array), default=0) for d in mms)}
            out.append(self.match("moe", [c, *dispatch], [], shapes,
                                  [f"dispatch by a dense one-hot over {experts} experts: every token goes through "
                                   "every expert's matmul, masked",
                                   "the bound routes each token to one expert and reads each expert's weights once; "
                                   "top-k routing computes k times its FLOPs"]))
        return _dedupe(out)

    def dequant(self) -> list[PatternMatch]:
        out = []
        for d in self.g.instructions:
            if d.opcode not in MATMUL:
                continue
            for o in self.g.operands(d):
                cv, path = self.back(o, TRANSPARENT | {"multiply", "broadcast"}, lambda t: t.opcode == "convert"
                                     and _etype(self.g.operand(t, 0) or t) in _QUANT, depth=5) \
                    if not (o.opcode == "convert" and _etype(self.g.operand(o, 0) or o) in _QUANT) else (o, [])
                if cv is None:
                    continue
                w = self.g.operand(cv, 0)
                shapes = {"weight": list(_dims(w)), "weight_dtype": _etype(w), "out": list(_dims(d)),
                          "dtype": _etype(d)}
                scaled = any(p.opcode == "multiply" for p in path)
                out.append(self.match("dequant_matmul", [d, cv], path, shapes,
                                      [f"{_etype(w)} weights converted to {_etype(cv)}"
                                       + (" and scaled" if scaled else "") + " before the matmul"]))
                break
        return _dedupe(out)


def _elems(dims) -> int:
    n = 1
    for d in dims:
        n *= max(d, 0)
    return n


def _dedupe(matches: list[PatternMatch]) -> list[PatternMatch]:
    """One match per (pattern, ops): the forward and a recomputation in the backward of one attention
    share their ops only when XLA fused them together."""
    seen, out = set(), []
    for m in matches:
        key = (m.pattern, m.ops, m.anchors[:1])
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def find_patterns(module: HloModule) -> list[PatternMatch]:
    """Every pattern match in `module`, attention first, in program order within a pattern."""
    f = _Finder(module)
    return [*f.attention(), *f.norms(), *f.cross_entropy(), *f.rope(), *f.sampling(), *f.moe(), *f.dequant()]
