"""The flash_attention_bwd task's ground truth: tpudiag's Pallas flash attention
(tpudiag.kernels.flash_attention), causal, whose custom VJP runs the Pallas backward kernels
(flash_attention_bwd: dK/dV over key blocks, dQ over query blocks, from the saved log-sum-exp, no
[S, S] matrix). Interpret mode off a TPU.

At the graded lengths every pass takes 128-row blocks and the backward 128 x 128 sub-tiles, so that
each pass visits several blocks (skipped, diagonal, full) and each block several sub-tiles; at
production lengths (the speed shapes) the kernel's tuned defaults."""

import jax

from tpudiag.kernels import flash_attention as fa

_SMALL = fa.BlockSizes(block_q=128, block_k=128, compute_q=128, compute_k=128, compute_q_bwd=128,
                       compute_k_bwd=128)


def flash_attention(q, k, v, interpret=None):
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    short = max(q.shape[2], k.shape[2]) <= 512
    return fa.flash_attention(q, k, v, causal=True, block_sizes=_SMALL if short else None, interpret=interpret)
