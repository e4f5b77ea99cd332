"""Top-k / top-p (nucleus) sampling per row without sorting the vocabulary.

Reads logits [B, V] (f32 or bf16) and uniform noise u [B] (f32 in [0, 1), passed in so that
results are deterministic); static k, p, temperature. Returns token ids int32 [B]. Forward only
(sampling is not differentiated). This module holds the Pallas TPU kernel, the sort-based pure-JAX
reference, the plain-JAX version users write (lax.top_k / sort, softmax, cumsum), and the `SPEC`
that `verify.py` and `bench.py` read. It does not autotune: `bench/sweep_sampling.py` chose the
default blocks.

Semantics (the kernel and the reference implement exactly this; the plain-JAX version agrees up to
ties at the top-k boundary, where lax.top_k keeps exactly k):
1. K = tokens whose logit is >= the k-th largest logit of the row (ties at the boundary are all
   kept; k None or >= V keeps every token). Ranking uses the logits themselves: temperature > 0
   does not change the order.
2. w_j = exp((x_j - max x) / temperature) for j in K, 0 elsewhere; W = sum w.
3. Nucleus: P = tokens j in K whose "mass strictly above", A_j = sum of w_i over i in K with
   x_i > x_j, is < p * W: the smallest set of highest-probability tokens whose probability reaches
   p, plus tokens tied with its last one. p >= 1 keeps all of K.
4. With v_j = w_j on P and 0 elsewhere, the sample is the first token in vocabulary order whose
   running sum of v exceeds u * sum(v): inverse-CDF sampling of the renormalized distribution,
   walked in vocabulary order (any fixed order gives the same distribution; vocabulary order is
   the one a kernel can walk without sorting).

Kernel (one grid step = block_rows rows, the whole vocabulary row in VMEM):
- Pass A, one read of the row: per row and per lane (vocabulary index mod 128) the m largest
  logits seen, kept sorted by a compare-exchange insertion network (2m - 1 VPU ops per vreg,
  no cross-lane work). These m x 128 candidates hold the whole top-k unless some lane holds more
  than m of it; the lane lists' m-th values tell when that may have happened (then the block takes
  the slow path below, exactly).
- The k-th largest value and the nucleus threshold are found by search on the candidates, on the
  int32 keys that order f32 values like the floats themselves (sign-magnitude flipped to two's
  complement): a search over all 2^32 keys pins the exact threshold, no rounding. On the few
  candidate vregs a step is latency-bound (a cross-lane sum per test), so each step tests 7 keys
  (8-way search, 12 steps instead of 32).
- Slow path (some lane overflowed, or top-p without top-k, where the nucleus may be most of the
  vocabulary): the same searches over the whole row, as bisections (32 passes over VMEM each,
  3 VPU ops per element per pass).
- Pass B: kept weights v = exp(...) where x >= threshold, summed per lane while the row is walked in
  vocabulary order; after each super-chunk (8 x 128 lanes) the running per-lane sums go to VMEM.
  Their lane sums, afterwards, find the super-chunk where the running mass crosses u * sum(v);
  that super-chunk of each row is gathered (one dynamic-offset load per row) and its in-register
  prefix sum (roll-and-add on the 128 lanes) finds the token.
The logits are read from HBM once; every other pass is over VMEM.

Exactness against the sort-based reference: top-k thresholds are exact. The nucleus boundary and
the inverse-CDF step compare sums of the same f32 weights added in a different order (by threshold
here, by sorted cumsum there), so a decision within ~1e-6 of p * W or of u * sum(v) can legitimately
differ, as between any two correct samplers. The verify cases therefore draw rows and noise whose
decisions clear those boundaries by a 1e-4 relative margin (checked in float64), and then the token
ids must match exactly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import block_bytes, vmem_limit

# Production shape and parameters the default blocks were chosen at: a decode step of a 128k-vocab LM.
PROD = dict(batch=64, vocab=131072, dtype="float32", k=64, p=0.9, temperature=0.8)

_LANES = 128
# Searches on the m x 128 candidates are latency-bound (a cross-lane sum per test): 8-way, 12
# steps. Searches over the whole row are VPU-bound: bisection, 32 passes of 3 ops per element.
_FAST_WAYS, _SLOW_WAYS = 8, 2
_F32_MIN_KEY = -2139095041  # key of -inf (see _key)


@dataclass(frozen=True)
class BlockSizes:
    """Rows per grid step, and m: candidates kept per row and lane in pass A.

    block_rows: a multiple of 8 (one f32 vreg holds 8 rows x 128 lanes; bf16 logits use at least 16,
    one packed vreg). The whole vocabulary of each row stays in VMEM, double-buffered: keep
    block_rows x V x itemsize under ~8 MiB.
    lane_candidates (m): the top-k fast path holds m x 128 candidates per row; it needs k <= m x 128
    and falls back to the exact full-row bisection when a lane holds more than m of the top k
    (k = 64, m = 8: about 1e-5 per row for iid logits). Pass A costs 2m - 1 VPU ops per vreg.
    """

    # bench/sweep_sampling.py, v5e static profile at B64 V128k k64: 8 rows 157k cycles, 16 rows 122k
    # (twice the independent work per latency-bound search step), 32 rows 124k. m = 4 profiles
    # cheaper only because the static profile does not count the slow path, which k = 64 would
    # take for ~30% of rows at m = 4 (iid logits) and ~1e-5 at m = 8.
    # On a v5e chip (device time, B64 V128k k64): 16 rows m = 8 80.1 us, m = 6 72.9 us; 32 rows
    # m = 8 80.9, m = 6 74.0. With m = 6 a lane holds more than 6 of the top 64 for ~2e-4 of iid rows.
    block_rows: int = 16
    lane_candidates: int = 6

    def __post_init__(self):
        if not isinstance(self.block_rows, int) or self.block_rows < 8 or self.block_rows % 8:
            raise ValueError(f"block_rows must be a positive multiple of 8 (f32 sublanes), got {self.block_rows!r}")
        if not isinstance(self.lane_candidates, int) or not 1 <= self.lane_candidates <= 32:
            raise ValueError(f"lane_candidates must be an int in [1, 32], got {self.lane_candidates!r}")

    def __str__(self) -> str:
        return f"block_rows={self.block_rows}, lane_candidates={self.lane_candidates}"


DEFAULT_BLOCKS = BlockSizes()


def _check_params(logits, u, k, p, temperature):
    """Shape, dtype and parameter errors as ValueError, before any kernel is traced."""
    if logits.ndim != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"logits must be a non-empty [batch, vocab] array, got shape {logits.shape}")
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if u.shape != (logits.shape[0],):
        raise ValueError(f"u must be [batch={logits.shape[0]}], got shape {u.shape}")
    if not jnp.issubdtype(u.dtype, jnp.floating):
        raise ValueError(f"u must be floating point uniform noise in [0, 1), got {u.dtype}")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"k must be None or a positive int, got {k!r}")
    if not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    if not isinstance(temperature, (int, float)) or not 0.0 < temperature < math.inf:
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")


# ----------------------------------------------------------------------------------------------
# f32 <-> order-preserving int32 keys


def _key(x):
    """int32 key with key(a) < key(b) iff a < b for non-NaN f32 (sign-magnitude to two's complement)."""
    b = lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where(b >= 0, b, b ^ 0x7FFFFFFF)


def _unkey(k):
    return lax.bitcast_convert_type(jnp.where(k >= 0, k, k ^ 0x7FFFFFFF), jnp.float32)


def _nested_mids(lo, hi, ways, ceil):
    """The ways - 1 points splitting [lo, hi] into `ways` near-equal parts, ascending."""
    if ways == 1:
        return []
    mid = _mid_ceil(lo, hi) if ceil else _mid_floor(lo, hi)
    return _nested_mids(lo, mid, ways // 2, ceil) + [mid] + _nested_mids(mid, hi, ways // 2, ceil)


def _mid_floor(lo, hi):
    return (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2) without int32 overflow


def _mid_ceil(lo, hi):
    return (lo >> 1) + (hi >> 1) + ((lo | hi) & 1)  # ceil((lo + hi) / 2) without int32 overflow


def _tree(op, xs):
    while len(xs) > 1:
        xs = [op(xs[i], xs[i + 1]) if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


def _rowsum(xs):
    """Sum over a list of [rows, 128] arrays and their lanes -> [rows, 1]."""
    return jnp.sum(_tree(jnp.add, xs), axis=1, keepdims=True)


def _lane_prefix(a, lane):
    """Inclusive prefix sum along the 128 lanes: 7 roll-and-add steps on the XLU/VPU."""
    d = 1
    while d < a.shape[1]:
        a = a + jnp.where(lane >= d, pltpu.roll(a, d, 1), 0.0)
        d *= 2
    return a


# ----------------------------------------------------------------------------------------------
# kernel


def sampling_kernel(u_ref, x_ref, out_ref, q_ref, thr_ref, *, vocab: int, k: int | None, p: float,
                    inv_temp: float, m: int, per_iter: int, unroll: bool):
    """One grid step: rows [bb] of the batch, their whole vocabulary.

    u_ref [bb, 1] f32; x_ref [bb, Vb] logits (Vb = V rounded up to a whole super-chunk; columns past
    V are whatever the DMA left and are masked to -inf); out_ref [bb, 1] int32. VMEM scratch:
    q_ref [n_super, bb, 128] f32 (per lane, the kept mass up to the end of each super-chunk) and
    thr_ref [bb, 1] f32 (the final threshold). A super-chunk is `per_iter` chunks of 128 lanes: one
    loop iteration, and the unit the last step gathers per row. `unroll` False (interpret mode)
    keeps every loop rolled: the same operations in the same order, a smaller program to compile.
    """
    bb = x_ref.shape[0]
    n_chunks = pl.cdiv(vocab, _LANES)
    tail = vocab - (n_chunks - 1) * _LANES  # real lanes in the last chunk
    n_super = pl.cdiv(n_chunks, per_iter)
    width = per_iter * _LANES
    lane = lax.broadcasted_iota(jnp.int32, (bb, _LANES), 1)
    f32 = jnp.float32

    def load(c, masked):
        x = x_ref[:, pl.ds(pl.multiple_of(c * _LANES, _LANES), _LANES)].astype(f32)
        return jnp.where(lane < tail, x, -jnp.inf) if masked else x

    unroll_loops = unroll

    def sweep(fn, carry, unroll=1):
        """carry = fn(chunk values (a list), super-chunk index, carry) over the row, in vocab order."""
        n_loop = n_super if n_chunks % per_iter == 0 and tail == _LANES else n_super - 1
        carry = lax.fori_loop(
            0, n_loop, lambda s, c: fn([load(s * per_iter + i, False) for i in range(per_iter)], s, c), carry,
            unroll=max(1, min(unroll if unroll_loops else 1, n_loop)))
        if n_loop < n_super:  # the last, shorter or masked super-chunk, unrolled with static indices
            s = n_super - 1
            xs = [load(c, tail != _LANES and c == n_chunks - 1) for c in range(s * per_iter, n_chunks)]
            carry = fn(xs, s, carry)
        return carry

    # Pass A: lane-wise top-m lists, sorted descending, by a compare-exchange insertion network.
    def insert(xs, s, lists):
        lists = list(lists)
        for x in xs:
            for i in range(m):
                hi = jnp.maximum(lists[i], x)
                if i + 1 < m:
                    x = jnp.minimum(lists[i], x)
                lists[i] = hi
        return tuple(lists)

    # Unrolled twice: the insertion network of the next super-chunk fills the VALU slots while this
    # one's compare-exchanges wait on each other (v5e static profile: -8k cycles at B64 V128k).
    lists = sweep(insert, (jnp.full((bb, _LANES), -jnp.inf, f32),) * m, unroll=2)
    row_max = jnp.max(lists[0], axis=1, keepdims=True)  # [bb, 1]

    def weights(x):
        return jnp.exp((x - row_max) * inv_temp)

    def count_ge(xs, thr):
        return _rowsum([jnp.where(x >= thr, 1.0, 0.0) for x in xs])

    def search(ok_low, lo, hi, ways, ceil):
        """Bisection (ways = 2) or 2^b-way search on int32 keys for the boundary of a monotone
        predicate: ok_low(lo) holds, ok_low(hi) does not; returns (lo, hi) with hi = lo + 1. Each
        step tests ways - 1 nested midpoints, so a latency-bound search (few vregs per test, a
        cross-lane sum at the end of each) takes 12 steps (ways = 8) instead of 32."""
        steps = 32 if ways == 2 else -(-32 // (ways.bit_length() - 1)) + 1

        def step(_, lohi):
            lo, hi = lohi
            mids = _nested_mids(lo, hi, ways, ceil)  # ascending
            oks = [ok_low(mid) for mid in mids]  # monotone: True up to the boundary, then False
            new_lo, new_hi = lo, hi
            for mid, ok in zip(mids, oks):
                new_lo = jnp.where(ok, mid, new_lo)
            for mid, ok in zip(mids[::-1], oks[::-1]):
                new_hi = jnp.where(ok, new_hi, mid)
            return new_lo, new_hi
        return lax.fori_loop(0, steps, step, (lo, hi))

    def kth_largest(count_fn, ways):
        """Largest f32 t with count_fn(t) >= k, exact: the search runs on the int32 keys."""
        lo0 = jnp.full((bb, 1), _F32_MIN_KEY, jnp.int32)  # -inf: everything counts
        lo, _ = search(lambda key: count_fn(_unkey(key)) >= k, lo0, _key(row_max) + 1, ways, ceil=False)
        return _unkey(lo)

    def nucleus(t_k, mass_gt, total, ways):
        """Smallest threshold T > t_k's predecessor with mass_gt(T) < p * total, exact on the keys.
        Ceil midpoints never test the start of the range (below -inf it is not a float)."""
        target = p * total
        lo0 = jnp.maximum(_key(t_k), _F32_MIN_KEY) - 1
        _, hi = search(lambda key: mass_gt(_unkey(key)) >= target, lo0, _key(row_max), ways, ceil=True)
        return _unkey(hi)

    k_active = k is not None and k < vocab
    zero_col = jnp.zeros((bb, 1), f32)

    def full_row_thresholds():
        """Exact thresholds from the whole row (the slow path): 32 passes over VMEM per bisection."""
        if k_active:
            t_k = kth_largest(lambda t: sweep(lambda xs, s, acc: acc + count_ge(xs, t), zero_col), _SLOW_WAYS)
        else:
            t_k = jnp.full((bb, 1), -jnp.inf, f32)
        if p >= 1.0:
            return t_k

        def mass(t, strict=True):
            def f(xs, s, acc):
                return acc + _rowsum([jnp.where((x > t) if strict else (x >= t), weights(x), 0.0) for x in xs])
            return sweep(f, zero_col)

        return nucleus(t_k, mass, mass(t_k, strict=False), _SLOW_WAYS)

    if not k_active and p >= 1.0:
        thr = jnp.full((bb, 1), -jnp.inf, f32)
    elif not k_active or k > m * _LANES:
        thr = full_row_thresholds()
    else:
        # Fast path on the m x 128 candidates per row.
        cand = list(lists)
        t_k = kth_largest(lambda t: count_ge(cand, t), _FAST_WAYS)
        if p >= 1.0:
            fast_thr = t_k
        else:
            cw = [jnp.where(c >= t_k, weights(c), 0.0) for c in cand]
            fast_thr = nucleus(t_k, lambda t: _rowsum([jnp.where(c > t, w, 0.0) for c, w in zip(cand, cw)]),
                               _rowsum(cw), _FAST_WAYS)
        thr_ref[...] = fast_thr  # the threshold crosses the data-dependent branch through VMEM
        if n_chunks > m:  # else every lane's list holds its whole column: nothing can be missing
            # A lane whose m-th largest reaches t_k may hold more of the top k than its list kept.
            overflow = jnp.max(jnp.where(lists[m - 1] >= t_k, 1.0, 0.0))

            @pl.when(overflow > 0)
            def _():
                thr_ref[...] = full_row_thresholds()

        thr = thr_ref[...]

    # Pass B: kept weights, summed per lane as the row is walked; q_ref[s] = the running per-lane
    # mass at the end of super-chunk s. No cross-lane work and no stores but one vreg per iteration.
    def kept(xs, s, run):
        run = run + _tree(jnp.add, [jnp.where(x >= thr, weights(x), 0.0) for x in xs])
        q_ref[s] = run
        return run

    # Unrolled 8 times: one iteration is a chain load -> exp (EUP) -> add tree -> running sum that
    # leaves the VALU idle; v5e static profile at B64 V128k: 301k cycles unrolled once, 196k at 8.
    sweep(kept, jnp.zeros((bb, _LANES), f32), unroll=8)
    target = u_ref[...] * jnp.sum(q_ref[n_super - 1], axis=1, keepdims=True)

    # The super-chunk where the running mass crosses target: how many end at or below it. The
    # lane reductions are independent of each other, so unrolled they overlap on the XLU.
    def crossing(s, carry):
        count, base = carry
        pre = jnp.sum(q_ref[s], axis=1, keepdims=True)
        below = pre <= target
        return count + below.astype(jnp.int32), jnp.where(below, pre, base)

    count, base = lax.fori_loop(0, n_super, crossing, (jnp.zeros((bb, 1), jnp.int32), zero_col),
                                unroll=min(8, n_super) if unroll_loops else 1)
    s_star = jnp.minimum(count, n_super - 1)

    # Gather super-chunk s_star of each row (a dynamic lane offset per row, one row at a time) and
    # walk it: running mass in vocabulary order, count the positions still <= target.
    row = lax.broadcasted_iota(jnp.int32, (bb, 1), 0)
    pieces = []
    for r in range(bb):
        s_r = jnp.sum(jnp.where(row == r, s_star, 0))
        pieces.append(x_ref[pl.ds(r, 1), pl.ds(pl.multiple_of(s_r * width, width), width)].astype(f32))
    xs = jnp.concatenate(pieces, axis=0)  # [bb, width]
    col0 = s_star * width
    run = base
    below = jnp.zeros((bb, 1), jnp.int32)
    last_kept = jnp.full((bb, 1), -1, jnp.int32)
    for i in range(per_iter):
        x = xs[:, i * _LANES:(i + 1) * _LANES]
        v = jnp.where((x >= thr) & (col0 + i * _LANES + lane < vocab), weights(x), 0.0)
        pre = run + _lane_prefix(v, lane)
        below = below + jnp.sum(jnp.where(pre <= target, 1, 0), axis=1, keepdims=True)
        last_kept = jnp.maximum(last_kept, jnp.max(jnp.where(v > 0, i * _LANES + lane, -1), axis=1, keepdims=True))
        run = jnp.sum(jnp.where(lane == _LANES - 1, pre, 0.0), axis=1, keepdims=True)
    # Sums in another order can leave target just past the super-chunk's own running total: then
    # the last kept token of the super-chunk is the one the crossing belongs to.
    out_ref[...] = jnp.minimum(col0 + jnp.minimum(below, last_kept), vocab - 1)


def _rows_for(dtype, block_rows: int, batch: int) -> int:
    rows = block_rows if jnp.dtype(dtype).itemsize >= 4 else max(16, -(-block_rows // 16) * 16)
    return batch if batch <= rows else rows  # the whole (small) batch is always a legal block


@functools.partial(jax.jit, static_argnames=("k", "p", "temperature", "block_sizes", "interpret"))
def sample(logits, u, *, k: int | None = None, p: float = 1.0, temperature: float = 1.0,
           block_sizes: BlockSizes | None = None, interpret: bool = False):
    """Token ids int32 [B]: top-k then top-p (nucleus) sampling of softmax(logits / temperature),
    driven by uniform noise u [B] in [0, 1). See the module docstring for the exact semantics."""
    _check_params(logits, u, k, p, temperature)
    blocks = DEFAULT_BLOCKS if block_sizes is None else block_sizes
    if not isinstance(blocks, BlockSizes):
        raise ValueError(f"block_sizes must be a sampling.BlockSizes, got {type(blocks).__name__}")
    batch, vocab = logits.shape
    rows = _rows_for(logits.dtype, blocks.block_rows, batch)
    n_chunks = -(-vocab // _LANES)
    # Super-chunk: 8 chunks (1024 lanes) per loop iteration, fewer for tiny vocabularies.
    per_iter = min(8, n_chunks)
    vb = -(-n_chunks // per_iter) * per_iter * _LANES  # the block may overhang the array: Pallas pads the DMA
    m = blocks.lane_candidates
    kernel = functools.partial(sampling_kernel, vocab=vocab, k=k, p=float(p), inv_temp=1.0 / float(temperature),
                               m=m, per_iter=per_iter, unroll=not interpret)
    n = batch * vocab
    # u in and the ids out are [rows, 1] columns beside the logits block
    vmem = vmem_limit(2 * block_bytes((rows, 1), 4) + block_bytes((rows, vb), logits.dtype.itemsize),
                      scratch=block_bytes((vb // (per_iter * _LANES), rows, _LANES), 4) + block_bytes((rows, 1), 4))
    out = pl.pallas_call(
        kernel,
        grid=(pl.cdiv(batch, rows),),
        in_specs=[pl.BlockSpec((rows, 1), lambda i: (i, 0)), pl.BlockSpec((rows, vb), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((batch, 1), jnp.int32),
        scratch_shapes=[pltpu.VMEM((vb // (per_iter * _LANES), rows, _LANES), jnp.float32),
                        pltpu.VMEM((rows, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=vmem),
        # The logits are read from HBM once: pass A (2m - 1 ops) and pass B (~6 ops, one exp) per element.
        cost_estimate=pl.CostEstimate(flops=(2 * m + 5) * n, transcendentals=n,
                                      bytes_accessed=n * logits.dtype.itemsize + batch * 8),
        interpret=interpret,
        name="topk_topp_sampling",
    )(u.reshape(batch, 1).astype(jnp.float32), logits)
    return out[:, 0]


# ----------------------------------------------------------------------------------------------
# reference and the plain-JAX version


def _first_above(c, target):
    """Index of the first entry of the non-decreasing rows of c that exceeds target [B, 1]."""
    return jnp.minimum(jnp.sum((c <= target).astype(jnp.int32), axis=-1), c.shape[-1] - 1)


@functools.partial(jax.jit, static_argnames=("k", "p", "temperature"))
def reference(logits, u, *, k: int | None = None, p: float = 1.0, temperature: float = 1.0):
    """Pure JAX, sorting the row: the module docstring's semantics; runs in float64 too.

    Jitted only so that verify compiles it once per case rather than op by op."""
    x = logits if logits.dtype == jnp.float64 else logits.astype(jnp.float32)
    u = u.astype(x.dtype)
    vocab = x.shape[1]
    desc = -jnp.sort(-x, axis=-1)  # descending values; a weight depends only on its value
    t_k = desc[:, k - 1:k] if k is not None and k < vocab else jnp.full_like(desc[:, :1], -jnp.inf)
    thr = t_k
    if p < 1.0:
        ws = jnp.where(desc >= t_k, jnp.exp((desc - desc[:, :1]) / temperature), 0.0)
        excl = jnp.concatenate([jnp.zeros_like(ws[:, :1]), jnp.cumsum(ws, axis=-1)[:, :-1]], axis=-1)
        # Mass strictly above a value = the exclusive cumsum at the value's first (tied) position.
        pos = lax.broadcasted_iota(jnp.int32, desc.shape, 1)
        new = jnp.concatenate([jnp.ones_like(desc[:, :1], bool), desc[:, 1:] != desc[:, :-1]], axis=-1)
        first = lax.cummax(jnp.where(new, pos, 0), axis=1)
        keep = (desc >= t_k) & (jnp.take_along_axis(excl, first, axis=-1) < p * jnp.sum(ws, axis=-1, keepdims=True))
        thr = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)  # the kept set is a top set
    w = jnp.where(x >= thr, jnp.exp((x - desc[:, :1]) / temperature), 0.0)
    c = jnp.cumsum(w, axis=-1)
    return _first_above(c, u[:, None] * c[:, -1:]).astype(jnp.int32)


def xla_sample(logits, u, *, k: int | None = None, p: float = 1.0, temperature: float = 1.0):
    """What users write without a kernel: lax.top_k (or a full sort for top-p alone), softmax of the
    survivors, cumsum, searchsorted-style pick. Same result as `reference` up to ties at the k-th
    value (lax.top_k keeps exactly k)."""
    x = logits.astype(jnp.float32)
    vocab = x.shape[1]
    if k is not None and k < vocab:
        vals, idx = lax.top_k(x, k)
    else:
        idx = jnp.argsort(-x, axis=-1)
        vals = jnp.take_along_axis(x, idx, axis=-1)
    w = jnp.exp((vals - vals[:, :1]) / temperature)
    if p < 1.0:
        excl = jnp.cumsum(w, axis=-1) - w
        w = jnp.where(excl < p * jnp.sum(w, axis=-1, keepdims=True), w, 0.0)
    order = jnp.argsort(idx, axis=-1)  # back to vocabulary order for the inverse CDF
    w, idx = jnp.take_along_axis(w, order, axis=-1), jnp.take_along_axis(idx, order, axis=-1)
    c = jnp.cumsum(w, axis=-1)
    pos = _first_above(c, u[:, None] * c[:, -1:])
    return jnp.take_along_axis(idx, pos[:, None], axis=-1)[:, 0].astype(jnp.int32)


# ----------------------------------------------------------------------------------------------
# verify cases and bench

_MARGIN = 1e-4  # relative distance every case keeps from the nucleus and inverse-CDF boundaries


def _boundary_distances(x, u, k, p, temperature):
    """Per row, in float64 numpy: the relative distance of the nucleus decision (min over tokens in K
    of |A_j - p W| / W) and of the inverse-CDF decision (min over j of |cumsum_j - u sum| / sum)."""
    x = x.astype(np.float64)
    b, vocab = x.shape
    desc = -np.sort(-x, axis=1)
    in_k = x >= desc[:, k - 1:k] if k is not None and k < vocab else np.ones(x.shape, bool)
    w = np.where(in_k, np.exp((x - desc[:, :1]) / temperature), 0.0)
    total = w.sum(axis=1, keepdims=True)
    p_dist = np.full(b, np.inf)
    if p < 1.0:
        # Mass strictly above each token: exclusive cumsum in descending order, read at the first
        # occurrence of the token's value (ties share it).
        order = np.argsort(-x, axis=1, kind="stable")
        ws = np.take_along_axis(w, order, axis=1)
        excl = np.concatenate([np.zeros((b, 1)), np.cumsum(ws, axis=1)[:, :-1]], axis=1)
        first = np.stack([np.searchsorted(-desc[r], -x[r], side="left") for r in range(b)])
        above = np.take_along_axis(excl, first, axis=1)
        p_dist = np.where(in_k, np.abs(above - p * total) / total, np.inf).min(axis=1)
        w = np.where(above < p * total, w, 0.0)
    c = np.cumsum(w, axis=1)
    u_dist = (np.abs(c - u[:, None] * c[:, -1:]) / c[:, -1:]).min(axis=1)
    return p_dist, u_dist


def _case_args(batch, vocab, dtype, k, p, temperature, scale=2.0):
    """make_args for one case: fresh normal logits x scale and uniform u, redrawn (rows, then u) until
    every decision clears the boundaries by _MARGIN, so that exact comparison is meaningful."""
    def make(key):
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
        x = (scale * rng.standard_normal((batch, vocab))).astype(np.float32)
        x = np.array(jnp.asarray(x).astype(dtype).astype(jnp.float32))  # writable copy
        u = rng.uniform(0.0, 1.0, batch)
        for _ in range(200):
            p_dist, u_dist = _boundary_distances(x, u, k, p, temperature)
            bad_rows = p_dist < _MARGIN
            bad_u = u_dist < _MARGIN
            if not bad_rows.any() and not bad_u.any():
                break
            fresh = (scale * rng.standard_normal((int(bad_rows.sum()), vocab))).astype(np.float32)
            x[bad_rows] = np.asarray(jnp.asarray(fresh).astype(dtype).astype(jnp.float32))
            u[bad_u & ~bad_rows] = rng.uniform(0.0, 1.0, int((bad_u & ~bad_rows).sum()))
        else:
            raise RuntimeError("could not draw sampling inputs away from the decision boundaries")
        return jnp.asarray(x).astype(dtype), jnp.asarray(u, jnp.float32)
    return make


def cases() -> list[Case]:
    f32, bf16 = jnp.float32, jnp.bfloat16
    small = BlockSizes(block_rows=8, lane_candidates=8)

    def case(label, batch, vocab, dtype, k, p, temperature, blocks=small, **kw):
        return Case(label, _case_args(batch, vocab, dtype, k, p, temperature, **kw),
                    dict(k=k, p=p, temperature=temperature, block_sizes=blocks),
                    "float32" if dtype == f32 else "bfloat16", exact=True)

    # Five cases, one compile of the interpreted kernel each (~3-5 s of CPU on this machine).
    return [
        case("f32 top-k 20 + top-p 0.9, V1000 (not a multiple of 128): candidate fast path", 8, 1000, f32, 20,
             0.9, 0.8),
        case("bf16 logits at scale 1e3 (exp underflows past the top few), top-k 50 + top-p 0.8, V2048, 16 rows",
             16, 2048, bf16, 50, 0.8, 1.0, scale=1e3),
        case("f32 k=1 is argmax, p=1, 12 rows, V777", 12, 777, f32, 1, 1.0, 1.0),
        case("f32 top-p 0.5 alone: full-row bisection", 8, 640, f32, None, 0.5, 1.2),
        case("f32 top-k 64 + top-p 0.95 with 2 candidates per lane: forced overflow, exact slow path", 8, 4096,
             f32, 64, 0.95, 1.0, blocks=BlockSizes(block_rows=8, lane_candidates=2)),
    ]


TOLERANCES = {
    "float32": Tolerance(0.0, 0.0, "token ids compare exactly (the cases keep a 1e-4 margin from "
                                   "the nucleus and inverse-CDF boundaries, see the module docstring)"),
    "bfloat16": Tolerance(0.0, 0.0, "token ids compare exactly; bf16 logits are exact in f32"),
}

BLOCK_CANDIDATES = (
    BlockSizes(8, 8),
    BlockSizes(16, 8),
    BlockSizes(8, 4),
    BlockSizes(8, 16),
    BlockSizes(32, 8),
    BlockSizes(16, 6),
)


def bench(blocks: BlockSizes | None = None) -> BenchSetup:
    blocks = DEFAULT_BLOCKS if blocks is None else blocks
    b, v, k, p, t = PROD["batch"], PROD["vocab"], PROD["k"], PROD["p"], PROD["temperature"]
    args = (jax.ShapeDtypeStruct((b, v), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.float32))
    return BenchSetup(
        shape=f"B{b} V{v} f32, k={k} p={p} temperature={t}",
        args=args,
        kernel=functools.partial(sample, k=k, p=p, temperature=t, block_sizes=blocks, interpret=False),
        xla=functools.partial(xla_sample, k=k, p=p, temperature=t),
        blocks=str(blocks),
    )


SPEC = KernelSpec(
    name="sampling",
    title="Top-k / top-p (nucleus) sampling by exact threshold bisection, no sort of the vocabulary",
    replaces="lax.top_k / jnp.sort over the whole [B, V] row, then softmax, cumsum and a search: XLA "
             "lowers top_k over a 128k vocabulary to a full sort of values and indices (134 MB of sort "
             "traffic for 32 MB of logits at B64), and top-p alone sorts everything (1.75 GB)",
    signature="sample(logits, u, *, k=None, p=1.0, temperature=1.0, block_sizes=None, interpret=False) "
              "-> int32[B]",
    tuned_for="B64 V131072 f32, k=64 p=0.9 temperature=0.8 (v5e and v6e)",
    usage="from tpudiag.kernels.sampling import sample\n"
          "u = jax.random.uniform(key, (logits.shape[0],))\n"
          "tokens = sample(logits, u, k=64, p=0.9, temperature=0.8)  # int32 [B]",
    kernel=sample,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=BLOCK_CANDIDATES,
    differentiable=False,
)
