"""The qwen3_moe task's ground truth: tpudiag's fused MoE (tpudiag.kernels.fused_moe): softmax
routing over all experts, top-4, the chosen weights renormalised; the (token, expert) pairs sorted
by expert and two grouped-matmul Pallas calls (gate and up with the SwiGLU applied in VMEM, then
down), each expert's weights read only for the rows routed to it; the combine in float32. The
router weight goes in transposed ([D, E]); the blocks are the kernel's defaults for D rounded up to
whole 128-lane tiles (its K blocks must be lane multiples; the plan pads D). Interpret mode off a
TPU."""

import jax

from tpudiag.kernels.fused_moe import default_blocks, fused_moe

TOP_K = 4


def qwen3_moe(hidden, gate_w, w_gate, w_up, w_down, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    lanes = -(-hidden.shape[1] // 128) * 128
    return fused_moe(hidden, gate_w.T, w_gate, w_up, w_down, top_k=TOP_K, scoring="softmax", renormalize=True,
                     block_sizes=default_blocks(lanes), interpret=interpret)
