"""The MLA decode kernel (tpudiag/kernels/mla_decode.py) beyond `kernels verify`'s cases: with the
up-projections absorbed it computes DeepSeek's attention as written (keys and values projected
per head from the latent, checked in float64 numpy), and bad shapes are refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpudiag.kernels import mla_decode as mla


def test_absorbed_attention_is_the_projected_attention():
    """One sequence of 40 tokens in 3 pages, 4 heads, latent 128, RoPE 64 (padded to 128), no-RoPE
    head dim 32, value head dim 48. The oracle projects K and V per head from the latent (DeepSeek's
    W_UK, W_UV) in float64 numpy; the kernel gets q @ W_UK (absorbed) and its output goes through W_UV."""
    rng = np.random.default_rng(0)
    t, h, lat, rope, dn, dv, page = 40, 4, 128, 64, 32, 48, 16
    c = rng.standard_normal((t, lat))
    k_pe = rng.standard_normal((t, rope))
    w_uk = rng.standard_normal((h, lat, dn)) / np.sqrt(lat)
    w_uv = rng.standard_normal((h, lat, dv)) / np.sqrt(lat)
    q_nope = rng.standard_normal((h, dn))
    q_pe = rng.standard_normal((h, rope))
    scale = 1.0 / np.sqrt(dn + rope)
    # oracle: attention as the model writes it
    k = np.einsum("tl,hld->htd", c, w_uk)
    v = np.einsum("tl,hld->htd", c, w_uv)
    s = (np.einsum("hd,htd->ht", q_nope, k) + q_pe @ k_pe.T) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("ht,htd->hd", p, v)
    # the kernel: absorbed query, [latent | RoPE key | zeros] rows in shuffled pages
    width = mla.padded_width(lat, rope)
    rows = np.zeros((3 * page, width))
    rows[:t, :lat], rows[:t, lat:lat + rope] = c, k_pe
    pool = np.zeros((5, page, width))
    table = np.array([[4, 0, 2]], np.int32)
    for j, pg in enumerate(table[0]):
        pool[pg] = rows[j * page:(j + 1) * page]
    q = np.zeros((1, h, width))
    q[0, :, :lat] = np.einsum("hld,hd->hl", w_uk, q_nope)
    q[0, :, lat:lat + rope] = q_pe
    out = mla.mla_decode(jnp.asarray(q, jnp.float32), jnp.asarray(pool, jnp.float32), jnp.array([t], jnp.int32),
                         jnp.asarray(table), latent=lat, sm_scale=float(scale),
                         block_sizes=mla.BlockSizes(pages_per_block=2), interpret=True)
    got = np.einsum("hl,hld->hd", np.asarray(out, np.float64)[0], w_uv)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_the_row_width_pads_rope_to_whole_lanes():
    assert mla.padded_width(512, 64) == 640
    assert mla.padded_width(256, 128) == 384


@pytest.mark.parametrize("q_shape,pool_shape,latent,says", [
    ((2, 4, 576), (8, 16, 576), 512, "must be a multiple of 128"),
    ((2, 4, 640), (8, 16, 512), 512, "differ"),
    ((2, 4, 640), (8, 16, 640), 640, "latent must be between 0 and L \\+ R = 640"),
    ((2, 640), (8, 16, 640), 512, r"q must be \[B, H, W\]"),
])
def test_bad_shapes_are_refused_by_name(q_shape, pool_shape, latent, says):
    with pytest.raises(ValueError, match=says):
        mla.mla_decode(jnp.zeros(q_shape, jnp.bfloat16), jnp.zeros(pool_shape, jnp.bfloat16),
                       jnp.zeros((2,), jnp.int32), jnp.zeros((2, 4), jnp.int32), latent=latent, interpret=True)


def test_the_default_blocks_stream_long_pages_a_whole_production_sequence_at_a_time():
    """At tpu-inference's 1024-token pages the production context (2048) is one block through a
    3-slot stream (129.9 us on a v5e, against 136.9 at one page a block); 16-token pages take blocks
    of as many tokens through the 2 slots that were fastest for them (202.5 us; 3 slots slower)."""
    big = mla.default_blocks(mla.PROD["page_size"])
    assert big.pages_per_block * mla.PROD["page_size"] == mla.PROD["context"] and big.slots == 3
    small = mla.default_blocks(16)
    assert small.pages_per_block * 16 == mla.PROD["context"] and small.slots == 2
    assert mla.bench().blocks == str(big)
