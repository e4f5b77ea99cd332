"""Flash attention backward: the dK/dV and dQ Pallas TPU kernels, and the tiling helpers the forward
(`flash_attention.py`) shares with them.

Reads q, k, v, dO and the forward's per-row log-sum-exp (`lse`, in the units of the unscaled scores
s = q . k: a row's probabilities are exp(sm_scale * (s - lse))) and `delta = rowsum(dO * O)`;
returns dQ, dK, dV in the input dtypes. Scores are recomputed block by block from the saved `lse`,
so no [S, S] matrix ever reaches HBM. It does not run the forward, and it does not check shapes
(the public wrapper in `flash_attention.py` does both); `interpret` passes through to pallas_call.

Two passes instead of one, as FlashAttention-2 does on GPUs: dK/dV need a sum over query blocks
and dQ a sum over key blocks; a single pass would have to add dQ partials in HBM from every
key block, which a TPU core can only do with a read-modify-write DMA per step.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.tiling import block_bytes, mxu_precision, vmem_limit

# A large finite negative. The forward floors its running max at it, so s - m is never -inf - -inf
# (NaN) in a row with no visible key so far; the backward writes it into masked scores, where
# exp2((MASK_VALUE - lse) * sm_scale * log2 e) is exactly 0.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
# Scores are kept as the dot gives them (s = q . k, unscaled) and probabilities computed as
# exp2((s - m) * sm_scale * log2 e), forward and backward alike. exp2 is the chip's exponential
# (exp(x) compiles to exp2(x * log2 e), a second multiply per score), so the scale and the change
# of base are one multiply. The multiply follows the subtraction: a dominant key's s - m is exactly 0
# and its probability exactly 1. Scaled first (s * c - m), a compiler may fuse the two into one
# FMA whose unrounded product differs from the rounded max by up to half an ulp of s (XLA:CPU
# does: probabilities 1 - 8e-5 at s = 2,500, the backward's dV 16x the reference's error).
LOG2E = math.log2(math.e)
LANES = 128  # a vreg is 8 sublanes x 128 lanes: row statistics are kept lane-broadcast to 128

NT = (((1,), (1,)), ((), ()))  # a @ b.T: the MXU takes the transposed operand without an XLU transpose
NN = (((1,), (0,)), ((), ()))


def lanes(x, n: int):
    """Broadcast a lane-replicated [rows, 128] statistic to [rows, n] without a cross-lane op."""
    if n == LANES:
        return x
    if n < LANES:
        return x[:, :n]  # every lane holds the same value, so a slice is the broadcast
    if n % LANES == 0:
        return jnp.tile(x, (1, n // LANES))  # whole-vreg copies, no lane shuffles
    return jnp.broadcast_to(x[:, :1], (x.shape[0], n))


def visible(q_pos, k_pos, length, causal: bool, window: int = 0):
    """Which (query, key) pairs attend: the key exists (k_pos < length) and, when causal, is not in
    the future (k_pos <= q_pos); with a `window`, it is also one of the query's last `window`
    positions (k_pos > q_pos - window). Positions are absolute and broadcastable."""
    ok = k_pos < length
    if causal:
        ok = jnp.logical_and(ok, k_pos <= q_pos)
    if window:
        ok = jnp.logical_and(ok, k_pos > q_pos - window)
    return ok


@dataclasses.dataclass(frozen=True)
class SubTile:
    """Columns [c0, c0+nc) of one row chunk of a score tile, and whether any pair in it is masked."""

    c0: int
    nc: int
    masked: bool


@dataclasses.dataclass(frozen=True)
class RowChunk:
    """Rows [r0, r0+nr) of a score tile and the sub-tiles of it that have any visible pair.

    A tile is computed one [nr, nc] sub-tile at a time with the running statistics and partial
    sums carried in vregs across a row chunk: a whole [block_q, block_k] f32 score tile is far past
    the 64 vregs, and spilling it costs a store and a load per score (the store slot, one per
    bundle, is what binds on v6e). Causal tiles on the diagonal skip their dead sub-tiles, and only
    sub-tiles that cross the diagonal (or the key length) pay for the mask."""

    r0: int
    nr: int
    subs: tuple[SubTile, ...]


Plan = tuple  # of RowChunk


def tile_plan(d: int | None, rows: int, cols: int, row_chunk: int, col_chunk: int, keys_on_rows: bool,
              masked: bool = False) -> Plan:
    """The row chunks of a [rows, cols] tile whose query block starts d positions after its key block
    (d = q_start - k_start); d=None: no causal structure (every sub-tile, masked iff `masked`).
    keys_on_rows: the dK/dV layout, rows are keys and columns queries."""
    out = []
    for r0 in range(0, rows, row_chunk):
        r1 = r0 + row_chunk - 1
        subs = []
        for c0 in range(0, cols, col_chunk):
            c1 = c0 + col_chunk - 1
            if d is None:
                subs.append(SubTile(c0, col_chunk, masked))
            elif not keys_on_rows:  # query r sees key c iff c <= r + d
                if c0 <= r1 + d:
                    subs.append(SubTile(c0, col_chunk, c1 > r0 + d))
            elif c1 >= r0 - d:  # keys on rows: key r is seen by query c iff c >= r - d
                subs.append(SubTile(c0, col_chunk, c0 < r1 - d))
        if subs:
            out.append(RowChunk(r0, row_chunk, tuple(subs)))
    return tuple(out)


def dispatch_tile(run, *, q_start, k_start, length, block_q: int, block_k: int, num_q: int, num_k: int,
                  compute_q: int, compute_k: int, causal: bool, may_cut: bool, keys_on_rows: bool = False,
                  key_block=None, window: int = 0):
    """Emit `run(plan, first)` once per distinct static tile shape and pick one with grid predicates.

    Tiles past the key length (`may_cut`: key padding or kv_lengths) take a fully masked plan; with
    `causal`, each distinct diagonal offset d = q_start - k_start gets its own trimmed plan, tiles
    below the diagonal the unmasked plan, tiles above it nothing. The predicates read only grid
    indices (and kv_lengths when given), so the compiler's static cycle estimate can evaluate them.

    `key_block` (the forward's key-block grid index): without may_cut every query row sees key 0, so
    the step at key block 0 covers all rows and runs with first=True, writing its running statistics
    instead of rescaling zero-initialised ones.

    With a sliding `window` (causal), a tile whose keys all lie before the window of its first query
    is skipped, and every other live tile takes the fully masked plan: the band's two edges cross
    tiles at offsets that the tile plans do not enumerate."""
    rows, cols = (block_k, block_q) if keys_on_rows else (block_q, block_k)
    row_chunk, col_chunk = (compute_k, compute_q) if keys_on_rows else (compute_q, compute_k)
    plan = functools.partial(tile_plan, rows=rows, cols=cols, row_chunk=row_chunk, col_chunk=col_chunk,
                             keys_on_rows=keys_on_rows)
    full = plan(None)
    d = q_start - k_start
    diag = sorted({i * block_q - j * block_k for i in range(num_q) for j in range(num_k)}
                  & set(range(-block_q + 1, block_k - 1)))
    if window:
        live = jnp.logical_and(jnp.logical_and(d > -block_q, k_start < length),
                               k_start + block_k > q_start - window + 1)
        pl.when(live)(lambda: run(plan(None, masked=True), False))
        return
    if may_cut:
        live = jnp.logical_and(d > -block_q, k_start < length) if causal else k_start < length
        cut = k_start + block_k > length
        pl.when(jnp.logical_and(live, cut))(lambda: run(plan(None, masked=True), False))
        live = jnp.logical_and(live, jnp.logical_not(cut))
        if causal:
            for off in diag:
                pl.when(jnp.logical_and(live, d == off))(functools.partial(run, plan(off), False))
            live = jnp.logical_and(live, d >= block_k - 1)
        pl.when(live)(lambda: run(full, False))
        return
    # Static shapes only: enumerate the grid's (tile kind, first step) combinations.
    kinds, dead = set(), False
    for i in range(num_q):
        for j in range(num_k):
            off = i * block_q - j * block_k
            if causal and off <= -block_q:
                dead = True  # above the diagonal: nothing visible
                continue
            kind = off if causal and off < block_k - 1 else "full"
            kinds.add((kind, key_block is not None and j == 0))
    for kind, first in sorted(kinds, key=str):
        if kind == "full":
            pred = d >= block_k - 1 if causal else jnp.bool_(True)
        else:
            pred = d == kind
        if key_block is not None:
            pred = jnp.logical_and(pred, key_block == 0 if first else key_block != 0)
        body = functools.partial(run, full if kind == "full" else plan(kind), first)
        if len(kinds) == 1 and not dead:
            body()
        else:
            pl.when(pred)(body)


def pair_count(sq: int, skv: int, causal: bool, window: int = 0) -> int:
    """Visible (query, key) pairs per head at full lengths: the useful work for the cost estimate."""
    if window:  # query i sees keys max(0, i - window + 1) .. min(i, skv - 1)
        return sum(max(0, min(i, skv - 1) - max(0, i - window + 1) + 1) for i in range(sq))
    if not causal:
        return sq * skv
    full = max(0, min(sq, skv))
    return full * (full + 1) // 2 + max(0, sq - skv) * skv


def compiler_params(n_parallel: int, blocks: int, scratch: int):
    """The last grid axis is the reduction (carried in VMEM scratch); the others may split across
    TensorCores on megacore chips (v4, v5p).

    `blocks`, `scratch`: bytes as tiling.vmem_limit takes them. The forward's 2048x2048 tiles ask
    for ~22 MiB, within v5e/v6e's 128 MiB and v5p's 64 MiB (v4 has 16 MiB: use 512-row blocks
    there)."""
    return pltpu.CompilerParams(dimension_semantics=("parallel",) * n_parallel + ("arbitrary",),
                                vmem_limit_bytes=vmem_limit(blocks, scratch))


def last_kv_block(q_last, length, block_k: int, num_k: int, causal: bool):
    """Index of the last key block a query block ending at row q_last needs (-1 when none). Later
    grid steps re-use this block index, so Pallas issues no DMA for the tiles they skip.

    Traced indices are divided with lax.div/lax.rem (they are non-negative): jnp's floor division
    lowers through `sign`, which Mosaic only lowers when it runs on a TPU host."""
    last = lax.div(length + block_k - 1, block_k) - 1
    if causal:
        last = jnp.minimum(last, lax.div(q_last, block_k))
    return jnp.minimum(last, num_k - 1)


# ----------------------------------------------------------------------------------------- dK / dV


def _dkv_kernel(lens_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                dk_acc_ref, dv_acc_ref, *, sm_scale, causal, dyn_len, skv, block_q, block_k, num_q,
                num_k, compute_q, compute_k, window=0):
    """One key block against one query block of one query head of the group; the grid's last axis
    walks (head in group, query block) and dK/dV accumulate in f32 VMEM scratch across it.

    Works on transposed scores sT = k @ q.T [keys, queries], so the per-query statistics lse and
    delta are lane-dense rows [1, block_q] and dV = pT @ dO, dK = dsT @ q need no transposes."""
    b, j, t = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    i = lax.rem(t, num_q)
    length = lens_ref[b] if dyn_len else skv
    q_start, k_start = i * block_q, j * block_k

    @pl.when(t == 0)
    def _init():
        dk_acc_ref[...] = jnp.zeros(dk_acc_ref.shape, jnp.float32)
        dv_acc_ref[...] = jnp.zeros(dv_acc_ref.shape, jnp.float32)

    def run(plan, first):
        for chunk in plan:
            rows = slice(chunk.r0, chunk.r0 + chunk.nr)
            k, v = k_ref[rows, :], v_ref[rows, :]
            dk = dv = 0.0  # f32 partial sums over the chunk's query sub-tiles, kept in vregs
            for sub in chunk.subs:
                cols = slice(sub.c0, sub.c0 + sub.nc)
                q, do = q_ref[cols, :], do_ref[cols, :]
                st = lax.dot_general(k, q, NT, precision=mxu_precision(k, q),
                                     preferred_element_type=jnp.float32)  # [keys, queries], unscaled
                if sub.masked:
                    k_pos = k_start + chunk.r0 + lax.broadcasted_iota(jnp.int32, st.shape, 0)
                    q_pos = q_start + sub.c0 + lax.broadcasted_iota(jnp.int32, st.shape, 1)
                    st = jnp.where(visible(q_pos, k_pos, length, causal, window), st, MASK_VALUE)
                # lse is +inf on fully masked rows, so their probabilities (and gradients) are exactly 0.
                pt = jnp.exp2((st - lse_ref[:, cols]) * (sm_scale * LOG2E))  # f32: bf16 loses 3 digits near 1
                dv = dv + lax.dot_general(pt.astype(do.dtype), do, NN, precision=mxu_precision(do),
                                          preferred_element_type=jnp.float32)
                dpt = lax.dot_general(v, do, NT, precision=mxu_precision(v, do), preferred_element_type=jnp.float32)
                dst = pt * (dpt - delta_ref[:, cols])
                # sm_scale is applied once to the [bk, D] sum at the end, not to every score.
                dk = dk + lax.dot_general(dst.astype(q.dtype), q, NN, precision=mxu_precision(q),
                                          preferred_element_type=jnp.float32)
            dk_acc_ref[rows, :] += dk
            dv_acc_ref[rows, :] += dv

    dispatch_tile(run, q_start=q_start, k_start=k_start, length=length, block_q=block_q, block_k=block_k,
                  num_q=num_q, num_k=num_k, compute_q=compute_q, compute_k=compute_k, causal=causal,
                  may_cut=dyn_len or skv != num_k * block_k, keys_on_rows=True, window=window)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_acc_ref[...] * sm_scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc_ref[...].astype(dv_ref.dtype)


# --------------------------------------------------------------------------------------------- dQ


def _dq_kernel(lens_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dq_acc_ref, lse_col_ref,
               delta_col_ref, *, sm_scale, causal, dyn_len, skv, block_q, block_k, num_q, num_k, compute_q,
               compute_k, window=0):
    """One query block against one key block; dQ accumulates in f32 VMEM across the key blocks.

    Queries are on sublanes here, so lse and delta (stored lane-dense [1, block_q]) are turned into
    lane-broadcast columns [block_q, 128] once per query block: a [block_q, 1] array in HBM would be
    tiled (8, 128) and take 128x its size."""
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    length = lens_ref[b] if dyn_len else skv
    q_start, k_start = i * block_q, j * block_k

    @pl.when(j == 0)
    def _init():
        dq_acc_ref[...] = jnp.zeros(dq_acc_ref.shape, jnp.float32)
        # [128, bq] -> [bq, 128]: block_q / 128 whole-vreg-tile XLU transposes per statistic.
        lse_col_ref[...] = jnp.broadcast_to(lse_ref[...], (LANES, block_q)).T
        delta_col_ref[...] = jnp.broadcast_to(delta_ref[...], (LANES, block_q)).T

    def run(plan, first):
        for chunk in plan:
            rows = slice(chunk.r0, chunk.r0 + chunk.nr)
            q, do = q_ref[rows, :], do_ref[rows, :]
            lse, delta = lse_col_ref[rows, :], delta_col_ref[rows, :]
            dq = 0.0  # f32 partial sum over the chunk's key sub-tiles, kept in vregs
            for sub in chunk.subs:
                cols = slice(sub.c0, sub.c0 + sub.nc)
                k, v = k_ref[cols, :], v_ref[cols, :]
                s = lax.dot_general(q, k, NT, precision=mxu_precision(q, k),
                                    preferred_element_type=jnp.float32)  # [queries, keys], unscaled
                if sub.masked:
                    q_pos = q_start + chunk.r0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
                    k_pos = k_start + sub.c0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
                    s = jnp.where(visible(q_pos, k_pos, length, causal, window), s, MASK_VALUE)
                p = jnp.exp2((s - lanes(lse, sub.nc)) * (sm_scale * LOG2E))
                dp = lax.dot_general(do, v, NT, precision=mxu_precision(do, v), preferred_element_type=jnp.float32)
                ds = p * (dp - lanes(delta, sub.nc))
                dq = dq + lax.dot_general(ds.astype(k.dtype), k, NN, precision=mxu_precision(k),
                                          preferred_element_type=jnp.float32)
            dq_acc_ref[rows, :] += dq

    dispatch_tile(run, q_start=q_start, k_start=k_start, length=length, block_q=block_q, block_k=block_k,
                  num_q=num_q, num_k=num_k, compute_q=compute_q, compute_k=compute_k, causal=causal,
                  may_cut=dyn_len or skv != num_k * block_k, window=window)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (dq_acc_ref[...] * sm_scale).astype(dq_ref.dtype)


# ---------------------------------------------------------------------------------------- driver


@functools.partial(jax.jit, static_argnames=("sm_scale", "causal", "dyn_len", "skv", "blocks", "interpret", "window"))
def flash_attention_bwd(q, k, v, lens, o, lse, do, *, sm_scale: float, causal: bool, dyn_len: bool, skv: int,
                        blocks: tuple[int, int, int, int, int, int], interpret=False, window: int = 0):
    """dQ, dK, dV for padded inputs: q/o/do [B, H, Sq, D], k/v [B, KVH, Skv_pad, D], lens [B] int32
    (read only when dyn_len), lse [B, H, 1, Sq] f32 (+inf on fully masked rows); keys at or past
    `skv` are padding. Sq and Skv_pad are multiples of the blocks.
    `blocks` = (block_q_dkv, block_k_dkv, block_q_dq, block_k_dq, compute_q, compute_k)."""
    bsz, heads, sq, d = q.shape
    kv_heads, skv_pad = k.shape[1], k.shape[2]
    group = heads // kv_heads
    bq_kv, bk_kv, bq_q, bk_q, cq, ck = blocks
    # delta_i = sum_d dO_id * O_id = sum_j P_ij dP_ij: one fused XLA reduction over [B, H, Sq, D].
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)[:, :, None, :]  # [B, H, 1, Sq]
    pairs = pair_count(sq, skv, causal, window) * bsz * heads
    in_bytes = sum(x.size * x.dtype.itemsize for x in (q, k, v, do)) + 2 * lse.size * 4
    common = dict(sm_scale=sm_scale, causal=causal, dyn_len=dyn_len, skv=skv, window=window)

    # dK/dV: grid (B, KVH, key blocks, group * query blocks); the whole group's query heads are
    # summed in VMEM, so GQA needs no [B, H, Skv, D] partials and no reduction afterwards.
    nq, nk = sq // bq_kv, skv_pad // bk_kv

    def q_map(b, h, j, t, lens_ref):
        g, i = lax.div(t, nq), lax.rem(t, nq)
        if causal:  # query blocks before the key block see none of it: keep the first needed block
            i = jnp.maximum(i, lax.div(j * bk_kv, bq_kv))
        return b, h * group + g, i, 0

    def row_map(b, h, j, t, lens_ref):
        _, hh, i, _ = q_map(b, h, j, t, lens_ref)
        return b, hh, 0, i

    kv_spec = pl.BlockSpec((None, None, bk_kv, d), lambda b, h, j, t, lens_ref: (b, h, j, 0))
    q_spec = pl.BlockSpec((None, None, bq_kv, d), q_map)
    row_spec = pl.BlockSpec((None, None, 1, bq_kv), row_map)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=bq_kv, block_k=bk_kv, num_q=nq, num_k=nk,
                          compute_q=math.gcd(cq, bq_kv), compute_k=math.gcd(ck, bk_kv), **common),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(bsz, kv_heads, nk, group * nq),
            in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec],
            out_specs=[kv_spec, kv_spec],
            scratch_shapes=[pltpu.VMEM((bk_kv, d), jnp.float32), pltpu.VMEM((bk_kv, d), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        # q, dO, K, V, lse, delta in; dK, dV out; the two f32 accumulators
        compiler_params=compiler_params(3, 2 * block_bytes((bq_kv, d), q.dtype.itemsize)
                                        + 4 * block_bytes((bk_kv, d), k.dtype.itemsize)
                                        + 2 * block_bytes((1, bq_kv), 4), scratch=2 * block_bytes((bk_kv, d), 4)),
        cost_estimate=pl.CostEstimate(flops=8 * pairs * d, transcendentals=pairs,
                                      bytes_accessed=in_bytes + 2 * k.size * k.dtype.itemsize),
        interpret=interpret,
        name="flash_attention_dkv",
    )(lens, q, k, v, do, lse, delta)

    # dQ: grid (B, H, query blocks, key blocks), like the forward.
    nq, nk = sq // bq_q, skv_pad // bk_q

    def kv_map(b, h, i, j, lens_ref):
        last = last_kv_block(i * bq_q + bq_q - 1, lens_ref[b] if dyn_len else skv, bk_q, nk, causal)
        return b, lax.div(h, group), jnp.maximum(jnp.minimum(j, last), 0), 0

    qo_spec = pl.BlockSpec((None, None, bq_q, d), lambda b, h, i, j, lens_ref: (b, h, i, 0))
    row_spec = pl.BlockSpec((None, None, 1, bq_q), lambda b, h, i, j, lens_ref: (b, h, 0, i))
    kv_spec = pl.BlockSpec((None, None, bk_q, d), kv_map)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, block_q=bq_q, block_k=bk_q, num_q=nq, num_k=nk,
                          compute_q=math.gcd(cq, bq_q), compute_k=math.gcd(ck, bk_q), **common),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(bsz, heads, nq, nk),
            in_specs=[qo_spec, kv_spec, kv_spec, qo_spec, row_spec, row_spec],
            out_specs=qo_spec,
            scratch_shapes=[pltpu.VMEM((bq_q, d), jnp.float32), pltpu.VMEM((bq_q, LANES), jnp.float32),
                            pltpu.VMEM((bq_q, LANES), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        # q, dO, K, V, lse, delta in; dQ out; the f32 accumulator and two lane-broadcast row statistics
        compiler_params=compiler_params(3, 3 * block_bytes((bq_q, d), q.dtype.itemsize)
                                        + 2 * block_bytes((bk_q, d), k.dtype.itemsize) + 2 * block_bytes((1, bq_q), 4),
                                        scratch=block_bytes((bq_q, d), 4) + 2 * block_bytes((bq_q, LANES), 4)),
        cost_estimate=pl.CostEstimate(flops=6 * pairs * d, transcendentals=pairs,
                                      bytes_accessed=in_bytes + q.size * q.dtype.itemsize),
        interpret=interpret,
        name="flash_attention_dq",
    )(lens, q, k, v, do, lse, delta)
    return dq, dk, dv
