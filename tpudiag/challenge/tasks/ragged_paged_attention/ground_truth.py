"""The ragged_paged_attention task's ground truth: tpudiag's Pallas kernel
(tpudiag.kernels.ragged_paged_attention) with the batch description the kernel takes built from
the task's: cu_q_lens (the running sum of q_lens), kv_lens = ctx_lens + q_lens, num_seqs = S.
Work items are (q block, sequence) pairs that overlap; each streams only the pages up to its
rows' causal end and computes only the pieces its rows fall in. Interpret mode off a TPU."""

import jax
import jax.numpy as jnp

from tpudiag.kernels.ragged_paged_attention import ragged_paged_attention as _kernel


def ragged_paged_attention(q, k_pages, v_pages, q_lens, ctx_lens, page_table, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    cu_q_lens = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(q_lens).astype(jnp.int32)])
    num_seqs = jnp.asarray([page_table.shape[0]], jnp.int32)
    return _kernel(q, k_pages, v_pages, (ctx_lens + q_lens).astype(jnp.int32), page_table, cu_q_lens, num_seqs,
                   interpret=interpret)
