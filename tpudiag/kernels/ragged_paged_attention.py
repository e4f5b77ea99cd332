"""Ragged paged attention: one batch mixing prefill chunks and decode tokens over a paged KV cache.

A serving step's batch is ragged: sequence s brings q_len[s] new tokens (a prefill chunk of
hundreds, or one decode token), concatenated into q [T, H, D] at rows cu_q_lens[s] to
cu_q_lens[s + 1]. Its KV cache already holds kv_lens[s] positions, the new tokens' included (they
are its last q_len[s]), in pages of a shared pool. New token i of s sits at position
kv_lens[s] - q_len[s] + i and attends causally to the positions up to its own; optionally only the
last `sliding_window` of them, and with the scores soft-capped (cap * tanh(s / cap)). Grouped-query
heads: H = KVH * G. Rows past cu_q_lens[num_seqs] (the batch's padding) are zeros. Forward only.

`write_kv_pages` writes the step's new K/V into their pages first, by a scatter into the pool (in
place when the caller donates the pool, as a serving engine does); `ragged_paged_attention` then
reads the pool. This module holds the Pallas TPU kernel, its pure-JAX reference, the plain-JAX
version users write without a kernel, and the `SPEC`.

Design:
- The batch is cut into q blocks of `q_block` tokens (aligned, so they are ordinary Pallas blocks,
  laid out [KVH, tokens * G, D] so each KV head's queries are rows of one matmul). A work item is one
  (q block, sequence) pair that overlaps; the items, in token order, are the grid. Consecutive
  items of one q block keep its q and output blocks in VMEM, each writing only its own rows.
- Each item streams its sequence's live pages up to the causal end of its rows (page_stream.py:
  page DMAs through a ring of six VMEM slots, the next items' first blocks started under the
  current one's last: a prefill block's compute outlasts its own DMA, and the ring keeps the DMA
  engine busy under it), and computes only the `q_sub`-token pieces of the block its rows fall in; an item whose rows fit in
  one 16-row tile (a decode token) computes that tile alone, not a whole piece.
- V's rows past a sequence's length are zeroed in VMEM only in the last block's pages that hold
  any (0 * NaN is NaN in P @ V, and a pool's unwritten positions may hold anything).
- Online softmax in f32 with the state in VMEM scratch. Masked scores are -inf and the running max
  starts at a finite stand-in, so a row whose first blocks fall outside its window stays finite. A
  block every row of a piece sees whole (a decode token's full blocks, a prefill piece's blocks
  before its first token) skips the mask: no position iotas, compares or selects.
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

from tpudiag.kernels.flash_attention_bwd import LOG2E
from tpudiag.kernels.paged_attention import _interpret_mode
from tpudiag.kernels.page_stream import check_slots, clear_past_length, state_shape, stream_pages
from tpudiag.kernels.rpa_schedule import ItemTable, step_work, work_items
from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance, at_shape
from tpudiag.kernels.tiling import block_bytes, mxu_precision, vmem_limit

# Production shape: Llama 3 8B heads (32 q, 8 KV, D 128), pages of 128 tokens (the page sizes JAX's
# kernel is tuned for: 128 and 256), a 2048-position table; one serving step of 64 sequences: one prefill chunk of 512 tokens (positions 1536-2047)
# and 63 decode tokens at context 2048, 576 token rows (the last one padding).
PROD = dict(q_heads=32, kv_heads=8, head_dim=128, page_size=128, context=2048, seqs=64, prefill=512,
            tokens=576)
_LANES = 128
_MASKED = -0.7 * float(np.finfo(np.float32).max)  # finite: a fully masked block leaves no NaN


@dataclass(frozen=True)
class BlockSizes:
    """q_block: tokens a q block holds (one Pallas block of the batch); q_sub: tokens a computed
    piece holds (an item computes the pieces its rows fall in; q_block is a multiple of it);
    pages_per_block: pages a KV compute block covers, as in paged_attention."""

    # On a v5e chip at the bench shape (device time, bench/chip_sweep.py): q_sub 16 -> 32 and 4 -> 8
    # pages a block took 1,590 -> 1,381 us; with decode tokens computed as one 16-row tile and V's
    # tail cleared only where a length ends inside the block, 847 us (JAX's kernel: 900). There,
    # q_sub 64 or 16 pages a block with the heads taken one or two at a time: 859-951 us. With whole
    # blocks unmasked, 836 us; then q_sub 64: 864, 16 pages: 2,485, q blocks of 256: 4,362 and up.
    # slots: the page stream's depth. A prefill block's compute outlasts its own DMA; with more
    # blocks in flight the DMA engine runs on under it: 2 slots 836.1 us, 3 831.2, 4 825.7, 5 820.2,
    # 6 816.0, 8 816.0 (8 slots of 4 pages: 963.3).
    q_block: int = 128
    q_sub: int = 32
    pages_per_block: int = 8
    slots: int = 6

    def __post_init__(self):
        check_slots(self.slots)
        for name in ("q_block", "q_sub", "pages_per_block"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.q_block % self.q_sub:
            raise ValueError(f"q_block ({self.q_block}) must be a multiple of q_sub ({self.q_sub})")

    def __str__(self) -> str:
        return (f"q_block={self.q_block}, q_sub={self.q_sub}, pages_per_block={self.pages_per_block}"
                + f", slots={self.slots}")


DEFAULT_BLOCKS = BlockSizes()
# A decode batch (at most one new token a sequence) in q blocks of 16: 128 would pad a token to 128
# rows. One prefill chunk in q blocks of 256 computed 128 at a time: each q block reads the pages
# before its causal end again, so blocks of 128 leave an 8192-token chunk HBM-bound (v6e 1.31M
# cycles against 1.05M, its compute floor; bench/sweep_serving.py). 512 runs the static-profile
# compile out of VMEM with 8 KV heads.
DECODE_BLOCKS = BlockSizes(q_block=16, q_sub=16, pages_per_block=4)
PREFILL_BLOCKS = BlockSizes(q_block=256, q_sub=128, pages_per_block=4)


def default_blocks(tokens: int, seqs: int) -> BlockSizes:
    """The blocks `block_sizes=None` takes for a batch of `tokens` rows over `seqs` sequences, from
    the shapes alone (the lengths are data): a decode batch (tokens <= seqs) `DECODE_BLOCKS`, one
    sequence of at least 256 tokens `PREFILL_BLOCKS`, a mixed batch `DEFAULT_BLOCKS`."""
    if tokens <= seqs:
        return DECODE_BLOCKS
    if seqs == 1 and tokens >= PREFILL_BLOCKS.q_block:
        return PREFILL_BLOCKS
    return DEFAULT_BLOCKS


def _check_shapes(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs):
    """Shape and dtype errors as ValueError before tracing the kernel."""
    if q.ndim != 3:
        raise ValueError(f"q must be [tokens, q_heads, head_dim], got shape {q.shape}")
    if k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages and v_pages must both be [kv_heads, total_pages, page_size, head_dim], got "
                         f"{k_pages.shape} and {v_pages.shape}")
    if k_pages.shape[3] != q.shape[2]:
        raise ValueError(f"head_dim of q ({q.shape[2]}) and of k/v pages ({k_pages.shape[3]}) differ")
    if q.shape[1] % k_pages.shape[0]:
        raise ValueError(f"q_heads ({q.shape[1]}) must be a multiple of kv_heads ({k_pages.shape[0]})")
    seqs = kv_lens.shape[0] if kv_lens.ndim == 1 else -1
    want = {"kv_lens": (kv_lens, (seqs,)), "cu_q_lens": (cu_q_lens, (seqs + 1,)), "num_seqs": (num_seqs, (1,))}
    if page_table.ndim != 2 or page_table.shape[0] != seqs:
        raise ValueError(f"page_table must be [seqs={seqs}, pages_per_seq], got {page_table.shape}")
    for name, (a, shape) in {**want, "page_table": (page_table, page_table.shape)}.items():
        if a.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
        if a.dtype != jnp.int32:
            raise ValueError(f"{name} must be int32, got {a.dtype}")


def _token_seqs(cu_q_lens, num_seqs, tokens: int):
    """(sequence of each token row, whether the row is live: below cu_q_lens[num_seqs])."""
    t = jnp.arange(tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], t, side="right", method="compare_all"), 0,
                   cu_q_lens.shape[0] - 2)
    return seq.astype(jnp.int32), t < lax.dynamic_index_in_dim(cu_q_lens, num_seqs[0], keepdims=False)


def write_kv_pages(k_pages, v_pages, new_k, new_v, kv_lens, page_table, cu_q_lens, num_seqs):
    """The step's new keys and values [T, KVH, D] scattered into their pages: token i of sequence s
    goes to position kv_lens[s] - q_len[s] + i. Rows past cu_q_lens[num_seqs] are dropped. Returns
    (k_pages, v_pages); in place where the caller donates them."""
    kv_heads, total, page_size, _ = k_pages.shape
    tokens = new_k.shape[0]
    seq, live = _token_seqs(cu_q_lens, num_seqs, tokens)
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    pos = kv_lens[seq] - q_len + (jnp.arange(tokens, dtype=jnp.int32) - cu_q_lens[seq])
    page = jnp.take_along_axis(page_table[seq], (pos // page_size)[:, None], axis=1, mode="clip")[:, 0]
    page = jnp.where(live, page, total)  # out of the pool: dropped by the scatter
    slot = pos % page_size
    k_pages = k_pages.at[:, page, slot].set(jnp.swapaxes(new_k, 0, 1).astype(k_pages.dtype), mode="drop")
    v_pages = v_pages.at[:, page, slot].set(jnp.swapaxes(new_v, 0, 1).astype(v_pages.dtype), mode="drop")
    return k_pages, v_pages


def _row_token(rows: int, groups: int):
    """[1, rows, 1]: the token of each row of a piece (row r is token r // groups). A shift where
    groups is a power of two: Mosaic's vector integer division asks for the TPU it runs on, which
    a compile on another machine does not have."""
    r = lax.broadcasted_iota(jnp.int32, (1, rows, 1), 1)
    if groups & (groups - 1) == 0:
        return lax.shift_right_logical(r, jnp.int32(groups.bit_length() - 1))
    return lax.div(r, jnp.int32(groups))


def ragged_paged_attention_kernel(items_ref, table_ref, q_ref, k_hbm_ref, v_hbm_ref, o_ref, k_buf, v_buf, sems, state_ref,
                                  m_ref, l_ref, acc_ref, *, sm_scale: float, q_sub: int, groups: int,
                                  pages_per_block: int, pages_per_seq: int, items: int,
                                  sliding_window: int | None, soft_cap: float | None, slots: int):
    """One grid step = one work item w: the rows lo..hi-1 of q block blk[w], sequence seq[w].

    items_ref: SMEM [6 * items], the item table (`work_items`); table_ref: SMEM, the page table.

    q_ref, o_ref: [KVH, q_block * G, D] VMEM blocks (row r is token r // G, head group r % G).
    k_hbm_ref, v_hbm_ref: the page pools, left in HBM; k_buf, v_buf: [slots, KVH, pages_per_block,
    page_size, D], the page stream's slots. m_ref, l_ref [KVH, q_block * G, 128] (lane-replicated)
    and acc_ref [KVH, q_block * G, D]: the online-softmax state, f32.
    """
    it = ItemTable(items_ref, items)
    w = pl.program_id(0)
    kv_heads, _, page_size, head_dim = k_hbm_ref.shape
    block_tokens = pages_per_block * page_size
    rows_sub = q_sub * groups
    q_block = q_ref.shape[1] // groups
    n_sub = q_block // q_sub
    lo, hi, qpos0 = it.lo[w], it.hi[w], it.qpos0[w]
    # A narrow piece: the fewest tokens whose rows fill whole 16-row tiles (bf16 packs 16 rows a
    # tile, f32 8). An item whose rows all fall in one (a decode token) computes it alone instead of
    # a q_sub piece: 4 tokens of 16 rows at G 4, where a q_sub of 32 computes 128 rows for one token.
    nar_tok = 16 // math.gcd(16, groups)
    use_narrow = nar_tok < q_sub and q_block % nar_tok == 0
    nar_first = lax.div(lo, jnp.int32(nar_tok)) * nar_tok
    narrow = jnp.logical_and(hi > lo, hi <= nar_first + nar_tok) if use_narrow else jnp.bool_(False)

    def pieces():
        """(when, row slice, rows, first token) of each piece this item may compute."""
        out = []
        if use_narrow:
            out.append((narrow, pl.ds(pl.multiple_of(nar_first * groups, 16), nar_tok * groups), nar_tok * groups,
                        nar_first))
        for j in range(n_sub):
            act = jnp.logical_and(j * q_sub < hi, (j + 1) * q_sub > lo)  # piece j holds rows of this item
            out.append((jnp.logical_and(act, jnp.logical_not(narrow)), pl.ds(j * rows_sub, rows_sub), rows_sub,
                        j * q_sub))
        return out

    for when, rows, n_rows, _ in pieces():
        @pl.when(when)
        def _():
            m_ref[:, rows, :] = jnp.full((kv_heads, n_rows, _LANES), _MASKED, jnp.float32)
            l_ref[:, rows, :] = jnp.zeros((kv_heads, n_rows, _LANES), jnp.float32)
            acc_ref[:, rows, :] = jnp.zeros((kv_heads, n_rows, head_dim), jnp.float32)

    def page_copies(page, slot, j):
        return (pltpu.make_async_copy(k_hbm_ref.at[:, page], k_buf.at[slot, :, j], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm_ref.at[:, page], v_buf.at[slot, :, j], sems.at[1, slot]))

    def slot_copies(slot):
        return (pltpu.make_async_copy(k_hbm_ref.at[:, pl.ds(0, pages_per_block)], k_buf.at[slot], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm_ref.at[:, pl.ds(0, pages_per_block)], v_buf.at[slot], sems.at[1, slot]))

    # Scores stay unscaled (or soft-capped), and the scale multiplies s - m inside one exp2.
    exp_scale = LOG2E if soft_cap is not None else sm_scale * LOG2E

    def attend(i, slot, length, rows, n_rows, tok0, masked: bool):
        """The online-softmax update of rows `rows` (every KV head at once) by block i; `masked`
        False for a block that every row of the piece sees whole (no position past the length, none
        after the piece's first token, none outside its window)."""
        k = k_buf[slot].reshape(kv_heads, block_tokens, head_dim)
        v = v_buf[slot].reshape(kv_heads, block_tokens, head_dim)
        s = jnp.einsum("hrd,htd->hrt", q_ref[:, rows, :], k, precision=mxu_precision(k),
                       preferred_element_type=jnp.float32)
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s * (sm_scale / soft_cap))
        if masked:  # -inf: exp2 gives exact zeros, and a row masked whole keeps m at the finite _MASKED
            kv_pos = i * block_tokens + lax.broadcasted_iota(jnp.int32, (1, 1, block_tokens), 2)
            q_pos = qpos0 + tok0 + _row_token(n_rows, groups)
            valid = jnp.logical_and(kv_pos <= q_pos, kv_pos < length)
            if sliding_window is not None:
                valid = jnp.logical_and(valid, kv_pos > q_pos - sliding_window)
            s = jnp.where(valid, s, -jnp.inf)
        m_prev = m_ref[:, rows, :][..., :1]
        m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
        alpha = jnp.exp2((m_prev - m_new) * exp_scale)
        p = jnp.exp2((s - m_new) * exp_scale)
        l_new = alpha * l_ref[:, rows, :][..., :1] + p.sum(axis=-1, keepdims=True)
        pv = jnp.einsum("hrt,htd->hrd", p.astype(v.dtype), v, precision=mxu_precision(v),
                        preferred_element_type=jnp.float32)
        acc_ref[:, rows, :] = alpha * acc_ref[:, rows, :] + pv
        m_ref[:, rows, :] = jnp.broadcast_to(m_new, (kv_heads, n_rows, _LANES))
        l_ref[:, rows, :] = jnp.broadcast_to(l_new, (kv_heads, n_rows, _LANES))

    def seen_whole(i, length, n_rows, tok0):
        """Whether every row of the piece sees all of block i (its unmasked update applies)."""
        end = (i + 1) * block_tokens
        whole = jnp.logical_and(end <= length, end - 1 <= qpos0 + tok0)
        if sliding_window is not None:
            whole = jnp.logical_and(whole, i * block_tokens > qpos0 + tok0 + n_rows // groups - 1 - sliding_window)
        return whole

    def block(i, slot, length, n_blocks, carry):
        clear_past_length(v_buf, lambda j: (slot, slice(None), j), i, n_blocks, length, page_size=page_size,
                          pages_per_block=pages_per_block)
        for when, rows, n_rows, tok0 in pieces():
            whole = seen_whole(i, length, n_rows, tok0)
            pl.when(jnp.logical_and(when, whole))(functools.partial(attend, i, slot, length, rows, n_rows, tok0, False))
            pl.when(jnp.logical_and(when, jnp.logical_not(whole)))(
                functools.partial(attend, i, slot, length, rows, n_rows, tok0, True))
        return carry

    stream_pages(lengths_ref=it.kv_end, table_ref=table_ref, state_ref=state_ref, batch=items,
                 pages_per_seq=pages_per_seq, page_size=page_size, pages_per_block=pages_per_block,
                 page_copies=page_copies, slot_copies=slot_copies, block_compute=block, init=jnp.int32(0),
                 table_row=lambda s: it.seq[s], slots=slots)

    for when, rows, n_rows, tok0 in pieces():
        @pl.when(when)
        def _():
            tok = tok0 + _row_token(n_rows, groups)
            mine = jnp.logical_and(tok >= lo, tok < hi)
            l = l_ref[:, rows, :][..., :1]
            out = acc_ref[:, rows, :] / jnp.where(l > 0, l, 1.0)
            o_ref[:, rows, :] = jnp.where(mine, out.astype(o_ref.dtype), o_ref[:, rows, :])


def grouped_layout(q, kv_heads: int, q_block: int):
    """q [T, KVH * G, D] -> [KVH, T_padded * G, D] (T padded to whole q blocks): each KV head's
    queries as the rows of one matmul, the layout the kernel reads and writes. A q projection can
    produce it directly (its einsum's output layout), which saves the two transposes."""
    tokens, q_heads, head_dim = q.shape
    groups = q_heads // kv_heads
    padded = pl.cdiv(tokens, q_block) * q_block
    qr = jnp.pad(q, ((0, padded - tokens), (0, 0), (0, 0))).reshape(padded, kv_heads, groups, head_dim)
    return qr.transpose(1, 0, 2, 3).reshape(kv_heads, padded * groups, head_dim)


def token_layout(out, tokens: int, q_heads: int):
    """The inverse of `grouped_layout`: [KVH, T_padded * G, D] -> [T, KVH * G, D]."""
    kv_heads, rows, head_dim = out.shape
    groups = q_heads // kv_heads
    return out.reshape(kv_heads, rows // groups, groups, head_dim).transpose(1, 0, 2, 3)[:tokens].reshape(
        tokens, q_heads, head_dim)


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap", "block_sizes",
                                             "interpret"))
def ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, *,
                           sm_scale: float | None = None, sliding_window: int | None = None,
                           soft_cap: float | None = None, block_sizes: BlockSizes | None = None,
                           interpret=False):
    """Attention of a ragged batch q [T, H, D] over the paged cache; returns [T, H, D].

    kv_lens int32 [S] (each sequence's positions, the new tokens included), page_table int32
    [S, pages_per_seq], cu_q_lens int32 [S + 1] (token row offsets), num_seqs int32 [1] (the live
    sequences; the rest are padding). kv_lens[s] >= q_len[s] and kv_lens[s] <= pages_per_seq *
    page_size are the caller's to keep. sm_scale defaults to 1/sqrt(D); block_sizes to
    `default_blocks(T, S)`. Rows past cu_q_lens[num_seqs] are zeros.
    """
    _check_shapes(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs)
    bs = block_sizes or default_blocks(q.shape[0], kv_lens.shape[0])
    tokens, q_heads, _ = q.shape
    qg = grouped_layout(q, k_pages.shape[0], bs.q_block)
    out = token_layout(ragged_paged_attention_grouped(
        qg, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, q_heads=q_heads, sm_scale=sm_scale,
        sliding_window=sliding_window, soft_cap=soft_cap, block_sizes=bs, interpret=interpret), tokens, q_heads)
    live = jnp.arange(tokens) < lax.dynamic_index_in_dim(cu_q_lens, num_seqs[0], keepdims=False)
    return jnp.where(live[:, None, None], out, 0).astype(q.dtype)


@functools.partial(jax.jit, static_argnames=("q_heads", "sm_scale", "sliding_window", "soft_cap", "block_sizes",
                                             "interpret"))
def ragged_paged_attention_grouped(qg, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, q_heads: int,
                                   sm_scale: float | None = None, sliding_window: int | None = None,
                                   soft_cap: float | None = None, block_sizes: BlockSizes | None = None,
                                   interpret=False):
    """The kernel on q in the grouped layout (`grouped_layout`), returning the same layout; rows of
    tokens past cu_q_lens[num_seqs] are left unwritten (undefined). qg's tokens are padded to whole
    q blocks, so the blocks are the caller's: `block_sizes` defaults to the mixed step's
    (`DEFAULT_BLOCKS`); a decode batch or a prefill chunk pads with and passes `default_blocks(T, S)`,
    as `ragged_paged_attention` does."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be positive or None, got {soft_cap}")
    kv_heads, _, page_size, head_dim = k_pages.shape
    groups = q_heads // kv_heads
    bs = block_sizes or DEFAULT_BLOCKS
    if qg.ndim != 3 or qg.shape[0] != kv_heads or qg.shape[2] != head_dim or qg.shape[1] % (bs.q_block * groups):
        raise ValueError(f"qg must be [kv_heads={kv_heads}, tokens * {groups}, {head_dim}] with tokens a multiple of "
                         f"q_block={bs.q_block} (grouped_layout makes it), got {qg.shape}")
    seqs, pages_per_seq = page_table.shape
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    ppb = min(bs.pages_per_block, pages_per_seq)
    q_block = bs.q_block
    padded = qg.shape[1] // groups
    items = padded // q_block + seqs
    work = work_items(kv_lens, cu_q_lens, num_seqs, padded, q_block, interpret=interpret)
    qo_spec = pl.BlockSpec((kv_heads, q_block * groups, head_dim), lambda w, items_ref, _: (0, items_ref[w], 0))
    kernel = functools.partial(ragged_paged_attention_kernel, sm_scale=sm_scale, q_sub=bs.q_sub, groups=groups,
                               pages_per_block=ppb, pages_per_seq=pages_per_seq, items=items,
                               sliding_window=sliding_window, soft_cap=soft_cap, slots=bs.slots)
    itemsize = jnp.dtype(k_pages.dtype).itemsize
    pages_read, keys = step_work(padded, seqs, pages_per_seq, page_size, q_block)
    kv_bytes = 2 * pages_read * kv_heads * page_size * head_dim * itemsize  # K and V
    qo_bytes = 2 * qg.size * jnp.dtype(qg.dtype).itemsize
    cost = pl.CostEstimate(flops=int(4 * keys * q_heads * head_dim), transcendentals=int(keys * q_heads),
                           bytes_accessed=int(kv_bytes + qo_bytes + 4 * (6 * items + page_table.size)))
    rows = q_block * groups
    kv_buf = pltpu.VMEM((bs.slots, kv_heads, ppb, page_size, head_dim), k_pages.dtype)
    state = [pltpu.VMEM((kv_heads, rows, _LANES), jnp.float32), pltpu.VMEM((kv_heads, rows, _LANES), jnp.float32),
             pltpu.VMEM((kv_heads, rows, head_dim), jnp.float32)]
    vmem = vmem_limit(2 * block_bytes((kv_heads, rows, head_dim), jnp.dtype(qg.dtype).itemsize),  # q in, o out
                      scratch=2 * block_bytes((bs.slots, kv_heads, ppb, page_size, head_dim), itemsize)
                      + 2 * block_bytes((kv_heads, rows, _LANES), 4) + block_bytes((kv_heads, rows, head_dim), 4))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(qg.shape, qg.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(items,),
            in_specs=[qo_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=qo_spec,
            scratch_shapes=[kv_buf, kv_buf, pltpu.SemaphoreType.DMA((2, bs.slots)),
                            pltpu.SMEM(state_shape(), jnp.int32), *state]),
        # "arbitrary": items run in order on one core; the cross-item prefetch and the q block
        # shared by consecutive items rely on it.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=vmem),
        cost_estimate=cost,
        interpret=_interpret_mode(interpret),
        name="tpudiag_ragged_paged_attention",
    )(work, page_table.reshape(-1), qg, k_pages, v_pages)


def _attend(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, sm_scale, sliding_window,
            soft_cap, ct, mm):
    """Each token row against its own sequence's gathered pages (the plain-JAX form); `ct` is the
    softmax dtype, `mm` the matmul dtype (None: ct)."""
    tokens, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    ctx = page_table.shape[1] * page_size
    seq, live = _token_seqs(cu_q_lens, num_seqs, tokens)
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    q_pos = kv_lens[seq] - q_len + jnp.arange(tokens, dtype=jnp.int32) - cu_q_lens[seq]
    mm = mm or ct
    k = jnp.take(k_pages, page_table[seq], axis=1, mode="clip").reshape(kv_heads, tokens, ctx, head_dim)
    v = jnp.take(v_pages, page_table[seq], axis=1, mode="clip").reshape(kv_heads, tokens, ctx, head_dim)
    qg = q.reshape(tokens, kv_heads, q_heads // kv_heads, head_dim).astype(mm)
    s = jnp.einsum("thgd,htcd->thgc", qg, k.astype(mm), preferred_element_type=ct).astype(ct) * sm_scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    pos = jnp.arange(ctx)[None, :]
    valid = (pos <= q_pos[:, None]) & (pos < kv_lens[seq][:, None])
    if sliding_window is not None:
        valid &= pos > q_pos[:, None] - sliding_window
    valid &= live[:, None]
    s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
    m = s.max(axis=-1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    o = jnp.einsum("thgc,htcd->thgd", p.astype(mm), v.astype(mm), preferred_element_type=ct).astype(ct)
    o = jnp.where(l > 0, o / jnp.where(l > 0, l, 1.0), 0.0)
    return o.reshape(tokens, q_heads, head_dim).astype(q.dtype)


def reference(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, sm_scale=None,
              sliding_window=None, soft_cap=None, block_sizes=None):
    """Pure JAX: every token row against its sequence's gathered pages, causal (and windowed), f32
    softmax (f64 when the oracle runs under x64). `block_sizes` is accepted and ignored."""
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    ct = jnp.promote_types(q.dtype, jnp.float32)
    return _attend(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=sm_scale,
                   sliding_window=sliding_window, soft_cap=soft_cap, ct=ct, mm=None)


def xla_ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, *,
                               sm_scale=None):
    """What a user writes without a kernel: each token gathers its sequence's pages (a ragged batch
    has no static per-sequence shape), bf16 matmuls, f32 softmax."""
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    return _attend(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=sm_scale,
                   sliding_window=None, soft_cap=None, ct=jnp.float32, mm=q.dtype)


# ----------------------------------------------------------------------------- verify cases

def _make(q_lens, kv_lens, num_seqs, tokens, dtype, *, q_heads=8, kv_heads=2, head_dim=128, page_size=16,
          pages_per_seq=5, spare_pages=3):
    """Random q, a pool with every sequence's pages shuffled (entries past a sequence's live pages
    point outside the pool: the kernel must never DMA them), lengths and row offsets."""
    q_lens = np.asarray(q_lens, np.int32)
    kv_lens = np.asarray(kv_lens, np.int32)
    seqs = len(q_lens)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)

    def make_args(key):
        kq, kk, kv, kp = jax.random.split(key, 4)
        total = seqs * pages_per_seq + spare_pages
        q = jax.random.normal(kq, (tokens, q_heads, head_dim), jnp.float32).astype(dtype)
        k = jax.random.normal(kk, (kv_heads, total, page_size, head_dim), jnp.float32).astype(dtype)
        v = jax.random.normal(kv, (kv_heads, total, page_size, head_dim), jnp.float32).astype(dtype)
        perm = np.asarray(jax.random.permutation(kp, total))[: seqs * pages_per_seq].reshape(seqs, pages_per_seq)
        live = -(-kv_lens // page_size)
        live = np.where(np.arange(seqs) < num_seqs, live, 0)
        table = np.where(np.arange(pages_per_seq)[None, :] < live[:, None], perm, total + 1000).astype(np.int32)
        return (q, k, v, jnp.asarray(kv_lens), jnp.asarray(table), jnp.asarray(cu),
                jnp.asarray([num_seqs], jnp.int32))

    return make_args


def cases() -> list[Case]:
    """One small shape (the TPU interpreter retraces per shape): 8 q heads over 2 KV heads, D 128,
    pages of 16, 5 pages a sequence (80 positions), q blocks of 16 tokens in pieces of 8, 2 pages a
    KV block. Five sequences and 48 token rows: a prefill chunk crossing two q block boundaries,
    decode tokens sharing a block, a whole first prompt (q_len = kv_len), a sequence with no new
    tokens, a padding sequence past num_seqs and padding rows."""
    bs = dict(block_sizes=BlockSizes(q_block=16, q_sub=8, pages_per_block=2))
    mixed = ([21, 1, 0, 13, 1, 5], [70, 33, 40, 13, 80, 9], 5, 48)
    return [
        Case("mixed prefill and decode f32", _make(*mixed, jnp.float32), bs, "float32"),
        Case("mixed prefill and decode bf16", _make(*mixed, jnp.bfloat16), bs, "bfloat16"),
        Case("sliding window 24, soft cap 5 f32", _make(*mixed, jnp.float32),
             {**bs, "sliding_window": 24, "soft_cap": 5.0}, "float32"),
        # decode only: one token each, all in one q block
        Case("decode batch bf16", _make([1] * 6, [80, 1, 17, 64, 33, 50], 6, 16, jnp.bfloat16), bs, "bfloat16"),
        # the page stream double-buffered (the cases above run it six blocks deep)
        Case("mixed prefill and decode, 2 slots f32", _make(*mixed, jnp.float32),
             dict(block_sizes=BlockSizes(q_block=16, q_sub=8, pages_per_block=2, slots=2)), "float32"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-4, reason=(
        "f32 end to end with an online softmax over blocks of 32 positions: reassociated sums of up "
        "to 80 terms agree with float64 to ~1e-6")),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, reason=(
        "the probabilities are rounded to bf16 (2^-8 relative) before the P @ V matmul and the output "
        "is bf16, as paged_attention")),
}


# ----------------------------------------------------------------------------- bench

def _prod_args(p: dict):
    pps = p["context"] // p["page_size"]
    sds = jax.ShapeDtypeStruct
    pool = (p["kv_heads"], p["seqs"] * pps, p["page_size"], p["head_dim"])
    return (sds((p["tokens"], p["q_heads"], p["head_dim"]), jnp.bfloat16), sds(pool, jnp.bfloat16),
            sds(pool, jnp.bfloat16), sds((p["seqs"],), jnp.int32), sds((p["seqs"], pps), jnp.int32),
            sds((p["seqs"] + 1,), jnp.int32), sds((1,), jnp.int32))


def _kernel_args(p: dict, blocks: BlockSizes):
    """Ours takes q in its grouped layout, [KVH, T_padded * G, D] (`grouped_layout`)."""
    args = list(_prod_args(p))
    groups = p["q_heads"] // p["kv_heads"]
    padded = -(-p["tokens"] // blocks.q_block) * blocks.q_block
    return (jax.ShapeDtypeStruct((p["kv_heads"], padded * groups, p["head_dim"]), jnp.bfloat16), *args[1:])


def _jax_args(p: dict):
    """JAX's kernel keeps K and V in one pool, [pages, page_size, 2 * KVH (K, V interleaved), D]."""
    args = list(_prod_args(p))
    pages = p["seqs"] * p["context"] // p["page_size"]
    combined = jax.ShapeDtypeStruct((pages, p["page_size"], 2 * p["kv_heads"], p["head_dim"]), jnp.bfloat16)
    return (args[0], combined, *args[3:])


# JAX's kernel picks its blocks from a table keyed by the chip and the shape; the table has no entry
# for a 2048-position page table, where it falls back to 128 pages (clipped to the table's 16: the
# whole context) and 32 queries a block. At XLA's default scoped VMEM (16 MiB on v5e) those blocks
# do not compile (CompileTimeScopedVmemOom), so its limit is raised to 64 MiB. 8 pages (its choice
# for 1024 positions) gives the same figure on v5e.
JAX_BLOCKS = dict(num_kv_pages_per_block=16, num_queries_per_block=32, vmem_limit_bytes=64 * 2**20)


def _jax_blocks(p: dict) -> dict:
    """JAX_BLOCKS, its pages a block clipped to a sequence's page table (its kernel refuses more)."""
    return dict(JAX_BLOCKS, num_kv_pages_per_block=min(JAX_BLOCKS["num_kv_pages_per_block"],
                                                       p["context"] // p["page_size"]))


def bench(blocks: BlockSizes | None = None, shape: dict | None = None) -> BenchSetup:
    """At the production step by default; `shape` replaces fields of PROD (`seqs` sequences, `tokens`
    rows of which the first sequence holds `prefill`, at `context` positions): another model's heads,
    a decode-only batch (`prefill=1, tokens=seqs`) or one prefill chunk (`seqs=1`). `blocks`
    defaults to the kernel's for the batch (`default_blocks`)."""
    p = at_shape(PROD, shape)
    blocks = blocks or default_blocks(p["tokens"], p["seqs"])
    jax_blocks = _jax_blocks(p)

    def kernel(qg, k, v, kv_lens, table, cu, num_seqs):
        return ragged_paged_attention_grouped(qg, k, v, kv_lens, table, cu, num_seqs, q_heads=p["q_heads"],
                                              block_sizes=blocks)

    def jax_kernel(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs):
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention as jax_rpa

        return jax_rpa(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs,
                       sm_scale=1.0 / math.sqrt(q.shape[-1]), **jax_blocks)

    if p["prefill"] == 1:
        batch = f"{p['seqs']} decode token{'s' if p['seqs'] > 1 else ''}"
    elif p["seqs"] == 1:
        batch = f"one {p['tokens']}-token prefill chunk"
    else:
        batch = f"a {p['prefill']}-token prefill chunk and {p['seqs'] - 1} decode tokens"
    seqs = f"{p['seqs']} sequence{'s' if p['seqs'] > 1 else ''}"
    shape_text = (f"H{p['q_heads']} KVH{p['kv_heads']} D{p['head_dim']} page{p['page_size']} ctx{p['context']} "
                  f"bf16, {seqs}: {batch} ({p['tokens']} rows; ours with q in its grouped layout)")
    return BenchSetup(shape=shape_text, args=_prod_args(p), kernel=kernel, xla=xla_ragged_paged_attention,
                      jax_kernel=jax_kernel,
                      variant_args={"kernel": _kernel_args(p, blocks), "jax": _jax_args(p)},
                      jax_name=f"jax ragged_paged_attention ({jax_blocks['num_kv_pages_per_block']} pages, "
                      f"{jax_blocks['num_queries_per_block']} queries a block)", blocks=str(blocks))


SPEC = KernelSpec(
    name="ragged_paged_attention",
    title="Mixed prefill and decode attention over a paged KV cache (causal, GQA, window, soft cap)",
    replaces=("Without a kernel a ragged batch has no per-sequence shape: every token row gathers its "
              "sequence's whole page table into HBM (tokens x context x heads), then scores and the "
              "masked softmax go through HBM; a kernel reads each sequence's live pages once per q block."),
    signature=("ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, "
               "sm_scale=None, sliding_window=None, soft_cap=None, block_sizes=None, interpret=False)"),
    tuned_for=("Llama 3 8B heads (H32 KVH8 D128), page_size 128, context 2048: a 512-token prefill chunk with "
               "63 decode tokens; q_block=128, q_sub=32, pages_per_block=8, the page stream 6 slots deep"),
    usage=("from tpudiag.kernels.ragged_paged_attention import ragged_paged_attention, write_kv_pages\n"
           "k_pages, v_pages = write_kv_pages(k_pages, v_pages, new_k, new_v, kv_lens, table, cu_q_lens, num_seqs)\n"
           "out = ragged_paged_attention(q, k_pages, v_pages, kv_lens, table, cu_q_lens, num_seqs)  # [T,H,D]"),
    kernel=ragged_paged_attention,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=tuple(BlockSizes(q, s, n) for q, s, n in
                           ((128, 32, 8), (128, 16, 4), (128, 16, 8), (64, 32, 8), (32, 32, 8), (256, 32, 8), (128, 32, 4))),
    differentiable=False,
)
