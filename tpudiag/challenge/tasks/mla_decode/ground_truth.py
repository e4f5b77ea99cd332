"""The mla_decode task's ground truth: tpudiag's Pallas kernel (tpudiag.kernels.mla_decode) between
the two absorptions. q_nope times wkv_b's key half is the latent query [B, H, L]; the kernel
attends each head over the cached latents and RoPE keys, reading only the pages a sequence's
length needs; the latent output times wkv_b's value half is the result. The kernel reads rows of
[latent | RoPE key], each part zero-padded to whole 128-lane tiles: the two pools are joined that
way before the call (a serving engine caches them joined; the task gives them apart, so the join
is an XLA copy of the pool). Interpret mode off a TPU."""

import math

import jax
import jax.numpy as jnp

from tpudiag.kernels.mla_decode import mla_decode as _kernel


def _lanes(x, n):
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - x.shape[-1])])


def mla_decode(q_nope, q_pe, kv_pages, pe_pages, wkv_b, lengths, page_table, interpret=None):
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    b, h, dn = q_nope.shape
    r, latent = q_pe.shape[-1], kv_pages.shape[-1]
    dt = q_nope.dtype
    scale = (dn + r) ** -0.5 * (0.1 * math.log(40) + 1.0) ** 2  # DeepSeek V3's YaRN mscale, squared
    # The absorptions in float32 (exact for bf16 operands, as an f32 accumulation of their products;
    # XLA's CPU backend also refuses some bf16 x bf16 -> f32 batched dots on sliced operands).
    w = wkv_b.astype(jnp.float32).reshape(h, -1, latent)  # [H, Dn + Dv, L]
    q_latent = jnp.einsum("bhd,hdc->bhc", q_nope.astype(jnp.float32), w[:, :dn]).astype(dt)
    lp, rp = -(-latent // 128) * 128, -(-r // 128) * 128
    q = jnp.concatenate([_lanes(q_latent, lp), _lanes(q_pe, rp)], axis=-1)
    kv = jnp.concatenate([_lanes(kv_pages, lp), _lanes(pe_pages, rp)], axis=-1)
    o_latent = _kernel(q, kv, lengths, page_table, latent=lp, sm_scale=scale, interpret=interpret)[..., :latent]
    out = jnp.einsum("bhc,hdc->bhd", o_latent.astype(jnp.float32), w[:, dn:])
    return out.astype(dt)
