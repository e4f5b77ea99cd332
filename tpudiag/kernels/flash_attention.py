"""Flash attention for TPU: causal or not, grouped-query heads, key padding; forward and backward.

`flash_attention(q, k, v, kv_lengths=None, *, causal, sm_scale, block_sizes, interpret)` takes
q [B, H, Sq, D] and k, v [B, KVH, Skv, D] (H a multiple of KVH) and returns softmax(q k^T * scale) v
as [B, H, Sq, D] in q's dtype. Scores live only in VMEM, one [block_q, block_k] tile at a time,
with an online softmax accumulated in f32; the backward (custom_vjp) is two Pallas kernels in
`flash_attention_bwd.py` that recompute the tiles from the saved log-sum-exp.

Masking: `causal` lets query i see keys j <= i (positions counted from 0 in both, as in JAX's
`flash_attention`); `kv_lengths` [B] hides keys j >= kv_lengths[b]. A query row that sees no key
at all (kv_lengths[b] == 0) has output 0 and gradient 0. Sequence lengths need not be block
multiples: the wrapper pads and masks. There is no dropout, bias or segment-id support.
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

from tpudiag.kernels.flash_attention_bwd import (
    LANES, LOG2E, MASK_VALUE, NN, NT, compiler_params, dispatch_tile, flash_attention_bwd, last_kv_block,
    lanes, pair_count, visible)
from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import block_bytes, mxu_precision, precise_log, round_up


# pallas.reciprocal moved to pallas.tpu (jax 0.12 warns at the old name; jax 0.10 has only that one).
_reciprocal = getattr(pltpu, "reciprocal", None) or pl.reciprocal


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes: query rows and key rows per grid step, for the forward and the two backward passes.

    Multiples of 128: block_k is the lane axis of the forward's score tile and block_q the lane axis
    of the dK/dV pass's transposed tile (a vreg is 8 sublanes x 128 lanes, the MXU 128 wide on v5e).
    Sequences shorter than a block use one block of the sequence length rounded up to 128. The
    backward blocks default to the forward's. compute_* are the sub-tile sizes computed at a time
    inside a block (flash_attention_bwd.RowChunk); each is reduced to divide its block.

    Defaults from bench/sweep_flash_attention.py at B1 H8 S2048 D128 bf16 causal (v5e, static
    estimates): whole-sequence 2048 blocks read K/V once per head, and 128x256 sub-tiles keep the
    running statistics in vregs (larger ones spill; 128x128 starves the MXU). The backward sub-tiles
    are 256x256: at 128x128 v6e's 256-wide MXU runs a quarter full (its dK/dV pass measured 499k
    cycles against 97k), and v5e also comes out ahead (469k against 489k for the whole grad step).
    """

    block_q: int = 2048
    block_k: int = 2048
    compute_q: int = 128  # queries per forward sub-tile
    compute_k: int = 256  # keys per forward sub-tile
    block_q_dkv: int | None = None
    block_k_dkv: int | None = None
    block_q_dq: int | None = None
    block_k_dq: int | None = None
    compute_q_bwd: int = 256  # queries per backward sub-tile (both passes)
    compute_k_bwd: int = 256  # keys per backward sub-tile

    def __post_init__(self):
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if val is None:
                continue
            if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
                raise ValueError(f"BlockSizes.{f.name} must be a positive int, got {val!r}")
            if val % LANES:
                raise ValueError(f"BlockSizes.{f.name}={val} must be a multiple of {LANES} "
                                 "(the TPU lane width: score tiles are [block_q, block_k])")

    def resolved(self, sq: int, skv: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """((block_q, block_k, compute_q, compute_k), (dkv q, dkv k, dq q, dq k, compute q, compute k)),
        blocks capped at the sequence lengths rounded up to 128."""
        cap_q, cap_k = round_up(sq, LANES), round_up(skv, LANES)
        fwd = (min(self.block_q, cap_q), min(self.block_k, cap_k), self.compute_q, self.compute_k)
        bwd = (min(self.block_q_dkv or self.block_q, cap_q), min(self.block_k_dkv or self.block_k, cap_k),
               min(self.block_q_dq or self.block_q, cap_q), min(self.block_k_dq or self.block_k, cap_k),
               self.compute_q_bwd, self.compute_k_bwd)
        return fwd, bwd

    def text(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                         if getattr(self, f.name) is not None)


def check_shapes(q, k, v, kv_lengths=None) -> None:
    """Raise ValueError, naming the shapes, before anything is traced."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [B, H, S, D]; got shapes {q.shape}, {k.shape}, {v.shape}")
    (b, h, sq, d), (bk, hk, skv, dk) = q.shape, k.shape
    if v.shape != k.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    if bk != b or dk != d:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on batch (dim 0) and head_dim (dim 3)")
    if hk == 0 or h % hk:
        raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({hk}) for grouped-query attention")
    if min(sq, skv, d) == 0:
        raise ValueError(f"empty sequence or head_dim: q {q.shape}, k {k.shape}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"q, k, v must share one dtype, float32 or bfloat16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if kv_lengths is not None:
        if kv_lengths.shape != (b,) or not jnp.issubdtype(kv_lengths.dtype, jnp.integer):
            raise ValueError(f"kv_lengths must be an integer array of shape ({b},); got "
                             f"{kv_lengths.dtype}{list(kv_lengths.shape)}")


# ------------------------------------------------------------------------------------------ forward


def _fwd_kernel(lens_ref, q_ref, k_ref, v_ref, o_ref, *refs, sm_scale, causal, dyn_len, skv, block_q, block_k,
                num_q, num_k, compute_q, compute_k, save_lse, window=0):
    """One query block of one head against one key block; the grid's last axis walks key blocks.

    m (running max) and l (running sum) are kept lane-broadcast [block_q, 128] so that rescaling
    the [block_q, D] accumulator is whole-vreg VALU work with no cross-lane broadcast."""
    lse_ref, (m_ref, l_ref, acc_ref) = (refs[0] if save_lse else None), refs[-3:]
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    length = lens_ref[b] if dyn_len else skv
    q_start, k_start = i * block_q, j * block_k
    may_cut = dyn_len or skv != num_k * block_k or bool(window)

    if may_cut:  # a row's first visible key may come late: start from neutral statistics
        @pl.when(j == 0)
        def _init():
            m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def run(plan, first):
        for chunk in plan:
            rows = slice(chunk.r0, chunk.r0 + chunk.nr)
            q = q_ref[rows, :]
            # Running max m, sum l (both lane-broadcast [nr, 128]) and accumulator [nr, D] stay in
            # vregs across the chunk's key sub-tiles; first=True: no previous values to rescale.
            m, l, acc = (None, None, None) if first else (m_ref[rows, :], l_ref[rows, :], acc_ref[rows, :])
            for sub in chunk.subs:
                k, v = k_ref[sub.c0:sub.c0 + sub.nc, :], v_ref[sub.c0:sub.c0 + sub.nc, :]
                # bf16 x bf16 -> f32 on the MXU; unscaled (the scale multiplies s - m, see LOG2E).
                s = lax.dot_general(q, k, NT, precision=mxu_precision(q, k),
                                    preferred_element_type=jnp.float32)  # [nr, nc]
                if sub.masked:  # -inf, not a finite stand-in: exp gives exact zeros and l, acc stay 0
                    q_pos = q_start + chunk.r0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
                    k_pos = k_start + sub.c0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
                    s = jnp.where(visible(q_pos, k_pos, length, causal, window), s, -jnp.inf)
                # The running max is floored at the finite MASK_VALUE, so s - m is never -inf - -inf.
                m_cur = jnp.max(s, axis=1, keepdims=True)
                m_next = jnp.maximum(m_cur, MASK_VALUE) if m is None else jnp.maximum(m, m_cur)
                m_next = jnp.broadcast_to(m_next, (chunk.nr, LANES))
                p = jnp.exp2((s - lanes(m_next, sub.nc)) * (sm_scale * LOG2E))  # f32 on the EUP
                # p in the input dtype for the MXU (bf16 at full rate); the sum over keys stays f32.
                pv = lax.dot_general(p.astype(v.dtype), v, NN, precision=mxu_precision(v),
                                     preferred_element_type=jnp.float32)
                row_sum = jnp.sum(p, axis=1, keepdims=True)
                if m is None:
                    l, acc = jnp.broadcast_to(row_sum, (chunk.nr, LANES)), pv
                else:
                    alpha = jnp.exp2((m - m_next) * (sm_scale * LOG2E))
                    l = alpha * l + row_sum
                    acc = acc * lanes(alpha, acc.shape[1]) + pv
                m = m_next
            m_ref[rows, :], l_ref[rows, :], acc_ref[rows, :] = m, l, acc

    dispatch_tile(run, q_start=q_start, k_start=k_start, length=length, block_q=block_q, block_k=block_k,
                  num_q=num_q, num_k=num_k, compute_q=compute_q, compute_k=compute_k, causal=causal,
                  may_cut=may_cut, key_block=None if may_cut else j, window=window)

    @pl.when(j == num_k - 1)
    def _finish():
        l = l_ref[...]
        # l == 0 only on rows that never met a visible key (acc is 0 there too): output 0.
        l_safe = jnp.maximum(l, 1e-30)
        inv = _reciprocal(l_safe, approx=True)  # EUP estimate (interpret mode: bf16-accurate) ...
        for _ in range(2):  # ... and two Newton steps (error squares each time): f32-accurate
            inv = inv * (2.0 - l_safe * inv)
        o_ref[...] = (acc_ref[...] * lanes(inv, acc_ref.shape[1])).astype(o_ref.dtype)
        if not save_lse:  # inference: the backward's statistic is not needed
            return
        # The log-sum-exp in the unscaled scores' units, m + log(l) / sm_scale: the backward's
        # exp2((s - lse) * sm_scale * log2 e) is then the forward's probability over l, and exactly
        # 1 for a key that dominates its row (l = 1). +inf on empty rows: the backward's
        # probabilities are exactly 0 there. One XLU transpose per query block stores it lane-dense
        # [1, bq] for the backward.
        lse = jnp.where(l == 0.0, jnp.inf, m_ref[...] + precise_log(l_safe) * (1.0 / sm_scale))
        lse_ref[...] = lse.T[:1, :]


def _forward(q, k, v, lens, *, sm_scale, causal, dyn_len, skv, block_q, block_k, compute_q, compute_k, interpret,
             save_lse, window=0):
    """Padded inputs -> (o [B, H, Sq, D], lse [B, H, 1, Sq] f32 or None); keys at or past `skv` are padding."""
    bsz, heads, sq, d = q.shape
    kv_heads, skv_pad = k.shape[1], k.shape[2]
    group = heads // kv_heads
    nq, nk = sq // block_q, skv_pad // block_k

    def kv_map(b, h, i, j, lens_ref):
        # Clamp to the last needed key block: skipped steps keep the same block index, so no DMA.
        last = last_kv_block(i * block_q + block_q - 1, lens_ref[b] if dyn_len else skv, block_k, nk, causal)
        return b, lax.div(h, group), jnp.maximum(jnp.minimum(j, last), 0), 0

    q_spec = pl.BlockSpec((None, None, block_q, d), lambda b, h, i, j, lens_ref: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, block_k, d), kv_map)
    lse_spec = pl.BlockSpec((None, None, 1, block_q), lambda b, h, i, j, lens_ref: (b, h, 0, i))
    pairs = pair_count(sq, skv, causal, window) * bsz * heads
    # Minimum HBM traffic: q, k, v read once, o (and lse) written once.
    nbytes = 2 * q.size * q.dtype.itemsize + 2 * k.size * k.dtype.itemsize + save_lse * bsz * heads * sq * 4
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if save_lse:
        out_shape.append(jax.ShapeDtypeStruct((bsz, heads, 1, sq), jnp.float32))
    out = pl.pallas_call(
        functools.partial(_fwd_kernel, sm_scale=sm_scale, causal=causal, dyn_len=dyn_len, skv=skv,
                          block_q=block_q, block_k=block_k, num_q=nq, num_k=nk,
                          compute_q=math.gcd(compute_q, block_q), compute_k=math.gcd(compute_k, block_k),
                          save_lse=save_lse, window=window),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(bsz, heads, nq, nk),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=[q_spec, lse_spec][:len(out_shape)],
            scratch_shapes=[pltpu.VMEM((block_q, LANES), jnp.float32), pltpu.VMEM((block_q, LANES), jnp.float32),
                            pltpu.VMEM((block_q, d), jnp.float32)]),
        out_shape=out_shape,
        # q, K, V in; o (and lse) out; the running max, sum and f32 accumulator
        compiler_params=compiler_params(3, 2 * block_bytes((block_q, d), q.dtype.itemsize)
                                        + 2 * block_bytes((block_k, d), k.dtype.itemsize)
                                        + save_lse * block_bytes((1, block_q), 4),
                                        scratch=2 * block_bytes((block_q, LANES), 4) + block_bytes((block_q, d), 4)),
        cost_estimate=pl.CostEstimate(flops=4 * pairs * d, transcendentals=pairs, bytes_accessed=nbytes),
        interpret=interpret,
        name="flash_attention_fwd",
    )(lens, q, k, v)
    return (out[0], out[1]) if save_lse else (out[0], None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, lens, cfg):
    return _forward(q, k, v, lens, **cfg.fwd(), save_lse=False)[0]


def _attention_fwd(q, k, v, lens, cfg):
    o, lse = _forward(q, k, v, lens, **cfg.fwd(), save_lse=True)
    return o, (q, k, v, lens, o, lse)


def _attention_bwd(cfg, res, do):
    q, k, v, lens, o, lse = res
    dq, dk, dv = flash_attention_bwd(q, k, v, lens, o, lse, do, **cfg.bwd())
    return dq, dk, dv, None  # kv_lengths are integers: no cotangent


_attention.defvjp(_attention_fwd, _attention_bwd)


@dataclasses.dataclass(frozen=True)
class _Config:
    """The static settings the custom_vjp carries (hashable)."""

    sm_scale: float
    causal: bool
    dyn_len: bool  # kv_lengths given: key length read per batch row from SMEM
    skv: int  # true key length; keys past it (block padding) are masked
    blocks: tuple  # BlockSizes.resolved()
    interpret: bool
    window: int = 0  # sliding window (causal): query i sees keys i - window < j <= i; 0 = none

    def fwd(self) -> dict:
        bq, bk, cq, ck = self.blocks[0]
        return dict(sm_scale=self.sm_scale, causal=self.causal, dyn_len=self.dyn_len, skv=self.skv,
                    block_q=bq, block_k=bk, compute_q=cq, compute_k=ck, interpret=self.interpret, window=self.window)

    def bwd(self) -> dict:
        return dict(sm_scale=self.sm_scale, causal=self.causal, dyn_len=self.dyn_len, skv=self.skv,
                    blocks=self.blocks[1], interpret=self.interpret, window=self.window)


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale", "block_sizes", "interpret", "window"))
def flash_attention(q, k, v, kv_lengths=None, *, causal: bool = False, sm_scale: float | None = None,
                    block_sizes: BlockSizes | None = None, interpret=False, window: int | None = None):
    """softmax(q @ k.T * sm_scale [masked]) @ v with flash-attention tiling; differentiable in q, k, v.

    q [B, H, Sq, D]; k, v [B, KVH, Skv, D] with H % KVH == 0; kv_lengths [B] ints or None;
    sm_scale (positive) defaults to 1/sqrt(D); `window` (with causal=True): a sliding window, query i sees keys
    i - window < j <= i (Mistral's `sliding_window`). Returns [B, H, Sq, D] in q's dtype."""
    check_shapes(q, k, v, kv_lengths)
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1 or not causal):
        raise ValueError(f"window must be a positive int with causal=True, got window={window!r}, causal={causal}")
    bsz, _, sq, d = q.shape
    skv = k.shape[2]
    blocks = (block_sizes or BlockSizes()).resolved(sq, skv)
    (bq, bk, _, _), (bq_dkv, bk_dkv, bq_dq, bk_dq, _, _) = blocks
    mq, mk = math.lcm(bq, bq_dkv, bq_dq), math.lcm(bk, bk_dkv, bk_dq)
    sq_pad, skv_pad = round_up(sq, mq), round_up(skv, mk)
    if kv_lengths is None:
        lens = jnp.zeros((bsz,), jnp.int32)  # unread: the kernels mask with the static skv
    else:
        lens = jnp.clip(kv_lengths.astype(jnp.int32), 0, skv)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(d)
    if not (math.isfinite(scale) and scale > 0):  # the running max is taken over unscaled scores
        raise ValueError(f"sm_scale must be a positive finite number, got {sm_scale!r}")
    pad = lambda x, n: x if x.shape[2] == n else jnp.pad(x, ((0, 0), (0, 0), (0, n - x.shape[2]), (0, 0)))
    cfg = _Config(scale, bool(causal), kv_lengths is not None, skv, blocks, interpret, window or 0)
    out = _attention(pad(q, sq_pad), pad(k, skv_pad), pad(v, skv_pad), lens, cfg)
    return out[:, :, :sq] if sq_pad != sq else out


# ---------------------------------------------------------------------------------------- reference


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale", "window"))  # one compile, not one per op
def reference(q, k, v, kv_lengths=None, *, causal: bool = False, sm_scale: float | None = None,
              window: int | None = None):
    """Plain JAX attention with the kernel's masking rules. Scores and softmax in f32 (float64 when
    given float64), p rounded to v's dtype before the second matmul as the kernel does; rows with
    no visible key give 0."""
    b, h, sq, d = q.shape
    skv = k.shape[2]
    group = h // k.shape[1]
    acc = jnp.promote_types(q.dtype, jnp.float32)
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=acc) * scale
    ok = jnp.ones((1, 1, sq, skv), bool)
    if causal:
        ok = ok & (jnp.arange(skv)[None, :] <= jnp.arange(sq)[:, None])
    if window:
        ok = ok & (jnp.arange(skv)[None, :] > jnp.arange(sq)[:, None] - window)
    if kv_lengths is not None:
        ok = ok & (jnp.arange(skv)[None, None, None, :] < kv_lengths[:, None, None, None])
    s = jnp.where(ok, s, -jnp.inf)
    m = lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))  # exactly 0 where masked
    denom = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(denom == 0, 1.0, denom)
    out = jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v, preferred_element_type=acc)
    return out.astype(q.dtype)


def xla_attention(q, k, v, *, causal: bool = True, window: int | None = None):
    """Attention as a user writes it without a kernel: f32 scores, mask, f32 softmax, einsum (MHA)."""
    d, sq, skv = q.shape[-1], q.shape[2], k.shape[2]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(d)
    if causal:
        keep = jnp.tril(jnp.ones((sq, skv), bool))
        if window:
            keep = keep & ~jnp.tril(jnp.ones((sq, skv), bool), -window)
        s = jnp.where(keep, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v)


# --------------------------------------------------------------------------------------- the spec


def _case_args(b, h, kvh, sq, skv, d, dtype, q_scale=1.0, lengths=None, exact_logits=False):
    """exact_logits: integer q and k in {-1, 0, 1}, so q.k is an integer below 2^24 and exact in f32
    even at 1e4: the case then tests the online softmax at huge logits, not f32's rounding of them."""
    def make(key):
        kq, kk, kv = jax.random.split(key, 3)
        q = (jax.random.normal(kq, (b, h, sq, d), jnp.float32) * q_scale).astype(dtype)
        k = jax.random.normal(kk, (b, kvh, skv, d), jnp.float32).astype(dtype)
        if exact_logits:
            q, k = jnp.round(q), jnp.round(k).clip(-1, 1)
        v = jax.random.normal(kv, (b, kvh, skv, d), jnp.float32).astype(dtype)
        return (q, k, v) if lengths is None else (q, k, v, jnp.asarray(lengths, jnp.int32))
    return make


def cases() -> list[Case]:
    # 128-row blocks so small shapes still take several grid steps (online softmax across blocks,
    # skipped and diagonal tiles). Interpret mode compiles the forward, both backward kernels and
    # three references per grad case, so the list is short.
    b128 = BlockSizes(block_q=128, block_k=128, compute_q=128, compute_k=128)
    # Unequal tiles: causal tiles on the diagonal at offsets 0 and -128 (trimmed plans), keys on rows in dK/dV.
    mixed = BlockSizes(256, 128, 128, 128, block_q_dkv=128, block_k_dkv=256, block_q_dq=256, block_k_dq=128)
    qkv = (0, 1, 2)
    return [
        Case("f32 causal, GQA 4:2 heads, S=256; tiles 256x128 forward/dQ, 128x256 dK/dV (trimmed diagonal tiles)",
             _case_args(1, 4, 2, 256, 256, 64, jnp.float32), {"causal": True, "block_sizes": mixed}, "float32",
             grad=True, grad_argnums=qkv),
        Case("bf16 non-causal, GQA 4:1 heads, Sq=200 Skv=328 (not block multiples)",
             _case_args(2, 4, 1, 200, 328, 64, jnp.bfloat16), {"block_sizes": b128}, "bfloat16",
             grad=True, grad_argnums=qkv),
        Case("f32 causal, kv_lengths [0, 170]: batch 0 rows fully masked (output 0, grads 0), S=256",
             _case_args(2, 2, 1, 256, 256, 64, jnp.float32, lengths=[0, 170]),
             {"causal": True, "block_sizes": b128}, "float32", grad=True, grad_argnums=qkv),
        Case("f32 large logits (|q.k| * scale ~ 1e4, exact integers), causal, S=200",
             _case_args(1, 2, 2, 200, 200, 64, jnp.float32, q_scale=1e4, exact_logits=True),
             {"causal": True, "block_sizes": b128}, "float32"),
        Case("f32 sliding window of 100 keys, causal, GQA 4:2, S=300 (the band crosses tiles of 128; "
             "tiles before it skipped)", _case_args(1, 4, 2, 300, 300, 64, jnp.float32),
             {"causal": True, "window": 100, "block_sizes": b128}, "float32", grad=True, grad_argnums=qkv),
        Case("bf16 sliding window of 257 keys, causal, default blocks, S=640",
             _case_args(1, 2, 1, 640, 640, 64, jnp.bfloat16), {"causal": True, "window": 257}, "bfloat16"),
        Case("bf16 large logits (|q.k| * scale ~ 1e4), causal, default blocks, S=256, D=128",
             _case_args(1, 2, 2, 256, 256, 128, jnp.bfloat16, q_scale=1e4), {"causal": True}, "bfloat16"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=5e-6, rtol=5e-6, reason=(
        "f32 end to end; the kernel sums exp(s - m) over keys sub-tile by sub-tile and rescales, where the "
        "reference takes one max and one sum: rounding differs at ~1e-7 per term; measured worst 6e-7")),
    "float32.grad": Tolerance(atol=2e-5, rtol=2e-5, reason=(
        "dS = P * (dP - delta) subtracts terms of similar size (delta = rowsum(dO * O)) and dK, dQ sum a few "
        "hundred such products in another order than XLA's; measured worst 3e-6")),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, reason=(
        "bf16 keeps 8 significant bits (one ulp is 2^-7 = 7.8e-3 at 1.0): p is rounded to bf16 for the MXU "
        "before the sum over keys and the output is rounded again; the reference rounds the normalised p, the "
        "kernel the unnormalised one, so outputs differ by an ulp, rarely two (worst over 50 seeds: 1 ulp)")),
    "bfloat16.grad": Tolerance(atol=3e-2, rtol=3e-2, reason=(
        "as bfloat16, plus P and dS rounded to bf16 for the backward matmuls and the gradients rounded to "
        "bf16; dQ and dK sum a few hundred such terms (measured worst 7.8e-3)")),
}

PRODUCTION = (1, 8, 8, 2048, 128)  # B, H, KVH, S, D: one 8-head layer of a 1B-class model, bf16, causal
DEFAULT_BLOCKS = BlockSizes()
# JAX's kernel at its best measured blocks (bench/sweep_flash_attention.py), so the comparison is
# against JAX at its best, not at its 128 default.
JAX_BEST = dict(block_q=1024, block_k_major=1024, block_k=1024)


def _jax_flash(q, k, v):
    """JAX's Pallas flash attention (jax.experimental.pallas.ops.tpu.flash_attention), causal, at JAX_BEST
    blocks. It wants K/V at all H heads: for GQA they are repeated outside its call (none at MHA)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as jfa
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    bq, bkm, bk = JAX_BEST["block_q"], JAX_BEST["block_k_major"], JAX_BEST["block_k"]
    bs = jfa.BlockSizes(block_q=bq, block_k_major=bkm, block_k=bk, block_b=1,
                        block_q_major_dkv=bq, block_k_major_dkv=bkm, block_k_dkv=bk, block_q_dkv=bq,
                        block_k_major_dq=bkm, block_k_dq=bk, block_q_dq=bq)
    return jfa.flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(q.shape[-1]), block_sizes=bs)


def bench(blocks: BlockSizes | None = None) -> BenchSetup:
    bs = blocks if blocks is not None else DEFAULT_BLOCKS
    b, h, kvh, sq, d = PRODUCTION
    args = (jax.ShapeDtypeStruct((b, h, sq, d), jnp.bfloat16), jax.ShapeDtypeStruct((b, kvh, sq, d), jnp.bfloat16),
            jax.ShapeDtypeStruct((b, kvh, sq, d), jnp.bfloat16))

    def kernel(q, k, v):
        return flash_attention(q, k, v, causal=True, block_sizes=bs)

    def xla(q, k, v):
        return xla_attention(q, k, v, causal=True)

    jax_blocks = ", ".join(f"{k}={v}" for k, v in JAX_BEST.items())
    return BenchSetup(shape=f"B{b} H{h} KVH{kvh} S{sq} D{d} bf16 causal", args=args, kernel=kernel, xla=xla,
                      jax_kernel=_jax_flash, jax_name=f"jax.experimental.pallas.ops.tpu.flash_attention ({jax_blocks})",
                      blocks=bs.text())


SPEC = KernelSpec(
    name="flash_attention",
    title="Flash attention (causal or not, grouped-query heads, key padding), forward and backward",
    replaces=("plain attention (scores einsum, mask, f32 softmax, einsum): XLA writes the f32 [B, H, S, S] scores "
              "and probabilities to HBM and reads them back, ~320 MB at B1 H8 S2048 D128 against the 17 MB "
              "minimum, and computes the masked upper triangle of causal attention anyway; libtpu's own "
              "online-softmax rewrite only catches all-bf16 attention"),
    signature=("flash_attention(q, k, v, kv_lengths=None, *, causal=False, sm_scale=None, block_sizes=None, "
               "interpret=False) -> [B, H, Sq, D]"),
    tuned_for="B1 H8 S2048 D128 bf16 causal (blocks from bench/sweep_flash_attention.py on v5e)",
    usage=("from tpudiag.kernels.flash_attention import flash_attention\n"
           "out = flash_attention(q, k, v, causal=True)  # q [B, H, S, D]; k, v [B, KVH, S, D]"),
    kernel=flash_attention,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(BlockSizes(512, 512), BlockSizes(1024, 1024), BlockSizes(2048, 512), BlockSizes(2048, 1024),
                      BlockSizes(2048, 2048, 128, 128), BlockSizes(2048, 2048, 128, 256),
                      BlockSizes(2048, 2048, 256, 256), BlockSizes(2048, 2048, 128, 512)),
    differentiable=True,
)
