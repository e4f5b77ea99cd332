"""The mla_decode task's reference: DeepSeek V3's multi-head latent attention in its default
"absorb" form, for one decode token per sequence over a paged cache, adapted to JAX from
deepseek-ai/DeepSeek-V3 at commit 1ea5a1a7ed74, inference/model.py (MIT licence): `MLA.forward`,
the `attn_impl == "absorb"` branch, with the softmax scale of `MLA.__init__` (qk_head_dim^-0.5
times the YaRN mscale 0.1 * mscale * ln(rope_factor) + 1, squared; ModelArgs' rope_factor 40,
mscale 1.0).

Adapted: the query comes in split and rotated (q_nope, q_pe after apply_rotary_emb); the cache is
what the absorb branch caches, kv_cache (kv_norm of the latent, [L]) and pe_cache (the rotated RoPE
key, [R]), but in pages of a shared pool with a page table and per-sequence lengths instead of
[max_batch, max_seq] buffers; wkv_b is given as kv_b_proj's weight [H * (Dn + Dv), L] (no fp8
block scales). Each einsum accumulates in float32 and rounds to the activations' dtype, as torch's
does, except the scores, kept in float32 from the matmul to the softmax; the probabilities are cast
back (`type_as(x)`) before the matmul with the latents; the operands of each einsum are upcast to
float32 first, which multiplies them exactly as a float32-accumulating bf16 matmul does (XLA's CPU
backend refuses some bf16 x bf16 -> f32 batched dots). A sequence of length 0 (an empty batch slot)
gives zeros. A solution may not import or call it."""

import math

import jax
import jax.numpy as jnp

ROPE_FACTOR, MSCALE = 40, 1.0  # ModelArgs.rope_factor, ModelArgs.mscale


def _gather(pages, page_table):
    b, pps = page_table.shape
    return jnp.take(pages, page_table, axis=0).reshape(b, pps * pages.shape[1], pages.shape[2])


def _einsum(spec, a, b, acc):
    return jnp.einsum(spec, a.astype(acc), b.astype(acc))


def mla_decode(q_nope, q_pe, kv_pages, pe_pages, wkv_b, lengths, page_table):
    b, h, dn = q_nope.shape
    kv_lora_rank = kv_pages.shape[-1]
    dt = q_nope.dtype
    acc = jnp.promote_types(dt, jnp.float32)
    mscale = 0.1 * MSCALE * math.log(ROPE_FACTOR) + 1.0
    softmax_scale = (dn + q_pe.shape[-1]) ** -0.5 * mscale * mscale
    wkv_b = wkv_b.reshape(h, -1, kv_lora_rank)
    v_head_dim = wkv_b.shape[1] - dn
    kv_cache = _gather(kv_pages, page_table)  # [B, T, L]
    pe_cache = _gather(pe_pages, page_table)  # [B, T, R]
    q_nope = _einsum("bhd,hdc->bhc", q_nope, wkv_b[:, :dn], acc).astype(dt)
    scores = (_einsum("bhc,btc->bht", q_nope, kv_cache, acc)
              + _einsum("bhr,btr->bht", q_pe, pe_cache, acc)) * softmax_scale
    valid = jnp.arange(kv_cache.shape[1])[None, :] < lengths[:, None]
    scores = jnp.where(valid[:, None, :], scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - jnp.where(jnp.isfinite(m), m, 0.0))
    denom = jnp.sum(p, axis=-1, keepdims=True)
    scores = (p / jnp.where(denom == 0, 1.0, denom)).astype(dt)  # softmax; zeros for an empty slot
    x = _einsum("bht,btc->bhc", scores, kv_cache, acc).astype(dt)
    x = _einsum("bhc,hdc->bhd", x, wkv_b[:, -v_head_dim:], acc)
    return x.astype(dt)
