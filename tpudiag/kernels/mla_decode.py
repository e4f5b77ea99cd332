"""Multi-head latent attention (MLA) for decode, DeepSeek V2/V3 style, over a paged cache.

MLA caches one compressed latent per token, c [L] (kv_lora_rank, 512 in DeepSeek V3), and one
decoupled RoPE key, r [R] (qk_rope_head_dim, 64), shared by every head. At decode the key and value
up-projections are absorbed into the query and the output (W_UK into q, W_UV applied after), so each
head attends over the latents directly:

    s[b, h, t] = (q_latent[b, h] . c[b, t] + q_rope[b, h] . r[b, t]) * sm_scale
    out[b, h]  = softmax_t(s[b, h, t < length[b]]) @ c[b, t]            [B, H, L]

Reads q [B, H, W] (the absorbed latent query, then the RoPE query), one page pool kv_pages
[P, page_size, W] (each token's latent, then its RoPE key, one row a token), a page table int32
[B, pages_per_seq] and lengths int32 [B]; `latent` (L) is static. W is a multiple of 128: the RoPE
part is zero-padded to 128 lanes (W = 512 + 128 for DeepSeek V3), as tpu-inference's MLA cache is.
A row width the lanes do not divide (576) or a separate [P, page_size, 64] RoPE pool is laid out by
the TPU compiler otherwise than Mosaic reads it, and the whole pool is copied before every call
(measured on v6e: 645k cycles for a 302 MB pool, against the kernel's 85k). A sequence of length 0
is a fully masked row: zeros. Forward only (decode does not train).

Design (as `paged_attention`, one grid step per sequence, all heads at once): the page table and
lengths are scalar-prefetched into SMEM; the pool stays in HBM and the kernel DMAs only the pages
a sequence's length needs, `pages_per_block` pages per compute block, through a ring of VMEM slots
that runs ahead into the next sequences (`page_stream.py`); online softmax in f32. Each page is one
DMA: large pages (tpu-inference's 1024 tokens) stream at HBM speed, 16-token pages at the DMA
engine's rate of starts (`default_blocks`).
Each block is read once and used twice: all L + R columns as the keys, the first L as the values;
what makes MLA's cache (640 values a token for all heads) cheap to stream.

Holds the kernel, the pure-JAX reference, the plain-JAX version users write, and the `SPEC`.
"""

from __future__ import annotations

import functools
import math
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.paged_attention import BlockSizes, _interpret_mode  # pages per block, as there
from tpudiag.kernels.page_stream import check_table, clear_past_length, page_table, state_shape, stream_pages
from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance, at_shape
from tpudiag.kernels.tiling import block_bytes, mxu_precision, vmem_limit

# tpu-inference 0.32's MLA page size on TPU (`PallasMLAttentionBackend.get_page_size`): tokens a page.
TPU_PAGE = 1024
# Production shape: DeepSeek V3's MLA (128 heads, kv_lora_rank 512, qk_rope_head_dim 64; softmax
# scale 1/sqrt(192)), a decode batch of 32 at context 2048 in pages of TPU_PAGE tokens, in a pool
# of 4x the pages the batch uses (302 MB: a serving engine's pool is shared and larger than VMEM; a
# pool that fits, 75 MB, is copied whole into VMEM by the TPU compiler, which a real one never is).
PROD = dict(batch=32, heads=128, latent=512, rope=64, page_size=TPU_PAGE, context=2048, pool=4)
_LANES = 128
PROD_SCALE = 1.0 / math.sqrt(192)

# Tokens a compute block covers by default (pages_per_block = BLOCK_TOKENS // page_size, at least 1).
BLOCK_TOKENS = 2048
# Pages of at least this many tokens are long DMAs and stream through 3 VMEM slots by default;
# smaller pages through 2 (`default_blocks`).
LARGE_PAGE = 256


def default_blocks(page_size: int) -> BlockSizes:
    """The blocks `block_sizes=None` takes for pages of `page_size` tokens.

    Each page is one DMA, and the v5e's DMA engine starts about one every 45 ns whatever its size
    up to ~32 KiB (the calibration's `pallas_dma_16kib`: 47.6 ns), so pages of 16 rows of 640 bf16
    (20 KiB) arrive at no more than ~440 GB/s. On a v5e chip at the bench shape (device time; pages
    of P tokens, N a block, S slots; the floor 113.9 us):

        P16    N64 S2 211.4 us   N64 S3 232.4   N128 S2 202.5
        P64    N16 S2 155.1      N16 S3 162.2   N32 S2 146.2
        P256   N4 S2 150.0       N4 S3 141.2    N8 S3 133.4
        P512   N2 S2 149.8
        P1024  N1 S2 149.3       N1 S3 136.9    N1 S4 137.4    N2 S3 129.9 (88% of the floor)"""
    return BlockSizes(pages_per_block=max(1, BLOCK_TOKENS // page_size), slots=3 if page_size >= LARGE_PAGE else 2)


def padded_width(latent: int, rope: int) -> int:
    """The cache row width for a latent of `latent` and a RoPE key of `rope`: the RoPE part padded
    with zeros to whole 128-lane tiles (DeepSeek V3: 512 + 64 -> 640)."""
    return latent + -(-rope // _LANES) * _LANES


def _check_shapes(q, kv_pages, lengths, page_table, latent):
    if q.ndim != 3:
        raise ValueError(f"q must be [B, H, W], got {q.shape}")
    if kv_pages.ndim != 3:
        raise ValueError(f"kv_pages must be [pages, page_size, W], got {kv_pages.shape}")
    if kv_pages.shape[2] != q.shape[2]:
        raise ValueError(f"q's last dim ({q.shape[2]}) and kv_pages' ({kv_pages.shape[2]}) differ")
    if q.shape[2] % _LANES:
        raise ValueError(f"the row width L + R ({q.shape[2]}) must be a multiple of {_LANES}: pad the RoPE "
                         f"part with zeros (padded_width gives it)")
    if not 0 < latent < q.shape[2]:
        raise ValueError(f"latent must be between 0 and L + R = {q.shape[2]} (the RoPE part follows it), got {latent}")
    batch = q.shape[0]
    check_table(lengths, page_table, batch)


def mla_decode_kernel(lengths_ref, table_ref, q_ref, kv_hbm_ref, o_ref, kv_buf, sems, state_ref, *,
                      sm_scale: float, latent: int, pages_per_block: int, pages_per_seq: int, batch: int,
                      slots: int):
    """One grid step = one sequence b, all heads.

    lengths_ref [B], table_ref [B * pages_per_seq]: SMEM (scalar prefetch).
    q_ref [H, W], o_ref [H, L]: VMEM blocks of sequence b. kv_hbm_ref: the page pool, left in HBM.
    kv_buf [slots, pages_per_block, page_size, W]: the page stream's slots. sems: DMA semaphores
    [slots]. state_ref: SMEM `page_stream.state_shape()`, its schedule.
    """
    _, page_size, width = kv_hbm_ref.shape
    block_tokens = pages_per_block * page_size

    def page_copies(page, slot, j):
        return (pltpu.make_async_copy(kv_hbm_ref.at[page], kv_buf.at[slot, j], sems.at[slot]),)

    def slot_copies(slot):
        return (pltpu.make_async_copy(kv_hbm_ref.at[pl.ds(0, pages_per_block)], kv_buf.at[slot], sems.at[slot]),)

    q = q_ref[...]  # [H, W] in the input dtype
    heads = q.shape[0]

    def block(i, slot, length, n_blocks, carry):
        m_prev, l_prev, acc_prev = carry
        clear_past_length(kv_buf, lambda j: (slot, j), i, n_blocks, length, page_size=page_size,
                          pages_per_block=pages_per_block)
        kv = kv_buf[slot].reshape(block_tokens, width)
        s = jnp.einsum("hw,tw->ht", q, kv, precision=mxu_precision(q, kv),
                       preferred_element_type=jnp.float32) * sm_scale
        pos = i * block_tokens + lax.broadcasted_iota(jnp.int32, (1, block_tokens), 1)
        s = jnp.where(pos < length, s, -jnp.inf)  # also discards whatever unfetched rows hold
        m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))  # finite: each block has a valid token
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_new = alpha * l_prev + p.sum(axis=-1, keepdims=True)
        c = kv[:, :latent]

        pv = jnp.dot(p.astype(c.dtype), c, precision=mxu_precision(c), preferred_element_type=jnp.float32)
        return m_new, l_new, alpha * acc_prev + pv

    init = (jnp.full((heads, 1), -jnp.inf, jnp.float32), jnp.zeros((heads, 1), jnp.float32),
            jnp.zeros((heads, latent), jnp.float32))
    _, l_fin, acc = stream_pages(lengths_ref=lengths_ref, table_ref=table_ref, state_ref=state_ref, batch=batch,
                                 pages_per_seq=pages_per_seq, page_size=page_size, pages_per_block=pages_per_block,
                                 page_copies=page_copies, slot_copies=slot_copies, block_compute=block, init=init,
                                 slots=slots)
    safe_l = jnp.where(l_fin > 0, l_fin, 1.0)
    o_ref[...] = jnp.where(l_fin > 0, acc / safe_l, 0.0).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("latent", "sm_scale", "block_sizes", "interpret"))
def mla_decode(q, kv_pages, lengths, page_table, *, latent: int = 512, sm_scale: float | None = None,
               block_sizes: BlockSizes | None = None, interpret=False):
    """MLA decode over a paged cache of [latent | RoPE key] rows -> [B, H, latent] (the latent-space
    output, before W_UV). sm_scale defaults to 1/sqrt(L + R); DeepSeek's is 1/sqrt(qk_nope_head_dim
    + R) times its YaRN factor, passed explicitly. Shape errors raise ValueError before tracing."""
    _check_shapes(q, kv_pages, lengths, page_table, latent)
    batch, heads, width = q.shape
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(width)
    _, page_size, _ = kv_pages.shape
    block_sizes = block_sizes or default_blocks(page_size)
    pages_per_seq = page_table.shape[1]
    ppb = min(block_sizes.pages_per_block, pages_per_seq)
    slots = block_sizes.slots
    kernel = functools.partial(mla_decode_kernel, sm_scale=sm_scale, latent=latent, pages_per_block=ppb,
                               pages_per_seq=pages_per_seq, batch=batch, slots=slots)
    itemsize = jnp.dtype(kv_pages.dtype).itemsize
    qb = jnp.dtype(q.dtype).itemsize
    # Minimum HBM traffic at full lengths: every referenced page once, q in, out.
    tokens = batch * pages_per_seq * page_size
    cost = pl.CostEstimate(flops=2 * tokens * heads * (width + latent), transcendentals=tokens * heads,
                           bytes_accessed=int(tokens * width * itemsize + (q.size + batch * heads * latent) * qb
                                              + 4 * (lengths.size + page_table.size)))
    vmem = vmem_limit(2 * (block_bytes((heads, width), qb) + block_bytes((heads, latent), qb)),
                      scratch=block_bytes((slots, ppb, page_size, width), itemsize)
                      + 3 * block_bytes((heads, ppb * page_size), 4) + block_bytes((heads, latent), 4))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((batch, heads, latent), q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch,),
            in_specs=[pl.BlockSpec((None, heads, width), lambda b, *_: (b, 0, 0)), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((None, heads, latent), lambda b, *_: (b, 0, 0)),
            scratch_shapes=[pltpu.VMEM((slots, ppb, page_size, width), kv_pages.dtype),
                            pltpu.SemaphoreType.DMA((slots,)), pltpu.SMEM(state_shape(), jnp.int32)]),
        # "arbitrary": steps run in order on one core, which the cross-step prefetch relies on.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=vmem),
        cost_estimate=cost,
        interpret=_interpret_mode(interpret),
        name="tpudiag_mla_decode",
    )(lengths, page_table.reshape(-1), q, kv_pages)


def _gather(pages, page_table):
    """[P, page, W] pages by a [B, pages_per_seq] table -> [B, pages_per_seq * page, W]."""
    b, pps = page_table.shape
    return jnp.take(pages, page_table, axis=0, mode="clip").reshape(b, pps * pages.shape[1], pages.shape[2])


def reference(q, kv_pages, lengths, page_table, *, latent: int = 512, sm_scale: float | None = None,
              block_sizes=None):
    """Pure JAX in f32 (f64 under x64): gather the pages, mask by length, softmax, weighted sum of
    the latents. `block_sizes` is accepted and ignored."""
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[2])
    ct = jnp.promote_types(q.dtype, jnp.float32)
    kv = _gather(kv_pages, page_table).astype(ct)
    s = jnp.einsum("bhw,btw->bht", q.astype(ct), kv) * sm_scale
    seq = kv.shape[1]
    valid = jnp.arange(seq)[None, :] < jnp.clip(lengths, 0, seq)[:, None]
    s = jnp.where(valid[:, None, :], s, -jnp.inf)
    m = s.max(axis=-1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    o = jnp.einsum("bht,btl->bhl", p, kv[..., :latent])
    return jnp.where(l > 0, o / jnp.where(l > 0, l, 1.0), 0.0).astype(q.dtype)


def xla_mla_decode(q, kv_pages, lengths, page_table, *, latent: int = 512, sm_scale: float = PROD_SCALE):
    """What a JAX serving stack writes without a kernel: gather the pages, bf16 matmuls with an f32
    softmax."""
    kv = _gather(kv_pages, page_table)
    s = jnp.einsum("bhw,btw->bht", q, kv, preferred_element_type=jnp.float32) * sm_scale
    valid = jnp.arange(kv.shape[1])[None, :] < lengths[:, None]
    p = jax.nn.softmax(jnp.where(valid[:, None, :], s, -jnp.inf), axis=-1)
    p = jnp.where(lengths[:, None, None] > 0, p, 0.0)
    return jnp.einsum("bht,btl->bhl", p.astype(kv.dtype), kv[..., :latent],
                      preferred_element_type=jnp.float32).astype(q.dtype)


# ----------------------------------------------------------------------------- verify cases

def _make(batch, heads, latent, rope, page_size, pages_per_seq, lengths, dtype, *, q_scale=1.0, spare_pages=3):
    """Random queries and pool, a shuffled page table into a pool larger than needed; entries past
    each sequence's live pages point outside the pool (the kernel must never DMA them)."""
    lengths = np.asarray(lengths, np.int32)

    def make_args(key):
        kq, kc, kp = jax.random.split(key, 3)
        total = batch * pages_per_seq + spare_pages
        pad = ((0, 0), (0, 0), (0, padded_width(latent, rope) - latent - rope))  # zeros past the RoPE part
        q = jnp.pad(q_scale * jax.random.normal(kq, (batch, heads, latent + rope), jnp.float32), pad).astype(dtype)
        kv = jnp.pad(jax.random.normal(kc, (total, page_size, latent + rope), jnp.float32), pad).astype(dtype)
        return q, kv, jnp.asarray(lengths), page_table(kp, total, batch, pages_per_seq, lengths, page_size)

    return make_args


def cases() -> list[Case]:
    """Small shapes (the TPU interpreter retraces per shape): B3, 16 heads, latent 256 + RoPE 64,
    page 16, 5 pages a sequence, 2 pages a block; and pages of 256, 3 a sequence, in the large-page
    default's blocks (a sequence a block here, 3 slots across sequences). Lengths are data: ragged,
    full, one token, zero."""
    params = dict(latent=256, block_sizes=BlockSizes(pages_per_block=2))
    shape = (3, 16, 256, 64, 16, 5)
    big = dict(latent=256, block_sizes=default_blocks(LARGE_PAGE))
    return [
        Case("ragged lengths f32", _make(*shape, [37, 80, 1], jnp.float32), params, "float32"),
        Case("pages of 256, the large-page stream f32", _make(3, 16, 256, 64, LARGE_PAGE, 3, [300, 768, 1],
                                                               jnp.float32), big, "float32"),
        Case("ragged lengths bf16", _make(*shape, [17, 79, 64], jnp.bfloat16), params, "bfloat16"),
        Case("zero-length rows f32", _make(*shape, [0, 33, 0], jnp.float32), params, "float32"),
        Case("large logits f32", _make(*shape, [45, 70, 3], jnp.float32, q_scale=30.0), params, "float32"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=1e-3, rtol=1e-3, reason=(
        "f32 end to end; the large-logit case has scores ~1e2 (q x30 over 320 dims, scaled by "
        "1/sqrt(384)) whose f32 rounding passes through exp, as for paged_attention")),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, reason=(
        "the probabilities are rounded to bf16 before the P @ C matmul and the output is bf16; sums "
        "of up to a few hundred such terms")),
}


# ----------------------------------------------------------------------------- bench

def _prod_args(p: dict):
    pps = p["context"] // p["page_size"]
    width = padded_width(p["latent"], p["rope"])
    sds = jax.ShapeDtypeStruct
    return (sds((p["batch"], p["heads"], width), jnp.bfloat16),
            sds((p["pool"] * p["batch"] * pps, p["page_size"], width), jnp.bfloat16),
            sds((p["batch"],), jnp.int32), sds((p["batch"], pps), jnp.int32))


def bench(blocks: BlockSizes | None = None, shape: dict | None = None) -> BenchSetup:
    """At the production shape by default; `shape` replaces fields of PROD (`batch`, `context`,
    `heads`: 16 for DeepSeek V3's 128 heads at tensor parallelism 8, say)."""
    p = at_shape(PROD, shape)
    blocks = blocks or default_blocks(p["page_size"])
    scale = PROD_SCALE  # DeepSeek V3's 1/sqrt(128 + 64); a scale changes no cycles

    def kernel(q, kv, lengths, table):
        return mla_decode(q, kv, lengths, table, latent=p["latent"], sm_scale=scale, block_sizes=blocks)

    def xla(q, kv, lengths, table):
        return xla_mla_decode(q, kv, lengths, table, latent=p["latent"], sm_scale=scale)

    shape_text = (f"B{p['batch']} H{p['heads']} latent{p['latent']} rope{p['rope']} (rows of "
                  f"{padded_width(p['latent'], p['rope'])}) page{p['page_size']} "
                  f"ctx{p['context']} bf16 (full lengths)")
    return BenchSetup(shape=shape_text, args=_prod_args(p), kernel=kernel, xla=xla, blocks=str(blocks))


SPEC = KernelSpec(
    name="mla_decode",
    title="MLA decode (DeepSeek V3): absorbed queries over a paged latent + RoPE-key cache, latents read once",
    replaces=("Without a kernel the page table becomes a gather that writes every sequence's cache rows "
              "contiguously to HBM and reads them back twice (scores, then the weighted sum)."),
    signature=("mla_decode(q, kv_pages, lengths, page_table, *, latent=512, sm_scale=None, "
               "block_sizes=None, interpret=False)"),
    tuned_for=("B32 H128 latent 512 rope 64 (rows of 640), page_size 1024, context 2048, bf16; pages_per_block=2, "
               "slots=3 (`default_blocks`: 2048-token blocks, 3 slots for pages of 256 tokens or more, else 2)"),
    usage=("from tpudiag.kernels.mla_decode import mla_decode\n"
           "# q [B,H,640] = absorbed latent query | RoPE query | zeros; kv_pages [P,page,640] likewise\n"
           "out = mla_decode(q, kv_pages, lengths, page_table, latent=512, sm_scale=scale)  # -> [B,H,512]"),
    kernel=mla_decode,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(BlockSizes(2, slots=3), BlockSizes(1, slots=3), BlockSizes(2), BlockSizes(2, slots=4)),
    differentiable=False,
)
