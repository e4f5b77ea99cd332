"""Ragged paged attention's schedule: the grid's work items and the cost they add up to.

A work item is one (q block, sequence) pair that overlaps: the rows of a serving step's ragged batch
that one grid step of `ragged_paged_attention` computes, against one sequence's pages. `work_items`
builds the table on the scalar core before the attention call (the call's block index maps read
it); `ItemTable` reads it inside the kernel; `step_work` is the pages and query-key pairs a step
costs, from the shapes alone, for the call's cost estimate.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.tiling import vmem_limit


def _items_kernel(kv_ref, cu_ref, n_ref, out_ref, *, seqs: int, items: int, q_block: int):
    """The work-item table on the scalar core: one pass over the sequences, an item for each q
    block a live sequence's rows touch, then the padding items. out_ref: SMEM [6 * items], the
    fields in `ItemTable.FIELDS` order, each `items` long."""
    n_live = n_ref[0]

    def put(w, blk, seq, lo, hi, qpos0, kv_end):
        for k, v in enumerate((blk, seq, lo, hi, qpos0, kv_end)):
            out_ref[k * items + w] = v

    def sequence(s, carry):
        w, last_blk = carry
        cs, kv_len = cu_ref[s], kv_ref[s]
        q_len = jnp.where(s < n_live, cu_ref[s + 1] - cs, 0)
        first = lax.div(cs, q_block)
        count = jnp.where(q_len > 0, lax.div(cs + q_len - 1, q_block) - first + 1, 0)

        def item(b, w):
            start = (first + b) * q_block
            hi = jnp.minimum(cs + q_len - start, q_block)
            qpos0 = kv_len - q_len + start - cs
            put(w, first + b, s, jnp.maximum(cs - start, 0), hi, qpos0, qpos0 + hi)
            return w + 1

        w = lax.fori_loop(0, count, item, w)
        return w, jnp.where(count > 0, first + count - 1, last_blk)

    live_items, last_blk = lax.fori_loop(0, seqs, sequence, (jnp.int32(0), jnp.int32(0)))
    # Padding items: no rows and nothing to read, on the last live q block (its q and output blocks
    # stay where they are), on the last sequence's table row.
    s = seqs - 1
    q_len = jnp.where(s < n_live, cu_ref[s + 1] - cu_ref[s], 0)
    qpos0 = kv_ref[s] - q_len + last_blk * q_block - cu_ref[s]

    def pad(w, carry):
        put(w, last_blk, jnp.int32(s), jnp.int32(0), jnp.int32(0), qpos0, jnp.int32(0))
        return carry

    lax.fori_loop(live_items, items, pad, 0)


def work_items(kv_lens, cu_q_lens, num_seqs, tokens_padded: int, q_block: int, *, interpret=False):
    """The grid's work items, one per (q block, sequence) overlapping, in token order, padded to
    the static bound (q blocks + sequences) with empty items on the last live block: int32 [6 *
    items], the fields blk, seq, lo, hi, qpos0, kv_end one after another. The item's rows are tokens
    lo..hi-1 of q block blk; qpos0 is the KV position of the block's first token as sequence seq
    counts it; kv_end the positions the item reads (the causal end of its last row).

    Built by a small Pallas call on the scalar core: the same table built with XLA ops takes
    three fusions, each with the fixed cost of a vector op, more than the attention itself costs
    for one decode sequence."""
    seqs = kv_lens.shape[0]
    items = tokens_padded // q_block + seqs
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.pallas_call(
        functools.partial(_items_kernel, seqs=seqs, items=items, q_block=q_block),
        out_shape=jax.ShapeDtypeStruct((6 * items,), jnp.int32),
        in_specs=[smem, smem, smem],
        out_specs=smem,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=vmem_limit(0)),  # no VMEM blocks
        cost_estimate=pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=4 * (2 * seqs + 2 + 6 * items)),
        interpret=interpret,
        name="tpudiag_rpa_work_items",
    )(kv_lens, cu_q_lens, num_seqs)


def step_work(tokens: int, seqs: int, pages_per_seq: int, page_size: int, q_block: int) -> tuple[int, float]:
    """(pages read, query-key pairs) of a step of `tokens` rows over `seqs` sequences with tables of
    `pages_per_seq` pages, from the shapes alone (the lengths are data): the cost estimate's figures.

    The rows are taken as split evenly, q = tokens / seqs a sequence, each sequence's chunk the last
    q positions of a full table and aligned to q blocks (the pairs, concave in q, are then the most
    any split of the rows can have; a chunk that straddles a block boundary reads its pages once
    more than counted). A chunk spans ceil(q / q_block) q blocks, and each block reads the pages up
    to its causal end again: an 8192-token prefill chunk in blocks of 128 reads its first pages 64
    times. Each new token attends to the positions up to its own (causal), so a chunk of the whole
    context costs half the square. A decode step (q = 1) reads each table once."""
    ctx = pages_per_seq * page_size
    q = min(tokens / max(seqs, 1), ctx)
    blocks = max(1, math.ceil(q / q_block))
    pages = sum(math.ceil(min(ctx, ctx - q + (b + 1) * q_block) / page_size) for b in range(blocks))
    return seqs * min(pages, blocks * pages_per_seq), seqs * (q * ctx - q * (q - 1) / 2)


class ItemTable:
    """The work-item table in SMEM, [6, items] flattened: read as items.blk[w], items.seq[w], ..."""

    FIELDS = ("blk", "seq", "lo", "hi", "qpos0", "kv_end")

    def __init__(self, ref, items: int):
        self.ref, self.items = ref, items

    def __getattr__(self, name):
        k = ItemTable.FIELDS.index(name)
        return _Field(self.ref, k * self.items)


class _Field:
    """One field of the item table; `field[w]` is an SMEM scalar load (a stand-in ref for page_stream's lengths)."""

    def __init__(self, ref, offset: int):
        self.ref, self.offset = ref, offset

    def __getitem__(self, w):
        return self.ref[self.offset + w]
