"""The qwen3_moe task's reference: Qwen3's sparse MoE block, adapted to JAX from Hugging Face
transformers 4.57.6, src/transformers/models/qwen3_moe/modeling_qwen3_moe.py (Apache-2.0):
`Qwen3MoeSparseMoeBlock.forward` and `Qwen3MoeMLP.forward`.

Adapted: the router weight is `gate.weight` [E, D]; the experts' weights come stacked, transposed
for x @ W: w_gate and w_up [E, D, F] (gate_proj.weight.T, up_proj.weight.T per expert), w_down
[E, F, D]; top_k = 4 with norm_topk_prob = True (Qwen3-30B-A3B takes 8 of 128 experts); the router
logits are float32 (transformers rounds them to the activations' dtype first, which in bfloat16
makes near-tied experts a coin toss). Each expert runs on every token and a token it was not
chosen for adds 0 (static shapes under jit; transformers gathers the routed tokens), in expert
order, as `index_add_` adds them; each Linear rounds its output to the activations' dtype (f32
accumulation), as torch's does. A solution may not import or call it."""

import jax
import jax.numpy as jnp

TOP_K = 4


def _linear(x, w, acc):
    return jnp.dot(x, w, preferred_element_type=acc).astype(x.dtype)


def qwen3_moe(hidden, gate_w, w_gate, w_up, w_down):
    acc = jnp.promote_types(hidden.dtype, jnp.float32)
    num_experts = gate_w.shape[0]
    router_logits = jnp.dot(hidden, gate_w.T, preferred_element_type=acc)
    routing_weights = jax.nn.softmax(router_logits.astype(acc), axis=1)
    routing_weights, selected_experts = jax.lax.top_k(routing_weights, TOP_K)
    routing_weights /= routing_weights.sum(axis=-1, keepdims=True)  # norm_topk_prob
    routing_weights = routing_weights.astype(hidden.dtype)
    final = jnp.zeros_like(hidden)
    for e in range(num_experts):
        weight = jnp.sum(jnp.where(selected_experts == e, routing_weights, 0), axis=-1)  # 0: not routed here
        g = _linear(hidden, w_gate[e], acc)
        u = _linear(hidden, w_up[e], acc)
        h = jax.nn.silu(g.astype(acc)).astype(hidden.dtype) * u
        y = _linear(h, w_down[e], acc) * weight[:, None]
        final = final + y.astype(hidden.dtype)
    return final
