"""The page stream the paged decode kernels share: one grid step per sequence, the live pages of
its KV cache DMAed from HBM block by block into a ring of VMEM slots (two or more), each block's
successors started before it is computed, across grid steps: the next sequence's first blocks go
under the current one's last.

`stream_pages` runs inside a Pallas TPU kernel whose grid is (batch,) with "arbitrary" semantics
(steps in order on one core: the cross-step prefetch relies on it). The kernel says what a page's
DMAs are (`page_copies`) and what a block computes (`block_compute`); the schedule, the length
clamp and the slot bookkeeping are here. `page_table` builds the shuffled page tables their verify
cases use. No I/O.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl


# SMEM words of the stream's schedule (`state_shape`): the slot of the next block to compute, the
# blocks started and not yet computed, and the fetch cursor (grid step, block) of the next block to start.
_STATE_WORDS = 4


def state_shape() -> tuple[int]:
    """The shape of the SMEM scratch `stream_pages` keeps its schedule in (int32)."""
    return (_STATE_WORDS,)


def check_slots(slots) -> None:
    """ValueError unless `slots` (a stream's ring of VMEM slots) is an int of at least 2."""
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 2:
        raise ValueError(f"slots must be an int >= 2, got {slots!r}")


def stream_pages(*, lengths_ref, table_ref, state_ref, batch: int, pages_per_seq: int, page_size: int,
                 pages_per_block: int, page_copies: Callable, block_compute: Callable, init,
                 slot_copies: Callable, table_row: Callable | None = None, slots: int = 2):
    """Run `block_compute(i, slot, length, n_blocks, carry) -> carry` over the blocks of sequence
    `pl.program_id(0)`, each once its pages are in VMEM slot `slot`; returns the last carry (`init`
    for a sequence of length 0).

    The blocks of all grid steps form one stream over a ring of `slots` VMEM slots: before a block
    is computed, the blocks after it are started until `slots` are in flight, crossing into the
    next grid steps' sequences (those of length 0 skipped). Two slots double-buffer; more keep the
    DMA engine further ahead, so a block whose compute outlasts its own DMA (a prefill chunk's)
    does not leave it idle.

    lengths_ref [B], table_ref [B * pages_per_seq]: SMEM (scalar prefetch). state_ref: SMEM
    `state_shape()`, persistent across grid steps. `page_copies(page, slot, j)` gives the async
    copies that bring pool page `page` to position j of `slot`; all of a slot's copies share its
    semaphores, and `slot_copies(slot)` gives one copy per semaphore whose destination is the whole
    slot (waited on once a block). Lengths are clamped to [0, pages_per_seq * page_size]; table
    entries past a length are never read (the page table may hold anything there): the block's
    last positions copy its last live page again. `table_row(s)` is the page-table row grid step s
    reads (default: row s), for grids whose steps are pieces of sequences.
    """
    check_slots(slots)
    b = pl.program_id(0)
    block_tokens = pages_per_block * page_size
    max_len = pages_per_seq * page_size

    def seq_len(s):
        return jnp.clip(lengths_ref[s], 0, max_len)

    def n_blocks_of(s):
        return pl.cdiv(seq_len(s), block_tokens)

    def start_block(s, blk, slot):
        # Every position of the block is copied, branch-free: past the live pages, the last live
        # page again (the compute masks those rows), so one wait covers the whole slot.
        live_pages = pl.cdiv(seq_len(s), page_size)
        row = s if table_row is None else table_row(s)
        for j in range(pages_per_block):
            pos = jnp.minimum(blk * pages_per_block + j, live_pages - 1)
            for copy in page_copies(table_ref[row * pages_per_seq + pos], slot, j):
                copy.start()

    def wait_block(slot):
        for copy in slot_copies(slot):  # a DMA semaphore counts bytes: one wait for the slot's pages
            copy.wait()

    def skip_empty(s, blk):
        """The cursor moved past the blocks of step s (and of any empty steps after it)."""
        def more(c):
            return jnp.logical_and(c[0] < batch, c[1] >= n_blocks_of(jnp.minimum(c[0], batch - 1)))
        return lax.while_loop(more, lambda c: (c[0] + 1, jnp.int32(0)), (s, blk))

    @pl.when(b == 0)
    def _():
        s0, blk0 = skip_empty(jnp.int32(0), jnp.int32(0))
        state_ref[0] = 0
        state_ref[1] = 0
        state_ref[2] = s0
        state_ref[3] = blk0

    def top_up():
        """Start blocks at the fetch cursor until `slots` are in flight or the stream has none left."""
        for _ in range(slots):  # at most `slots` starts: each one fills a free slot
            @pl.when(jnp.logical_and(state_ref[1] < slots, state_ref[2] < batch))
            def _():
                s, blk = state_ref[2], state_ref[3]
                start_block(s, blk, lax.rem(state_ref[0] + state_ref[1], slots))
                state_ref[1] = state_ref[1] + 1
                s, blk = skip_empty(s, blk + 1)
                state_ref[2] = s
                state_ref[3] = blk

    length, n_blocks = seq_len(b), n_blocks_of(b)

    def body(i, carry):
        top_up()
        slot = state_ref[0]
        wait_block(slot)
        carry = block_compute(i, slot, length, n_blocks, carry)
        state_ref[0] = lax.rem(slot + 1, slots)
        state_ref[1] = state_ref[1] - 1
        return carry

    return lax.fori_loop(0, n_blocks, body, init)


def clear_past_length(buf, index: Callable, i, n_blocks, length, *, page_size: int, pages_per_block: int):
    """Zero the rows past `length` in the last block's pages (`buf[index(j)]`: page j of the slot,
    its rows on the second-to-last axis). A pool's unwritten positions may hold NaN, and the
    positions after the last live page repeat it; the softmax gives them p = 0, but 0 * NaN is NaN
    in P @ V. Only pages holding such rows pay for the select: none where the length fills the block."""
    block_tokens = pages_per_block * page_size
    for j in range(pages_per_block):
        first = i * block_tokens + j * page_size

        @pl.when(jnp.logical_and(i + 1 == n_blocks, first + page_size > length))
        def _():
            page = buf[index(j)]
            pos = first + lax.broadcasted_iota(jnp.int32, page.shape, page.ndim - 2)
            buf[index(j)] = jnp.where(pos < length, page, jnp.zeros((), page.dtype))


def check_table(lengths, page_table, batch: int) -> None:
    """lengths int32 [batch] and a page table int32 [batch, pages_per_seq]; ValueError otherwise."""
    if page_table.ndim != 2 or page_table.shape[0] != batch:
        raise ValueError(f"page_table must be [batch={batch}, pages_per_seq], got {page_table.shape}")
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must be [batch={batch}], got {lengths.shape}")
    for name, a in (("lengths", lengths), ("page_table", page_table)):
        if a.dtype != jnp.int32:
            raise ValueError(f"{name} must be int32, got {a.dtype}")


def page_table(key, total: int, batch: int, pages_per_seq: int, lengths: np.ndarray, page_size: int):
    """A shuffled page table [batch, pages_per_seq] into a pool of `total` pages; entries past each
    sequence's live pages point far outside the pool, so a kernel that DMAs one fails (the TPU
    interpreter raises on out-of-bounds reads)."""
    perm = np.asarray(jax.random.permutation(key, total))[: batch * pages_per_seq]
    table = perm.reshape(batch, pages_per_seq).astype(np.int32)
    live = -(-lengths // page_size)
    table = np.where(np.arange(pages_per_seq)[None, :] < live[:, None], table, total + 1000)
    return jnp.asarray(table, jnp.int32)
