"""The paged attention kernel: its verify cases (TPU interpret mode against the reference and
float64), zero-length rows as exact zeros, the reference against a naive float64 loop, the errors
raised before tracing, and one AOT compile for v5e proving it lowers through Mosaic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import paged_attention as PA
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(PA.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}


def test_zero_length_sequences_are_exact_zeros_and_the_rest_is_not():
    case = next(c for c in PA.SPEC.cases() if c.label.startswith("zero-length"))
    args = case.make_args(jax.random.key(3))
    lengths = np.asarray(args[3])
    out = np.asarray(PA.paged_attention(*args, interpret=True, **case.params))
    assert (out[lengths == 0] == 0).all()
    assert np.abs(out[lengths > 0]).min(axis=-1).max() > 0


def _naive(q, k_pages, v_pages, lengths, table, sm_scale):
    """Sequence by sequence, head by head, in float64 numpy."""
    q, k_pages, v_pages = (np.asarray(a, np.float64) for a in (q, k_pages, v_pages))
    batch, heads, dim = q.shape
    kv_heads, _, page, _ = k_pages.shape
    out = np.zeros_like(q)
    for b in range(batch):
        n = int(lengths[b])
        if n == 0:
            continue
        pages = [int(p) for p in table[b][: -(-n // page)]]
        for h in range(heads):
            kvh = h // (heads // kv_heads)
            k = np.concatenate([k_pages[kvh, p] for p in pages])[:n]
            v = np.concatenate([v_pages[kvh, p] for p in pages])[:n]
            s = k @ q[b, h] * sm_scale
            p = np.exp(s - s.max())
            out[b, h] = p @ v / p.sum()
    return out


@pytest.mark.parametrize("lengths", [[5, 0, 32, 17], [0, 0, 0, 0], [1, 2, 3, 31]])
def test_reference_matches_a_naive_float64_loop(lengths):
    kq, kk, kv = jax.random.split(jax.random.key(5), 3)
    batch, heads, kv_heads, dim, page, pps = 4, 6, 2, 8, 4, 8
    table = np.asarray(jax.random.permutation(jax.random.key(6), batch * pps + 2))[: batch * pps]
    table = table.reshape(batch, pps).astype(np.int32)
    with jax.enable_x64():
        q = jax.random.normal(kq, (batch, heads, dim), jnp.float64)
        k = jax.random.normal(kk, (kv_heads, batch * pps + 2, page, dim), jnp.float64)
        v = jax.random.normal(kv, (kv_heads, batch * pps + 2, page, dim), jnp.float64)
        ref = jax.jit(PA.reference, static_argnames="sm_scale")  # one compile, not one per op
        got = ref(q, k, v, jnp.asarray(lengths, jnp.int32), jnp.asarray(table), sm_scale=0.3)
        assert got.dtype == jnp.float64
        want = _naive(q, k, v, lengths, table, 0.3)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [0, -1, 2.0, None])
def test_block_sizes_validate_themselves(bad):
    with pytest.raises(ValueError, match="pages_per_block"):
        PA.BlockSizes(pages_per_block=bad)


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("q,k,v,lengths,table,match", [
    ((2, 6, 128), (4, 8, 16, 128), (4, 8, 16, 128), (2,), (2, 4), "multiple of kv_heads"),
    ((2, 8, 64), (4, 8, 16, 128), (4, 8, 16, 128), (2,), (2, 4), "head_dim"),
    ((2, 8, 128), (4, 8, 16, 128), (4, 9, 16, 128), (2,), (2, 4), "same shape"),
    ((2, 8, 128), (4, 8, 16, 128), (4, 8, 16, 128), (3,), (2, 4), "lengths"),
    ((2, 8, 128), (4, 8, 16, 128), (4, 8, 16, 128), (2,), (3, 4), "page_table"),
    ((2, 8, 128), (8, 16, 128), (8, 16, 128), (2,), (2, 4), "k_pages"),
])
def test_shape_errors_are_value_errors_before_tracing(q, k, v, lengths, table, match):
    args = (_sds(q), _sds(k), _sds(v), _sds(lengths, jnp.int32), _sds(table, jnp.int32))
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(PA.paged_attention, *args)


def test_lengths_must_be_int32():
    args = (_sds((2, 8, 128)), _sds((4, 8, 16, 128)), _sds((4, 8, 16, 128)), _sds((2,), jnp.float32),
            _sds((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="int32"):
        jax.eval_shape(PA.paged_attention, *args)


def test_aot_compile_for_v5e_lowers_through_mosaic(tmp_path):
    batch, heads, kv_heads, dim, page, pps = 4, 16, 4, 128, 16, 8
    args = (_sds((batch, heads, dim)), _sds((kv_heads, batch * pps, page, dim)),
            _sds((kv_heads, batch * pps, page, dim)), _sds((batch,), jnp.int32), _sds((batch, pps), jnp.int32))

    def paged_attention_small(q, k, v, lengths, table):
        return PA.paged_attention(q, k, v, lengths, table, block_sizes=PA.BlockSizes(4))

    res = tpudiag.compile(paged_attention_small, *args, target="v5e", out=tmp_path / "run",
                          static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    (call,) = [o for o in mod["ops"] if o["opcode"] == "custom-call"]
    # The CostEstimate reaches the report: K and V of every page the table references (full
    # lengths), q and out, the lengths and the table.
    kv = 2 * batch * pps * kv_heads * page * dim * 2
    assert call["bytes_accessed"] == kv + 2 * batch * heads * dim * 2 + 4 * (batch + batch * pps)
