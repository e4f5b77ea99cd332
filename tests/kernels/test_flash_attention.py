"""Flash attention: its verify cases (interpret mode against the reference and float64, gradients of q, k, v),
the reference against a naive float64 loop, the static tile plans against a brute-force visibility map, fully
masked rows (exact zeros out and back), dominant keys' gradients as accurate as XLA's, the errors raised
before tracing, and one AOT compile for v5e of the
forward and both backward kernels proving they lower through Mosaic with their CostEstimate bytes."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import flash_attention as FA
from tpudiag.kernels.flash_attention_bwd import tile_plan
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(FA.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}
    grads = [c for c in res.cases if any(k.what.startswith("grad[2]") for k in c.checks)]
    assert len(grads) == 4  # q, k and v gradients in four of the seven cases (one with a sliding window)
    assert any("sliding window" in c.label for c in grads)


def _naive(q, k, v, lengths, causal, scale):
    b, h, sq, d = q.shape
    group = h // k.shape[1]
    out = np.zeros((b, h, sq, d))
    for bi, hi, i in itertools.product(range(b), range(h), range(sq)):
        keys = [j for j in range(k.shape[2]) if (lengths is None or j < lengths[bi]) and (not causal or j <= i)]
        if not keys:
            continue  # a row that sees no key: 0
        s = np.array([q[bi, hi, i] @ k[bi, hi // group, j] * scale for j in keys])
        p = np.exp(s - s.max())
        out[bi, hi, i] = (p / p.sum()) @ v[bi, hi // group, keys]
    return out


@pytest.mark.parametrize("causal,lengths", [(True, None), (False, [5, 0]), (True, [9, 3])])
def test_reference_matches_a_naive_float64_loop(causal, lengths):
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(2, 4, 11, 8)), rng.normal(size=(2, 2, 13, 8)), rng.normal(size=(2, 2, 13, 8))
    want = _naive(q, k, v, lengths, causal, 0.3)
    lens = None if lengths is None else jnp.asarray(lengths, jnp.int32)
    with jax.enable_x64():
        got = FA.reference(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), lens, causal=causal, sm_scale=0.3)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    got32 = FA.reference(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), lens, causal=causal, sm_scale=0.3)
    np.testing.assert_allclose(np.asarray(got32), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keys_on_rows", [False, True])
def test_tile_plans_cover_every_visible_pair_and_mask_every_hidden_one(keys_on_rows):
    for bq, bk, rc, cc in [(256, 128, 128, 128), (128, 512, 128, 256), (512, 512, 128, 256), (384, 256, 128, 128)]:
        rows, cols = (bk, bq) if keys_on_rows else (bq, bk)
        rchunk, cchunk = (cc, rc) if keys_on_rows else (rc, cc)
        for d in range(-bq + 128, bk, 128):  # every diagonal offset q_start - k_start a tile can have
            r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
            vis = (r <= c + d) if keys_on_rows else (c <= r + d)  # key position <= query position
            covered = np.zeros_like(vis)
            for chunk in tile_plan(d, rows, cols, rchunk, cchunk, keys_on_rows):
                for sub in chunk.subs:
                    block = (slice(chunk.r0, chunk.r0 + chunk.nr), slice(sub.c0, sub.c0 + sub.nc))
                    assert not covered[block].any(), "sub-tiles overlap"
                    covered[block] = True
                    assert vis[block].any(), f"a dead sub-tile is computed (d={d})"
                    assert sub.masked == (not vis[block].all()), f"wrong mask flag (d={d}, {chunk.r0}, {sub.c0})"
            assert not (vis & ~covered).any(), f"visible pairs left out (bq={bq} bk={bk} d={d})"


def test_fully_masked_rows_give_exact_zeros_and_zero_gradients():
    # The shapes and blocks of the kv_lengths verify case, so the compiled interpret-mode kernels are reused.
    q, k, v = (jax.random.normal(kk, s) for kk, s in zip(jax.random.split(jax.random.key(3), 3),
                                                          [(2, 2, 256, 64), (2, 1, 256, 64), (2, 1, 256, 64)]))
    lens = jnp.array([0, 50], jnp.int32)  # batch 0: no key at all
    bs = FA.BlockSizes(128, 128, 128, 128)
    f = lambda q, k, v: FA.flash_attention(q, k, v, lens, causal=True, block_sizes=bs, interpret=True)
    out = f(q, k, v)
    assert np.all(np.asarray(out[0]) == 0.0) and np.all(np.isfinite(np.asarray(out)))
    assert np.abs(np.asarray(out[1])).max() > 0.1
    ct = jax.random.normal(jax.random.key(4), out.shape)
    grads = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2))(q, k, v)
    for g in grads:
        assert np.all(np.asarray(g[0]) == 0.0) and np.all(np.isfinite(np.asarray(g)))
    assert np.all(np.asarray(grads[1][1, :, 50:]) == 0.0)  # keys past the length get no gradient
    assert np.abs(np.asarray(grads[1][1, :, :50])).max() > 1e-3


def test_outlier_scores_keep_the_backward_as_accurate_as_xla():
    """Rows where one key dominates (q and k with 1% of entries x100, |s| up to 1e4): the backward's
    probability for that key is exactly 1, as the forward's, so dV stays within 2x the float32
    reference's error against float64. With the scale applied before subtracting the max, XLA:CPU
    fused s * c - m into an FMA and dV came out 23x the reference's error."""
    rng = np.random.default_rng(0)

    def outliers(*shape):
        x = rng.standard_normal(shape)
        return np.where(rng.random(shape) < 0.01, 100 * x, x)

    q, k, v, ct = (outliers(1, 1, 256, 64) for _ in range(4))
    bs = FA.BlockSizes(128, 128, 128, 128, compute_q_bwd=128, compute_k_bwd=128)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    _, vjp = jax.vjp(lambda v: FA.flash_attention(f32(q), f32(k), v, causal=True, block_sizes=bs, interpret=True), f32(v))
    _, vjp_ref = jax.vjp(lambda v: FA.reference(f32(q), f32(k), v, causal=True), f32(v))
    (dv,), (dv_ref,) = vjp(f32(ct)), vjp_ref(f32(ct))
    s = np.where(np.tril(np.ones((256, 256), bool)), q[0, 0] @ k[0, 0].T / 8.0, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    dv64 = (p / p.sum(1, keepdims=True)).T @ ct[0, 0]
    err = lambda x: np.linalg.norm(np.asarray(x, np.float64)[0, 0] - dv64) / np.linalg.norm(dv64)
    assert err(dv) <= 2 * err(dv_ref), (err(dv), err(dv_ref))


@pytest.mark.parametrize("scale", [0.0, -0.125, float("inf")])
def test_sm_scale_is_positive(scale):
    with pytest.raises(ValueError, match="sm_scale must be a positive finite number"):
        FA.flash_attention(_z(1, 2, 128, 64), _z(1, 2, 128, 64), _z(1, 2, 128, 64), sm_scale=scale, interpret=True)


@pytest.mark.parametrize("kw,match", [
    (dict(block_q=100), "multiple of 128"),
    (dict(block_k=0), "positive int"),
    (dict(compute_k=192), "multiple of 128"),
    (dict(block_q_dkv=-128), "positive int"),
    (dict(compute_q_bwd=128.0), "positive int"),
])
def test_block_sizes_validate_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        FA.BlockSizes(**kw)


def _z(*shape, dtype=jnp.float32):
    return jnp.ones(shape, dtype)


@pytest.mark.parametrize("q,k,v,lens,match", [
    (_z(2, 64, 8), _z(2, 64, 8), _z(2, 64, 8), None, r"\[B, H, S, D\]"),
    (_z(1, 3, 64, 8), _z(1, 2, 64, 8), _z(1, 2, 64, 8), None, "multiple of k/v heads"),
    (_z(1, 2, 64, 8), _z(1, 2, 64, 16), _z(1, 2, 64, 16), None, "head_dim"),
    (_z(1, 2, 64, 8), _z(1, 2, 64, 8), _z(1, 2, 32, 8), None, "same shape"),
    (_z(1, 2, 64, 8), _z(1, 2, 64, 8), _z(1, 2, 64, 8, dtype=jnp.bfloat16), None, "one dtype"),
    (_z(2, 2, 64, 8), _z(2, 2, 64, 8), _z(2, 2, 64, 8), jnp.array([3], jnp.int32), r"shape \(2,\)"),
    (_z(2, 2, 64, 8), _z(2, 2, 64, 8), _z(2, 2, 64, 8), jnp.array([3.0, 1.0]), "integer"),
])
def test_shape_errors_are_value_errors_before_tracing(q, k, v, lens, match):
    with pytest.raises(ValueError, match=match):
        FA.flash_attention(q, k, v, lens, interpret=True)


@pytest.mark.parametrize("kw", [dict(causal=False, window=64), dict(causal=True, window=0), dict(causal=True, window=2.5)])
def test_a_window_is_a_positive_int_on_causal_attention(kw):
    with pytest.raises(ValueError, match="window must be a positive int with causal=True"):
        FA.flash_attention(_z(1, 2, 128, 64), _z(1, 2, 128, 64), _z(1, 2, 128, 64), interpret=True, **kw)


def test_the_reference_window_matches_a_naive_float64_loop():
    """Query i sees keys i - window < j <= i: the naive loop with the band cut out by hand."""
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(1, 2, 9, 8)), rng.normal(size=(1, 1, 9, 8)), rng.normal(size=(1, 1, 9, 8))
    want = np.zeros_like(q)
    for hi in range(2):
        for i in range(9):
            keys = np.arange(max(0, i - 2), i + 1)  # window 3
            s = q[0, hi, i] @ k[0, 0, keys].T * 0.3
            p = np.exp(s - s.max())
            want[0, hi, i] = (p / p.sum()) @ v[0, 0, keys]
    with jax.enable_x64():
        got = FA.reference(*(jnp.asarray(x) for x in (q, k, v)), causal=True, sm_scale=0.3, window=3)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


def test_aot_compile_for_v5e_lowers_forward_and_backward_through_mosaic(tmp_path):
    b, h, kvh, s, d = 1, 4, 2, 640, 128  # GQA; 640 keys: a padded last block in every pass
    bs = FA.BlockSizes(256, 256, 128, 128)

    def attention_step(q, k, v, ct):
        out, vjp = jax.vjp(lambda q, k, v: FA.flash_attention(q, k, v, causal=True, block_sizes=bs), q, k, v)
        return (out,) + vjp(ct)

    qs = jax.ShapeDtypeStruct((b, h, s, d), jnp.bfloat16)
    kvs = jax.ShapeDtypeStruct((b, kvh, s, d), jnp.bfloat16)
    res = tpudiag.compile(attention_step, qs, kvs, kvs, qs, target="v5e", out=tmp_path / "run",
                          static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    calls = {o["name"].split(".")[0]: o for o in mod["ops"] if o["opcode"] == "custom-call"}
    assert set(calls) == {"flash_attention_fwd", "flash_attention_dkv", "flash_attention_dq"}
    sp = math.ceil(s / 256) * 256  # padded length
    q_bytes, kv_bytes, row_bytes = b * h * sp * d * 2, b * kvh * sp * d * 2, b * h * sp * 4
    # CostEstimate: the minimum traffic. Forward: read q, k, v, write o and the f32 log-sum-exp.
    assert calls["flash_attention_fwd"]["bytes_accessed"] == 2 * q_bytes + 2 * kv_bytes + row_bytes
    # dK/dV: read q, k, v, dO, lse, delta; write dK, dV. dQ: the same reads, write dQ.
    assert calls["flash_attention_dkv"]["bytes_accessed"] == 2 * q_bytes + 4 * kv_bytes + 2 * row_bytes
    assert calls["flash_attention_dq"]["bytes_accessed"] == 3 * q_bytes + 2 * kv_bytes + 2 * row_bytes
