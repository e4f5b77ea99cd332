"""The ragged paged attention kernel (tpudiag/kernels/ragged_paged_attention.py): its verify cases
(TPU interpret mode against the reference and float64), a whole serving step (the new K/V written
into their pages, then attention) against a float64 numpy loop written sequence by sequence, the
work items the grid runs, padding rows as zeros, and the errors raised before tracing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpudiag.kernels import ragged_paged_attention as R
from tpudiag.parity.kernel_cases import verify_spec

SMALL = R.BlockSizes(q_block=16, q_sub=8, pages_per_block=2)


def test_every_verify_case_passes():
    res = verify_spec(R.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}


def _naive_step(q, new_k, new_v, k_cache, v_cache, q_lens, ctx_before, window=None, cap=None):
    """Each sequence on its own, dense, float64: append the new K/V to its cache, then every new
    token attends causally to the positions up to its own."""
    out = np.zeros(q.shape)
    kv_heads = k_cache[0].shape[1]
    groups = q.shape[1] // kv_heads
    row = 0
    for s, n in enumerate(q_lens):
        k = np.concatenate([k_cache[s], new_k[row:row + n]])  # [ctx, KVH, D]
        v = np.concatenate([v_cache[s], new_v[row:row + n]])
        for i in range(n):
            pos = ctx_before[s] + i
            for h in range(q.shape[1]):
                sc = k[:pos + 1, h // groups] @ q[row + i, h] / np.sqrt(q.shape[2])
                if cap is not None:
                    sc = cap * np.tanh(sc / cap)
                keep = np.arange(pos + 1) > pos - window if window else np.ones(pos + 1, bool)
                p = np.where(keep, np.exp(sc - sc[keep].max()), 0.0)
                out[row + i, h] = p @ v[:pos + 1, h // groups] / p.sum()
        row += n
    return out


@pytest.mark.parametrize("window,cap", [(None, None), (20, 4.0), (45, None)])
def test_a_serving_step_writes_the_new_kv_and_attends_as_each_sequence_alone(window, cap):
    """Four sequences: a 19-token prefill chunk after 30 cached positions, two decode tokens, a
    first prompt of 9 tokens; pages of 16 shuffled in a pool with spare pages; 3 padding rows.
    Every pool position no sequence holds is NaN (as an uninitialized pool may be). A window of 45
    leaves the chunk's token at position 45, the last of its piece, all of its first 32-key block
    but position 0: that block must be masked, not taken whole."""
    rng = np.random.default_rng(1)
    kvh, groups, d, page, pps = 2, 3, 128, 16, 4
    q_lens = [19, 1, 1, 9]
    before = [30, 44, 0, 0]
    tokens = sum(q_lens) + 3
    k_cache = [rng.standard_normal((n, kvh, d)) for n in before]
    v_cache = [rng.standard_normal((n, kvh, d)) for n in before]
    new_k = rng.standard_normal((tokens, kvh, d))
    new_v = rng.standard_normal((tokens, kvh, d))
    q = rng.standard_normal((tokens, kvh * groups, d))
    pool_pages = 4 * pps + 2
    perm = rng.permutation(pool_pages)[: 4 * pps].reshape(4, pps).astype(np.int32)
    k_pool = np.full((kvh, pool_pages, page, d), np.nan)  # where nothing is written
    v_pool = np.full((kvh, pool_pages, page, d), np.nan)
    for s, n in enumerate(before):
        for t in range(n):
            k_pool[:, perm[s, t // page], t % page] = k_cache[s][t]
            v_pool[:, perm[s, t // page], t % page] = v_cache[s][t]
    kv_lens = np.array([b + n for b, n in zip(before, q_lens)], np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    meta = (jnp.asarray(kv_lens), jnp.asarray(perm), jnp.asarray(cu), jnp.array([4], jnp.int32))
    k_pages, v_pages = R.write_kv_pages(f32(k_pool), f32(v_pool), f32(new_k), f32(new_v), *meta)
    out = R.ragged_paged_attention(f32(q), k_pages, v_pages, *meta, sliding_window=window, soft_cap=cap,
                                   block_sizes=SMALL, interpret=True)
    want = _naive_step(q, new_k, new_v, k_cache, v_cache, q_lens, before, window, cap)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2e-5, atol=2e-5)
    assert (np.asarray(out)[sum(q_lens):] == 0).all()  # padding rows


def test_write_kv_pages_touches_only_the_new_positions():
    kvh, d, page = 1, 128, 16
    pool = jnp.zeros((kvh, 6, page, d))
    table = jnp.array([[3, 1], [5, 0]], jnp.int32)
    kv_lens = jnp.array([18, 2], jnp.int32)  # sequence 0 gets positions 15-17, sequence 1 positions 0-1
    cu = jnp.array([0, 3, 5], jnp.int32)
    new = jnp.arange(1, 7, dtype=jnp.float32)[:, None, None] * jnp.ones((6, kvh, d))  # row 5 is padding
    k, v = R.write_kv_pages(pool, pool, new, -new, kv_lens, table, cu, jnp.array([2], jnp.int32))
    got = {(int(p), int(s)): float(k[0, p, s, 0]) for p, s in zip(*np.nonzero(np.asarray(k[0, :, :, 0])))}
    assert got == {(3, 15): 1.0, (1, 0): 2.0, (1, 1): 3.0, (5, 0): 4.0, (5, 1): 5.0}
    assert float(v[0, 1, 1, 0]) == -3.0


def _items(kv_lens, cu, num_seqs, padded, q_block):
    """The work-item table the scalar-core kernel builds (interpret mode), as its six fields."""
    table = R.work_items(kv_lens, cu, jnp.array([num_seqs], jnp.int32), padded, q_block, interpret=True)
    return np.asarray(table).reshape(6, -1)


def test_work_items_follow_the_q_blocks_and_the_sequences():
    """Blocks of 16 tokens; sequences of 21, 1, 0 and 13 new tokens (the 0 is skipped)."""
    cu = jnp.array([0, 21, 22, 22, 35], jnp.int32)
    kv_lens = jnp.array([70, 33, 40, 13], jnp.int32)
    blk, seq, lo, hi, qpos0, kv_end = _items(kv_lens, cu, 4, 48, 16)
    live = kv_end > 0
    assert list(zip(blk[live], seq[live], lo[live], hi[live])) == [
        (0, 0, 0, 16), (1, 0, 0, 5), (1, 1, 5, 6), (1, 3, 6, 16), (2, 3, 0, 3)]
    # sequence 0's 21 new tokens are positions 49-69: block 1's rows 0-4 are positions 65-69
    assert qpos0[live][1] == 65 and kv_end[live][1] == 70
    assert len(blk) == 48 // 16 + 4 and (blk[~live] == 2).all()  # padding items stay on the last block
    assert ((lo == 0) & (hi == 0))[~live].all()  # and own no rows
    # With two live sequences the last two are padding: no items, and the padding on block 1.
    blk, seq, lo, hi, _, kv_end = _items(kv_lens, cu, 2, 48, 16)
    live = kv_end > 0
    assert list(zip(blk[live], seq[live], lo[live], hi[live])) == [(0, 0, 0, 16), (1, 0, 0, 5), (1, 1, 5, 6)]
    assert (blk[~live] == 1).all() and (hi[~live] == 0).all()


@pytest.mark.parametrize("tokens, seqs, pps", [(64, 64, 16), (8192, 1, 64), (1024, 4, 16), (512, 1, 4)])
def test_the_cost_estimate_reads_the_pages_the_work_items_read(tokens, seqs, pps):
    """step_work against the kernel's own schedule on the layouts it assumes: the rows split evenly,
    each chunk the last positions of a full table, aligned to q blocks of 128 (pages of 128). Decode
    (64 sequences of 1), one 8192-token prefill chunk, 4 chunks of 256, one first chunk of 512."""
    page, q_block = 128, 128
    q = tokens // seqs
    padded = -(-tokens // q_block) * q_block
    kv_lens = jnp.full((seqs,), pps * page, jnp.int32)
    cu = jnp.arange(seqs + 1, dtype=jnp.int32) * q
    *_, lo, hi, qpos0, kv_end = _items(kv_lens, cu, seqs, padded, q_block)
    live = kv_end > 0
    pages = int(sum(-(-int(e) // page) for e in kv_end[live]))
    pairs = sum(int(p0 + r + 1) for p0, a, b in zip(qpos0[live], lo[live], hi[live]) for r in range(a, b))
    assert R.step_work(tokens, seqs, pps, page, q_block) == (pages, pairs)
    if seqs == 1 and q == pps * page:  # a whole prompt: 64 blocks re-read the pages before them
        assert pages > pps and pairs == q * (q + 1) // 2


@pytest.mark.parametrize("bad", [dict(q_block=16, q_sub=6), dict(q_sub=0), dict(pages_per_block=1.5)])
def test_block_sizes_validate_themselves(bad):
    with pytest.raises(ValueError):
        R.BlockSizes(**bad)


@pytest.mark.parametrize("change,says", [
    (dict(q=jnp.zeros((8, 5, 128))), "multiple of kv_heads"),
    (dict(cu_q_lens=jnp.zeros((5,), jnp.int32)), r"cu_q_lens must have shape \(4,\)"),
    (dict(kv_lens=jnp.zeros((3,), jnp.float32)), "kv_lens must be int32"),
    (dict(page_table=jnp.zeros((2, 4), jnp.int32)), r"page_table must be \[seqs=3"),
])
def test_bad_inputs_are_refused_by_name(change, says):
    args = dict(q=jnp.zeros((8, 4, 128)), k_pages=jnp.zeros((2, 10, 16, 128)), v_pages=jnp.zeros((2, 10, 16, 128)),
                kv_lens=jnp.zeros((3,), jnp.int32), page_table=jnp.zeros((3, 4), jnp.int32),
                cu_q_lens=jnp.zeros((4,), jnp.int32).at[1:].set(8), num_seqs=jnp.array([3], jnp.int32))
    args.update(change)
    with pytest.raises(ValueError, match=says):
        R.ragged_paged_attention(*args.values(), interpret=True)


def test_the_grouped_layout_round_trips():
    q = jax.random.normal(jax.random.key(0), (21, 12, 128))
    g = R.grouped_layout(q, 4, 16)
    assert g.shape == (4, 32 * 3, 128)
    np.testing.assert_array_equal(np.asarray(R.token_layout(g, 21, 12)), np.asarray(q))


def test_the_default_blocks_follow_the_kind_of_batch():
    """From the shapes alone: a decode batch (rows <= sequences) in q blocks of 16, one prefill
    chunk of 256 rows or more in q blocks of 256, anything else (a mixed step, a short chunk) at 128;
    the bench takes the same, so its rows are what a caller without blocks gets."""
    assert R.default_blocks(64, 64) == R.default_blocks(1, 8) == R.DECODE_BLOCKS
    assert R.default_blocks(8192, 1) == R.PREFILL_BLOCKS and R.PREFILL_BLOCKS.q_block == 256
    assert R.default_blocks(576, 64) == R.default_blocks(100, 1) == R.DEFAULT_BLOCKS
    assert R.bench(shape={"seqs": 8, "prefill": 1, "tokens": 8}).blocks == str(R.DECODE_BLOCKS)
    assert R.bench().blocks == str(R.DEFAULT_BLOCKS)
