"""The ragged_paged_attention task's reference: JAX's `ref_ragged_paged_attention`, adapted from
jax 0.10.2, jax/experimental/pallas/ops/tpu/ragged_paged_attention/kernel.py (Apache-2.0): the
reference beside JAX's TPU kernel for vLLM-style serving (mixed prefill and decode over a paged
KV cache).

Adapted: K and V in two pools [KVH, P, page, D] (JAX's kernel takes one pool of interleaved K and
V heads, [P, page, 2 * KVH, D]); the batch is given as each sequence's new tokens (q_lens) and the
positions it had cached before them (ctx_lens), so that kv_lens = ctx_lens + q_lens, cu_q_lens is
their running sum and every sequence is live (num_seqs = S); the Python loop over sequences
(which needs concrete lengths) became one gather of each token's sequence pages, so it jits; rows
past the last sequence's tokens are zeros (JAX's returns only the live rows); sm_scale is
1/sqrt(D); no sliding window, soft cap or k/v scales. Masked scores take JAX's mask value
(-0.7 x float32's max) added, as there. A solution may not import or call it."""

import jax
import jax.numpy as jnp

DEFAULT_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.dtype("float32")).max)


def ragged_paged_attention(q, k_pages, v_pages, q_lens, ctx_lens, page_table):
    tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    num_seqs, pages_per_seq = page_table.shape
    num_query_per_kv = num_q_heads // num_kv_heads
    sm_scale = head_dim ** -0.5
    cu_q_lens = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(q_lens).astype(jnp.int32)])
    kv_lens = ctx_lens + q_lens
    t = jnp.arange(tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], t, side="right"), 0, num_seqs - 1)  # each token's sequence
    live = t < cu_q_lens[num_seqs]
    ctx = pages_per_seq * page_size
    k = jnp.take(k_pages, page_table[seq], axis=1).reshape(num_kv_heads, tokens, ctx, head_dim)
    v = jnp.take(v_pages, page_table[seq], axis=1).reshape(num_kv_heads, tokens, ctx, head_dim)
    k = jnp.repeat(k, num_query_per_kv, axis=0)
    v = jnp.repeat(v, num_query_per_kv, axis=0)
    attn = jnp.einsum("qhd,hqkd->hqk", q, k, preferred_element_type=jnp.float32)
    attn *= sm_scale
    q_span = (kv_lens[seq] - q_lens[seq]) + (t - cu_q_lens[seq])  # each token's position
    kv_span = jnp.arange(ctx)[None, :]
    mask = (q_span[:, None] < kv_span) | (kv_span >= kv_lens[seq][:, None])  # causal; past the cached length
    attn += jnp.where(mask[None], DEFAULT_MASK_VALUE, 0.0)
    attn = jax.nn.softmax(attn, axis=-1).astype(v.dtype)
    out = jnp.einsum("hqk,hqkd->qhd", attn, v).astype(q.dtype)
    return jnp.where(live[:, None, None], out, jnp.zeros((), q.dtype))
