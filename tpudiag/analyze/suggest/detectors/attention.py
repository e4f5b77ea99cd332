"""Attention, prefill and decode: one finder, two detectors.

Reads a `walk.Flow`; returns `PatternMatch`es with `AttentionShapes`. The finder anchors on an
`exponential` fed by a matmul (the scores, through scale, mask, bias and the max-subtraction) whose
result reaches a second matmul (probabilities x V). The reduced dimension of its row sum is the key
length; the dimension before it the query length (1: decode). A K that comes from a gather or
dynamic-slice is a KV cache. libtpu's own `online-softmax` kernel counts as attention XLA already
replaced. It prices nothing and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import ELEMENTWISE, TPU_ASYNC_SLICE, TRANSPARENT, is_gradient
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch, Shapes, roofline_s, stored_bytes
from tpudiag.analyze.suggest.detectors.masks import read_mask
from tpudiag.analyze.suggest.detectors.walk import Flow, dedupe, dims, elems, etype, reducer_is

# Walked through between the scores matmul and the exp: scale, mask, bias, max-subtraction.
SCORES_PATH = TRANSPARENT | {"multiply", "divide", "select", "add", "subtract", "broadcast", "maximum", "minimum"}
# Walked through between the exp and the PV matmul: normalisation and casts.
_PROBS_PATH = TRANSPARENT | {"divide", "multiply", "broadcast", "select"}


@dataclass(frozen=True)
class AttentionShapes(Shapes):
    batch_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    kv_batch_heads: int  # one K/V row per (batch, kv head): grouped query heads share it
    dtype: str  # Q, K, V as stored
    softmax_dtype: str
    mask: str = "none"  # masks.Mask.kind: none, causal, window, inputs, other, unknown
    mask_offset: int = 0  # causal and window: query i sees keys j <= i + offset
    mask_window: int = 0  # window: and keys j > i + offset - window
    # A KV cache read through a gather of pages (a page table): the tokens a page holds; 0 for a
    # contiguous cache.
    page_size: int = 0
    # Decode over a KV cache: its sequences (the page table's rows, or a contiguous cache's batch
    # dimension); 0 where unknown.
    batch: int = 0
    # The step writes its new keys into the cache it reads (a scatter or dynamic-update-slice
    # upstream of the read): a serving loop's write-then-attend.
    kv_written: bool = False


@dataclass(frozen=True)
class LatentShapes(Shapes):
    """Multi-head latent attention (DeepSeek's MLA) whose keys and values are up-projected from the
    cached latent every step."""

    batch: int
    heads: int
    kv_len: int
    latent: int  # kv_lora_rank: the cached latent's width
    rope: int  # the decoupled RoPE key's width (0 where none is concatenated)
    qk_head_dim: int  # per head: the up-projected key's width plus rope
    v_head_dim: int
    dtype: str


# Walked back from an attention matmul's key or value operand to the matmul that made it: the
# RoPE key joined to each head's key by a concatenate, or as the TPU compiler may rewrite one (two
# pads and a maximum or add).
_UP_PATH = TRANSPARENT | {"broadcast", "concatenate", "slice", "pad", "maximum", "add", "select"}


def _up_projection(flow: Flow, mm, kv_len: int):
    """The matmul that made `mm`'s key (or value) operand from a [.., kv_len, latent] tensor, that
    tensor and the operand; (None, None, None) where the operand is not an up-projection."""
    operands = flow.g.operands(mm)
    if mm.opcode == "reduce":  # a matrix-vector product as XLA writes it: the multiply's operands
        mul = operands[0] if operands and operands[0].opcode == "multiply" else \
            flow.back(operands[0], TRANSPARENT, lambda o: o.opcode == "multiply", depth=4)[0] if operands else None
        operands = flow.g.operands(mul) if mul is not None else []
    for operand in operands:
        if kv_len not in dims(operand):
            continue
        dot = operand if flow.is_matmul(operand) else flow.back(operand, _UP_PATH, flow.is_matmul, depth=6)[0]
        if dot is None or dot.opcode not in ("dot", "convolution"):
            continue
        for src in flow.g.operands(dot):
            d = dims(src)
            if len(d) >= 2 and kv_len in d[:-1]:
                return dot, flow.g.source(src, TRANSPARENT) or src, operand
    return None, None, None


def _latent(flow: Flow, qk, pv, kv_len: int, batch_heads: int):
    """(LatentShapes, the up-projections and the concatenate) where the keys and the values of one
    attention are matmuls of the same cached latent: MLA without its projections absorbed. None
    otherwise."""
    kd, k_lat, k_operand = _up_projection(flow, qk, kv_len)
    vd, v_lat, _ = _up_projection(flow, pv, kv_len)
    if kd is None or vd is None or kd is vd or k_lat is not v_lat:
        return None
    ld = dims(k_lat)
    latent = ld[-1]
    batch = max(1, elems(ld) // max(1, kv_len * latent))
    heads = batch_heads // batch if batch_heads % batch == 0 else 0
    if not heads:
        return None
    per_head = max(1, batch * kv_len * heads)
    # the key each head attends with, less the up-projected part: the RoPE key joined to it
    qk_width = elems(dims(k_operand)) // per_head
    rope = max(0, qk_width - elems(dims(kd)) // per_head)
    joins = flow.back(k_operand, _UP_PATH, lambda o: o is kd, depth=6)[1]
    shapes = LatentShapes(batch=batch, heads=heads, kv_len=kv_len, latent=latent, rope=rope, qk_head_dim=qk_width,
                          v_head_dim=elems(dims(vd)) // per_head, dtype=etype(k_lat))
    return shapes, [kd, vd, k_operand, *joins]


def _online_softmax(flow: Flow, x) -> PatternMatch:
    # The kernel takes the scores (the QK^T fusion's output, which carries the source line) and V:
    # softmax and PV run inside it, the scores are still written out.
    scores = flow.m.operand(x, 0)
    covered = [scores] if scores is not None and scores.opcode not in ("parameter", "constant") else []
    notes = ["libtpu rewrote this all-bf16 attention into its own kernel"]
    s = scores.parsed_shape if scores is not None else None
    if s is not None and s.is_array and len(s.dims) >= 3:
        notes.append(f"its input is the {s.dims[-2]}x{s.dims[-1]} score matrix ({s.bytes / 2**20:.3g} MiB), "
                     "materialized by the QK^T fusion: softmax and PV are fused, QK^T is not")
    return flow.match(PREFILL, [x], covered, None, tuple(notes), replaced="online-softmax")


def _paged(flow: Flow, gather, kv_len: int, head_dim: int) -> tuple[int, int, int] | None:
    """(K/V rows, page size, sequences) of keys gathered page by page: the gather's indices are the
    page table [sequences, pages a sequence(, 1)], its output every sequence's pages. None where the
    figures do not divide as a page table's would."""
    idx = flow.g.operand(gather, 1)
    idims = [d for d in dims(idx)] if idx is not None else []
    if len(idims) < 2:
        return None
    batch, entries = idims[0], elems(idims)
    pages = entries // batch if batch else 0
    out = elems(dims(gather))
    if not pages or kv_len % pages or out % (kv_len * head_dim * batch):
        return None
    return out // (kv_len * head_dim), kv_len // pages, batch


_CACHE_WRITES = ("scatter", "dynamic-update-slice")
# From an attention matmul back to a cache write it reads whole: the repeat of grouped heads and casts.
_WRITE_PATH = TRANSPARENT | {"broadcast", "multiply"}


def _cache_writes(flow: Flow, k_src, v_src) -> list:
    """The writes of new keys and values into the cache that `k_src` and `v_src` (the gathers or
    dynamic-slices of the keys and the values) read: a scatter or dynamic-update-slice producing the
    array read, through reshapes and copies. Empty where the cache comes in as it is."""
    out = []
    for read in (k_src, v_src):
        cache = flow.g.operand(read, 0) if read is not None else None
        if cache is None:
            continue
        w = cache if cache.opcode in _CACHE_WRITES else \
            flow.back(cache, TRANSPARENT, lambda o: o.opcode in _CACHE_WRITES, depth=4)[0]
        if w is not None and w not in out:
            out.append(w)
    return out


def _matmul_operands(flow: Flow, mm) -> list:
    """A matmul's two inputs; for XLA's multiply-and-sum form of one query a row (a reduce of a
    multiply), the multiply's."""
    if mm.opcode == "reduce":
        prod = flow.g.operand(mm, 0)
        if prod is not None and prod.opcode == "multiply":
            return flow.g.operands(prod)
    return flow.g.operands(mm)


def _cache_batch(cache: list[int], kv_len: int, head_dim: int, kv_rows: int) -> int:
    """The sequences of a contiguous KV cache read or written whole, from its dims: what is left
    after its positions and head_dim is batch x KV heads, the KV heads last and the batch before
    them ([B, S, KVH, D] as transformers writes it, [B, KVH, S, D] as others do, [1, B, S, KVH, D]
    for one layer of a stacked cache); one sequence where only the KV heads are left. 0 where the
    dims do not add up to the K/V rows."""
    rest = list(cache)
    for size in (head_dim, kv_len):
        if size not in rest:
            return 0
        del rest[len(rest) - 1 - rest[::-1].index(size)]
    n = 1
    for r in rest:
        n *= r
    if n != kv_rows:
        return 0
    return rest[-2] if len(rest) >= 2 else 1


def _kv_rows(flow: Flow, qk, pv, rows: int, kv_len: int, head_dim: int) -> int:
    """K/V rows (batch x kv heads) before any repeat. Grouped-query heads written as `jnp.repeat`,
    `broadcast` or `tile` of K and V read fewer elements than the matmul's operand holds; written as
    a group dimension of Q (MaxText's `btkgd,bskd->bkgts`), K and V are smaller operands. The
    fewest elements any operand reads, in whole [kv_len, head_dim] rows, is K's or V's."""
    row = max(1, kv_len * head_dim)
    counts = []
    for mm in (qk, pv):
        for operand in _matmul_operands(flow, mm):
            n = elems(dims(operand))
            if operand.opcode in TRANSPARENT | {"broadcast"}:
                walked = [operand, *flow.back(operand, TRANSPARENT | {"broadcast"}, lambda _o: False, depth=8)[1]]
                for o in walked:
                    src = flow.g.operand(o, 0) if o.opcode == "broadcast" else None
                    # a repeat of the heads: the whole tensor (rank >= 2), a whole number of times
                    if src is not None and len(dims(src)) >= 2 and n % max(1, elems(dims(src))) == 0:
                        n = min(n, elems(dims(src)))
            if n and n % row == 0:
                counts.append(n // row)
    kv = min(counts, default=rows)
    return kv if 0 < kv < rows and rows % kv == 0 else rows


# Walked from the probabilities to the gradient's matmuls: dS = P * (dP - rowsum(dP * P)) and its casts.
# The TPU compiler moves the saved probabilities through host memory and splits them in async slices.
_GRAD_PATH = TRANSPARENT | ELEMENTWISE | TPU_ASYNC_SLICE | {"broadcast", "reduce", "slice", "concatenate"}


def _gradient(flow: Flow, qk, pv) -> list:
    """The gradient's ops of the attention whose scores `qk` computes: everything elementwise
    downstream of the scores up to the next matmuls (the softmax, its row sums, saved or recomputed,
    and dS = P * (dP - rowsum(dP * P))), the matmuls reached (dV = P^T dO, dQ = dS K, dK = dS^T Q)
    and dP = dO V^T that feeds dS. Only ops JAX names as the gradient (`transpose(jvp(...))`)
    count, so a forward-only program gains none."""
    region, matmuls = [], []
    frontier, seen = [qk], {id(qk)}
    for _ in range(16):
        nxt = []
        for i in frontier:
            for u in flow.g.users(i):
                if id(u) in seen or u is pv:
                    continue
                seen.add(id(u))
                if flow.is_matmul(u):
                    if is_gradient(u):
                        matmuls.append(u)
                elif u.opcode in _GRAD_PATH:
                    region.append(u)
                    nxt.append(u)
        frontier = nxt
    grad_region = [r for r in region if is_gradient(r)]
    for r in grad_region:  # dP enters dS as an operand
        for o in flow.g.operands(r):
            src = flow.g.source(o)
            if src is not None and flow.is_matmul(src) and is_gradient(src) and src not in matmuls:
                matmuls.append(src)
    return [*matmuls, *grad_region] if matmuls else []


def _find(flow: Flow) -> list[PatternMatch]:
    out = []
    for x in flow.g.instructions:
        if x.opcode == "custom-call" and "online-softmax" in (x.attrs or "") + x.name:
            out.append(_online_softmax(flow, x))
            continue
        if x.opcode != "exponential":
            continue
        qk, spath = flow.back(x, SCORES_PATH, flow.is_matmul)
        if qk is None:
            continue
        pv, ppath = flow.forward(x, _PROBS_PATH, flow.is_matmul)
        if pv is None:
            continue
        red = flow.reduce_of(x, "add")
        if red is None or red is pv:  # XLA may recompute the exp apart from its row sum: the row max then
            red = flow.back(x, SCORES_PATH, lambda o: o.opcode == "reduce"
                            and reducer_is(flow.m, o, "maximum"), depth=8)[0]
        if red is None or not red.dimensions:
            continue
        scores = dims(flow.g.operand(red, 0) or x)
        if not scores:
            continue
        kd = red.dimensions[-1]
        kv_len = scores[kd]
        q_len = scores[kd - 1] if kd >= 1 and len(scores) >= 3 else 1
        if qk.opcode == "reduce":  # XLA's multiply-and-sum for one query a row: the dim before the keys is heads
            q_len = 1
        rows = max(1, elems(scores) // max(1, kv_len))
        head_dim = max(1, elems(dims(pv)) // rows)
        notes = [f"softmax in {etype(x)}"]
        mask = read_mask(flow, qk, x, spath, kd - 1 if len(scores) >= 3 else -1, kd, frame=tuple(scores))
        if mask.kind != "none":
            notes.append(mask.describe())
        k_src = flow.back(qk, TRANSPARENT | {"broadcast", "multiply", "concatenate", "pad", "slice"},
                          lambda o: o.opcode in ("gather", "dynamic-slice"), depth=6)[0]
        # One query per sequence; with grouped heads XLA may keep the group as a dimension of size <= 8.
        decode = q_len == 1 or k_src is not None and q_len <= 8
        if k_src is not None:
            notes.append(f"keys read through a {k_src.opcode} (a KV cache)")
        kv_rows = _kv_rows(flow, qk, pv, rows // max(1, q_len), kv_len, head_dim)
        paged = _paged(flow, k_src, kv_len, head_dim) if k_src is not None and k_src.opcode == "gather" else None
        v_src = flow.back(pv, TRANSPARENT | {"broadcast", "concatenate", "pad", "slice"},
                          lambda o: o.opcode in ("gather", "dynamic-slice"), depth=6)[0] if k_src is not None else None
        gathers = []
        if paged is not None:
            kv_rows, page_size, batch = paged
            notes.append(f"pages of {page_size} tokens, {kv_len // page_size} a sequence, through a page table")
            # the gathers that copy every sequence's pages out of the pool are the pattern's: the
            # kernel reads the pages where they are
            gathers = [g for g in (k_src, v_src) if g is not None and g.opcode == "gather"]
        if k_src is not None:
            writes = _cache_writes(flow, k_src, v_src)
        elif decode:  # a cache read whole: the step's write may feed the matmuls directly
            writes = []
            for mm in (qk, pv):
                w = flow.back(mm, _WRITE_PATH, lambda o: o.opcode in _CACHE_WRITES, depth=6)[0]
                if w is not None and all(w is not x for x in writes):
                    writes.append(w)
        else:
            writes = []
        if writes:
            notes.append("the new keys and values written into the cache it reads, in the same step")
        batch = paged[2] if paged else 0
        if decode and not paged:  # a contiguous cache: its sequences from the array read or written
            cache = k_src if k_src is not None and k_src.opcode == "dynamic-slice" else writes[0] if writes else None
            batch = _cache_batch(dims(cache), kv_len, head_dim, kv_rows) if cache is not None else 0
        if decode:
            q_len = 1
        shapes = AttentionShapes(batch_heads=rows // max(1, q_len), q_len=q_len, kv_len=kv_len, head_dim=head_dim,
                                 kv_batch_heads=kv_rows, dtype=flow.stored_dtype(qk), softmax_dtype=etype(x),
                                 mask=mask.kind, mask_offset=mask.offset, mask_window=mask.window,
                                 page_size=paged[1] if paged else 0, batch=batch, kv_written=bool(writes))
        grad = _gradient(flow, qk, pv)
        latent = _latent(flow, qk, pv, kv_len, rows // max(1, q_len)) if decode and not grad else None
        if latent is not None:
            lshapes, ups = latent
            notes.append(f"keys and values up-projected from a cached latent of {lshapes.latent} every step "
                         f"({lshapes.heads} heads; RoPE key {lshapes.rope} wide): latent attention, not absorbed")
            out.append(flow.match(LATENT, [qk, x, pv], [*spath, *ppath, red, *ups], lshapes, notes,
                                  instance=flow.weights(qk)))
            continue
        # one instance per layer: its forward and a recomputation in the backward read the same projections
        out.append(flow.match(DECODE if decode else PREFILL, [qk, x, pv],
                              [*spath, *ppath, red, *grad, *gathers, *(writes if batch else [])], shapes,
                              notes, instance=flow.weights(qk)))
    return dedupe(out)


class _Attention(Detector):
    matmul_work = True

    def find(self, flow: Flow) -> list[PatternMatch]:
        return [m for m in flow.once("attention", _find) if m.detector is self]

    def bound(self, shapes: AttentionShapes, chip, backward: bool = False) -> float | None:
        bh, sq, sk, d, kvh = shapes.batch_heads, shapes.q_len, shapes.kv_len, shapes.head_dim, shapes.kv_batch_heads
        flops = 4.0 * bh * sq * sk * d
        nbytes = 2 * (2 * bh * sq * d) + stored_bytes(shapes.dtype) * 2 * kvh * sk * d  # Q, O bf16; K, V as stored
        return roofline_s(nbytes, flops, chip, backward)


class Prefill(_Attention):
    name = "attention"
    kernel = "flash_attention"


class Decode(_Attention):
    name = "attention_decode"
    # where the keys come through a page table; ragged_paged_attention where the step also writes
    # the new keys into it (at_shapes says why neither fits otherwise)
    kernel = "paged_attention"


class Latent(_Attention):
    name = "latent_attention"
    kernel = "mla_decode"

    def bound(self, shapes: LatentShapes, chip, backward: bool = False) -> float | None:
        """Absorbed: the cached latent and RoPE key read once, scores over latent + rope and the
        weighted sum over the latent, per head (the up-projections move to the query and output)."""
        b, h, t, lat, r = shapes.batch, shapes.heads, shapes.kv_len, shapes.latent, shapes.rope
        nbytes = stored_bytes(shapes.dtype) * b * t * (lat + r) + 2 * 2 * b * h * (lat + r)
        flops = 2.0 * b * h * t * (2 * lat + r)
        return roofline_s(nbytes, flops, chip, backward)


PREFILL, DECODE, LATENT = Prefill(), Decode(), Latent()
