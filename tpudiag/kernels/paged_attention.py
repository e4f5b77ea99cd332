"""Paged attention for decode: one query token per sequence against a KV cache stored in pages.

Reads q [B, H, D], k_pages / v_pages [KVH, total_pages, page_size, D], a page table int32
[B, pages_per_seq] and ragged lengths int32 [B]; returns attention output [B, H, D] with
grouped-query heads (H = KVH * G). A sequence of length 0 is a fully masked row: its output is zeros.
Forward only (decode does not train). This module holds the Pallas TPU kernel, its pure-JAX
reference, the plain-JAX version a user writes without a kernel, and the `SPEC` that `verify.py`
and `bench.py` read. It does not autotune: block sizes are chosen by `bench/sweep_paged_attention.py`.

Design (one grid step per sequence, all KV heads at once):
- The page table and lengths are scalar-prefetched into SMEM (`PrefetchScalarGridSpec`), so page
  addresses are known to the scalar core before any vector work.
- K/V pages stay in HBM (`memory_space=pl.ANY`); the kernel DMAs only the pages a sequence's length
  needs, `pages_per_block` pages (all KV heads of a page in one strided DMA) per compute block,
  through a ring of VMEM slots (double-buffered by default), and the first block of the next
  sequence is prefetched while the current one finishes, so DMA latency is hidden across grid steps
  as well as inside one (`page_stream.py`).
- Online softmax in f32 over the blocks; scores never leave VMEM.
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

from tpudiag.kernels.page_stream import (check_slots, check_table, clear_past_length, page_table, state_shape,
                                         stream_pages)
from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import block_bytes, mxu_precision, vmem_limit

# Production shape the default blocks were chosen at (a Llama-3-8B-like decode step).
PROD = dict(batch=32, q_heads=32, kv_heads=8, head_dim=128, page_size=16, context=2048)


@dataclass(frozen=True)
class BlockSizes:
    """How many pages one compute block covers (tokens per block = pages_per_block * page_size).

    More pages per block means fewer, larger DMA batches and fewer online-softmax rescales, at the
    cost of VMEM (slots x K and V x KVH x pages_per_block x page_size x D) and of more wasted
    lanes in a sequence's last, partly filled block.
    """

    pages_per_block: int = 32
    # VMEM slots of the page stream (page_stream.stream_pages): 2 double-buffers, more keep more
    # blocks' DMAs in flight ahead of the compute. On a v5e chip at the bench shape, 3 slots: 357.8
    # us against 357.5 (decode: each block's compute is short beside its DMA, so depth buys nothing).
    slots: int = 2

    def __post_init__(self):
        if not isinstance(self.pages_per_block, int) or self.pages_per_block < 1:
            raise ValueError(f"pages_per_block must be a positive int, got {self.pages_per_block!r}")
        check_slots(self.slots)

    def __str__(self) -> str:
        return f"pages_per_block={self.pages_per_block}" + (f", slots={self.slots}" if self.slots != 2 else "")


# The static model cannot choose here: every candidate (4-32 pages) sits at the HBM floor in its
# estimates (it does not charge the kernel's own DMAs). Timed on a v5e at the production shape
# (`tpudiag kernels tune --target v5e paged_attention`, device time per call): 4 pages 747 us,
# 8 pages 605, 16 pages 545, 32 pages 514. Each page is a 4 KiB DMA per head; more pages a block
# keep more of them in flight. Issued branch-free and waited on once a slot (page_stream), 32 pages
# take 456.5 us and 64 pages 476.0; with V's rows past a length cleared only in the pages that hold
# them (clear_past_length; the whole last block was selected before), 357.4 us, 92% of the floor.
# 32 pages: 2 slots x K and V x 8 KV heads x 512 tokens = 4 MiB of VMEM.
DEFAULT_BLOCKS = BlockSizes(pages_per_block=32)


def _check_shapes(q, k_pages, v_pages, lengths, page_table):
    """Shape errors as ValueError before tracing the kernel."""
    if q.ndim != 3:
        raise ValueError(f"q must be [batch, q_heads, head_dim], got shape {q.shape}")
    if k_pages.ndim != 4:
        raise ValueError(f"k_pages must be [kv_heads, total_pages, page_size, head_dim], got {k_pages.shape}")
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages {k_pages.shape} and v_pages {v_pages.shape} must have the same shape")
    batch, q_heads, head_dim = q.shape
    kv_heads, _, _, kv_dim = k_pages.shape
    if kv_dim != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and of k/v pages ({kv_dim}) differ")
    if q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    check_table(lengths, page_table, batch)


def paged_attention_kernel(lengths_ref, table_ref, q_ref, k_hbm_ref, v_hbm_ref, o_ref,
                           k_buf, v_buf, sems, state_ref, *, sm_scale: float, pages_per_block: int,
                           pages_per_seq: int, batch: int, slots: int):
    """One grid step = one sequence b, all KV heads.

    lengths_ref [B], table_ref [B * pages_per_seq]: SMEM (scalar prefetch).
    q_ref, o_ref: [KVH, G, D] VMEM blocks of sequence b.
    k_hbm_ref, v_hbm_ref: the whole page pools, left in HBM.
    k_buf, v_buf: [slots, KVH, pages_per_block, page_size, D] VMEM, the page stream's slots.
    sems: DMA semaphores [2 (K, V), slots]. state_ref: SMEM `page_stream.state_shape()`, its schedule.
    """
    kv_heads, _, page_size, head_dim = k_hbm_ref.shape
    block_tokens = pages_per_block * page_size

    def page_copies(page, slot, j):
        # One DMA moves a page for all KV heads (a strided copy): a block is 2 * pages_per_block DMAs.
        return (pltpu.make_async_copy(k_hbm_ref.at[:, page], k_buf.at[slot, :, j], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm_ref.at[:, page], v_buf.at[slot, :, j], sems.at[1, slot]))

    def slot_copies(slot):
        return (pltpu.make_async_copy(k_hbm_ref.at[:, pl.ds(0, pages_per_block)], k_buf.at[slot], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm_ref.at[:, pl.ds(0, pages_per_block)], v_buf.at[slot], sems.at[1, slot]))

    q = q_ref[...]  # [KVH, G, D], stays in the input dtype: the MXU takes bf16 at full rate
    groups = q.shape[1]

    def block(i, slot, length, n_blocks, carry):
        m_prev, l_prev, acc_prev = carry
        clear_past_length(v_buf, lambda j: (slot, slice(None), j), i, n_blocks, length, page_size=page_size,
                          pages_per_block=pages_per_block)
        k = k_buf[slot].reshape(kv_heads, block_tokens, head_dim)
        v = v_buf[slot].reshape(kv_heads, block_tokens, head_dim)
        # Scores in f32 from the MXU (bf16 in, f32 accumulate); scale the f32 scores, not q, so
        # no extra bf16 rounding enters before the softmax.
        s = jnp.einsum("hgd,htd->hgt", q, k, precision=mxu_precision(q, k),
                       preferred_element_type=jnp.float32) * sm_scale
        pos = i * block_tokens + lax.broadcasted_iota(jnp.int32, (1, 1, block_tokens), 2)
        valid = pos < length
        s = jnp.where(valid, s, -jnp.inf)  # also discards NaN/garbage read from pages not fetched
        # Every computed block holds >= 1 valid token, so m_new is finite and exp never sees inf-inf.
        m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_new = alpha * l_prev + p.sum(axis=-1, keepdims=True)

        pv = jnp.einsum("hgt,htd->hgd", p.astype(v.dtype), v, precision=mxu_precision(v),
                        preferred_element_type=jnp.float32)
        return m_new, l_new, alpha * acc_prev + pv

    init = (jnp.full((kv_heads, groups, 1), -jnp.inf, jnp.float32),
            jnp.zeros((kv_heads, groups, 1), jnp.float32),
            jnp.zeros((kv_heads, groups, head_dim), jnp.float32))
    _, l_fin, acc = stream_pages(lengths_ref=lengths_ref, table_ref=table_ref, state_ref=state_ref, batch=batch,
                                 pages_per_seq=pages_per_seq, page_size=page_size, pages_per_block=pages_per_block,
                                 page_copies=page_copies, slot_copies=slot_copies, block_compute=block, init=init,
                                 slots=slots)
    # Length 0: no block ran, l = 0 -> zeros (a fully masked row has no softmax to normalise).
    safe_l = jnp.where(l_fin > 0, l_fin, 1.0)
    o_ref[...] = jnp.where(l_fin > 0, acc / safe_l, 0.0).astype(o_ref.dtype)


def _interpret_mode(interpret):
    # The kernel issues its own DMAs and waits on semaphores: the plain interpreter cannot run it,
    # the TPU interpreter (which simulates HBM, VMEM, DMAs and semaphores) can.
    if interpret is True:
        return pltpu.InterpretParams()
    return interpret


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "interpret"))
def paged_attention(q, k_pages, v_pages, lengths, page_table, *, sm_scale: float | None = None,
                    block_sizes: BlockSizes | None = None, interpret=False):
    """Decode attention over a paged KV cache. sm_scale defaults to 1/sqrt(head_dim).

    lengths are clamped to [0, pages_per_seq * page_size]; page-table entries past a sequence's
    length are never read. Shape errors are raised (ValueError) before the kernel is traced.
    """
    _check_shapes(q, k_pages, v_pages, lengths, page_table)
    block_sizes = block_sizes or DEFAULT_BLOCKS
    batch, q_heads, head_dim = q.shape
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    kv_heads, _, page_size, _ = k_pages.shape
    pages_per_seq = page_table.shape[1]
    groups = q_heads // kv_heads
    ppb = min(block_sizes.pages_per_block, pages_per_seq)  # never buffer more than a sequence holds
    slots = block_sizes.slots
    kernel = functools.partial(paged_attention_kernel, sm_scale=sm_scale, pages_per_block=ppb,
                               pages_per_seq=pages_per_seq, batch=batch, slots=slots)
    q4 = q.reshape(batch, kv_heads, groups, head_dim)  # q head h = kv_head * G + g, as in GQA
    qo_spec = pl.BlockSpec((None, kv_heads, groups, head_dim), lambda b, *_: (b, 0, 0, 0))
    itemsize = jnp.dtype(k_pages.dtype).itemsize
    # Honest minimum HBM traffic, assuming full lengths (the lengths are data, unknown at trace
    # time): every page the table references once for K and once for V, q in, out, the scalars.
    # Not the whole pool: total_pages may exceed batch * pages_per_seq.
    kv_bytes = 2 * batch * pages_per_seq * kv_heads * page_size * head_dim * itemsize
    qo_bytes = 2 * q.size * jnp.dtype(q.dtype).itemsize
    tokens = batch * pages_per_seq * page_size
    cost = pl.CostEstimate(flops=4 * tokens * q_heads * head_dim, transcendentals=tokens * q_heads,
                           bytes_accessed=int(kv_bytes + qo_bytes + 4 * (lengths.size + page_table.size)))
    buf = pltpu.VMEM((slots, kv_heads, ppb, page_size, head_dim), k_pages.dtype)
    # q in and o out are pipelined; K and V are streamed by hand through the slots of `buf`.
    vmem = vmem_limit(2 * block_bytes((kv_heads, groups, head_dim), jnp.dtype(q.dtype).itemsize),
                      scratch=2 * block_bytes((slots, kv_heads, ppb, page_size, head_dim), itemsize))
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch,),
            in_specs=[qo_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=qo_spec,
            scratch_shapes=[buf, buf, pltpu.SemaphoreType.DMA((2, slots)), pltpu.SMEM(state_shape(), jnp.int32)]),
        # "arbitrary": steps run in order on one core, which the cross-step prefetch relies on
        # (v5e and v6e have one TensorCore per chip, so nothing is lost to megacore).
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=vmem),
        cost_estimate=cost,
        interpret=_interpret_mode(interpret),
        name="tpudiag_paged_attention",
    )(lengths, page_table.reshape(-1), q4, k_pages, v_pages)
    return out.reshape(batch, q_heads, head_dim)


def reference(q, k_pages, v_pages, lengths, page_table, *, sm_scale: float | None = None, block_sizes=None):
    """Pure JAX: gather every page of the table, mask by length, f32 (or f64) softmax, weighted sum.

    `block_sizes` is accepted and ignored, so verify cases can pass the same params to both."""
    batch, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    pages_per_seq = page_table.shape[1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    ct = jnp.promote_types(q.dtype, jnp.float32)  # f32, or f64 when the oracle runs under x64
    seq = pages_per_seq * page_size
    k = jnp.take(k_pages, page_table, axis=1, mode="clip").reshape(kv_heads, batch, seq, head_dim)
    v = jnp.take(v_pages, page_table, axis=1, mode="clip").reshape(kv_heads, batch, seq, head_dim)
    qg = q.reshape(batch, kv_heads, q_heads // kv_heads, head_dim).astype(ct)
    s = jnp.einsum("bhgd,hbtd->bhgt", qg, k.astype(ct)) * sm_scale
    valid = jnp.arange(seq)[None, :] < jnp.clip(lengths, 0, seq)[:, None]
    s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
    m = s.max(axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    o = jnp.einsum("bhgt,hbtd->bhgd", p, v.astype(ct))
    o = jnp.where(l > 0, o / jnp.where(l > 0, l, 1.0), 0.0)
    return o.reshape(batch, q_heads, head_dim).astype(q.dtype)


def xla_paged_attention(q, k_pages, v_pages, lengths, page_table, *, sm_scale: float | None = None):
    """What a user writes without a kernel: gather the pages, bf16 matmuls with f32 softmax."""
    batch, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    seq = page_table.shape[1] * page_size
    sm_scale = sm_scale or 1.0 / math.sqrt(head_dim)
    k = k_pages[:, page_table].reshape(kv_heads, batch, seq, head_dim)
    v = v_pages[:, page_table].reshape(kv_heads, batch, seq, head_dim)
    qg = q.reshape(batch, kv_heads, q_heads // kv_heads, head_dim)
    s = jnp.einsum("bhgd,hbtd->bhgt", qg, k, preferred_element_type=jnp.float32) * sm_scale
    valid = jnp.arange(seq)[None, :] < lengths[:, None]
    s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    p = jnp.where(lengths[:, None, None, None] > 0, p, 0.0)
    o = jnp.einsum("bhgt,hbtd->bhgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(batch, q_heads, head_dim).astype(q.dtype)


# ----------------------------------------------------------------------------- verify cases

def _make(batch, q_heads, kv_heads, head_dim, page_size, pages_per_seq, lengths, dtype, *,
          q_scale=1.0, spare_pages=3, exact_logits=False):
    """Random q/k/v, a shuffled page table into a pool larger than needed, the given lengths.
    exact_logits: integer q and k in {-1, 0, 1}, so q.k is an integer below 2^24, exact in f32 (with a
    power-of-two `sm_scale`): the case then tests the online softmax at large logits, not f32's
    rounding of them.

    Page-table entries past each sequence's live pages point far outside the pool: the kernel must
    never DMA them (the TPU interpreter raises on out-of-bounds reads).
    """
    lengths = np.asarray(lengths, np.int32)

    def make_args(key):
        kq, kk, kv, kp = jax.random.split(key, 4)
        total = batch * pages_per_seq + spare_pages
        q = (q_scale * jax.random.normal(kq, (batch, q_heads, head_dim), jnp.float32)).astype(dtype)
        k = jax.random.normal(kk, (kv_heads, total, page_size, head_dim), jnp.float32).astype(dtype)
        if exact_logits:
            q, k = jnp.round(q), jnp.round(k).clip(-1, 1)
        v = jax.random.normal(kv, (kv_heads, total, page_size, head_dim), jnp.float32).astype(dtype)
        table = page_table(kp, total, batch, pages_per_seq, lengths, page_size)
        return q, k, v, jnp.asarray(lengths), table

    return make_args


def cases() -> list[Case]:
    """One small shape for all cases (the TPU interpreter retraces per shape, ~8 s each): B3, GQA 8 q
    heads over 2 KV heads, D 128, page 16, 5 pages per sequence, 2 pages per block (so the last block
    of a full sequence is half a block). Lengths vary per case; they are data, not shapes."""
    bs = dict(block_sizes=BlockSizes(pages_per_block=2))
    shape = (3, 8, 2, 128, 16, 5)
    return [
        # lengths not multiples of page_size (16) nor of the block (32 tokens); a full one; 1 token
        Case("ragged lengths f32", _make(*shape, [37, 80, 1], jnp.float32), bs, "float32"),
        Case("ragged lengths bf16", _make(*shape, [17, 79, 64], jnp.bfloat16), bs, "bfloat16"),
        # zero-length sequences are fully masked rows (zeros): first and last sequence of the batch,
        # so the cross-sequence prefetch must skip them at both ends
        Case("zero-length rows f32", _make(*shape, [0, 33, 0], jnp.float32), bs, "float32"),
        # three slots: the prefetch runs two blocks ahead, across the empty sequences
        Case("zero-length rows, 3 slots f32", _make(*shape, [0, 80, 0], jnp.float32),
             dict(block_sizes=BlockSizes(pages_per_block=2, slots=3)), "float32"),
        # q scaled by 1e3: logits ~1e3, the online softmax must subtract the running max. In f32 they
        # are exact (integer q.k times sm_scale 1/8); in bf16 they are rounded on both sides alike
        Case("large logits f32 (exact integers)", _make(*shape, [45, 70, 3], jnp.float32, q_scale=1e3,
                                                         exact_logits=True), dict(bs, sm_scale=0.125), "float32"),
        Case("large logits bf16", _make(*shape, [64, 29, 80], jnp.bfloat16, q_scale=1e3), bs, "bfloat16"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=1e-5, rtol=1e-5, reason=(
        "f32 end to end: the kernel's online softmax over blocks of pages against the reference's one "
        "max and one sum; over 121 seeds (jax 0.10.2) and 41 (0.12) the worst absolute error against "
        "float64 was 1.2e-6. The large-logit case's scores are exact (integer q.k times 1/8): with "
        "rounded scores ~1e3, f32's own rounding of q.k moves the probabilities by up to ~1e-3 on both "
        "sides alike, which no kernel tolerance should absorb")),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, reason=(
        "the probabilities are rounded to bf16 (8-bit mantissa, 2^-8 ~ 4e-3 relative) before the "
        "P @ V matmul and the output is bf16; sums of up to a few hundred such terms")),
}


# ----------------------------------------------------------------------------- bench

def _prod_args():
    B, H, KVH, D = PROD["batch"], PROD["q_heads"], PROD["kv_heads"], PROD["head_dim"]
    P = PROD["page_size"]
    pps = PROD["context"] // P
    sds = jax.ShapeDtypeStruct
    return (sds((B, H, D), jnp.bfloat16), sds((KVH, B * pps, P, D), jnp.bfloat16),
            sds((KVH, B * pps, P, D), jnp.bfloat16), sds((B,), jnp.int32), sds((B, pps), jnp.int32))


# JAX's kernel, best of the sweep in bench/sweep_paged_attention.py (pages_per_compute_block).
JAX_PAGES_PER_COMPUTE_BLOCK = 8


def _jax_kernel(q, k_pages, v_pages, lengths, page_table):
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as jax_paged_attention

    # JAX's kernel does not scale q: pass it pre-scaled, as its callers do.
    q = (q.astype(jnp.float32) / math.sqrt(q.shape[-1])).astype(q.dtype)
    return jax_paged_attention(q, k_pages, v_pages, lengths, page_table,
                               pages_per_compute_block=JAX_PAGES_PER_COMPUTE_BLOCK)


def bench(blocks: BlockSizes | None = None) -> BenchSetup:
    blocks = blocks or DEFAULT_BLOCKS

    def kernel(q, k, v, lengths, table):
        return paged_attention(q, k, v, lengths, table, block_sizes=blocks)

    p = PROD
    shape = (f"B{p['batch']} H{p['q_heads']} KVH{p['kv_heads']} D{p['head_dim']} page{p['page_size']} "
             f"ctx{p['context']} bf16 (full lengths)")
    return BenchSetup(shape=shape, args=_prod_args(), kernel=kernel, xla=xla_paged_attention,
                      jax_kernel=_jax_kernel,
                      jax_name=f"jax paged_attention (pages_per_compute_block={JAX_PAGES_PER_COMPUTE_BLOCK})",
                      blocks=str(blocks))


SPEC = KernelSpec(
    name="paged_attention",
    title="Decode attention over a paged KV cache (GQA, ragged lengths), DMAing only the live pages",
    replaces=("Without a kernel the page table becomes an XLA gather that materialises every sequence's "
              "K and V contiguously in HBM (write + read back, ~3x the cache bytes), then the scores go "
              "through HBM again for the masked softmax; decode is HBM-bound so every extra pass costs."),
    signature=("paged_attention(q, k_pages, v_pages, lengths, page_table, *, sm_scale=None, "
               "block_sizes=None, interpret=False)"),
    tuned_for=("B32 H32 KVH8 D128 page_size 16, context 2048 (128 pages per sequence), bf16; "
               "pages_per_block=32 (timed on a v5e: kernels tune)"),
    usage=("from tpudiag.kernels.paged_attention import paged_attention\n"
           "out = paged_attention(q, k_pages, v_pages, lengths, page_table)  # q [B,H,D] -> [B,H,D]"),
    kernel=paged_attention,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=tuple(BlockSizes(n) for n in (4, 8, 16, 32)),
    differentiable=False,
)
