"""The int8 weight-only matmul: its verify cases (interpret mode against the reference and float64,
gradients for x and the scales included), the reference against a naive float64 loop, the errors
raised before tracing, the CostEstimate's byte count, and one AOT compile for v5e of the forward and
the dx kernel proving both lower through Mosaic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import int8_matmul as IM
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(IM.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}
    dx = [c.dtype for c in res.cases if any(k.what.startswith("grad[0]") for k in c.checks)]
    assert sorted(dx) == ["bfloat16", "float32"]


def test_scales_gradient_matches_float64_relative_to_its_terms():
    """dscales[n] = sum_m g[m, n] (x @ w)[m, n]: terms of ~1e3 that cancel, so the error is bounded
    relative to sum_m |g (x @ w)|, not to the result (which is why verify does not check it)."""
    case = IM.SPEC.cases()[0]
    x, w, s = case.make_args(jax.random.key(12))
    g = jax.random.normal(jax.random.key(13), (x.shape[0], w.shape[1]), jnp.float32)
    loss = lambda s: jnp.sum(IM.int8_matmul(x, w, s, interpret=True, **case.params) * g)
    got = np.asarray(jax.grad(loss)(s), np.float64)
    xw = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    gn = np.asarray(g, np.float64)
    want, scale = (gn * xw).sum(axis=0), np.abs(gn * xw).sum(axis=0)
    assert np.abs(want).max() > 1  # not trivially zero
    np.testing.assert_array_less(np.abs(got - want), 1e-6 * scale)


def test_reference_matches_a_naive_float64_loop():
    kx, kw, ks = jax.random.split(jax.random.key(8), 3)
    m, k, n = 5, 7, 6
    w = np.asarray(jax.random.randint(kw, (k, n), -127, 128, jnp.int32), np.int8)
    with jax.enable_x64():
        x = jax.random.normal(kx, (m, k), jnp.float64)
        s = jax.random.uniform(ks, (n,), jnp.float64, 1e-3, 1e-2)
        got = jax.jit(IM.reference)(x, jnp.asarray(w), s)
        assert got.dtype == jnp.float64
    xn, sn = np.asarray(x), np.asarray(s)
    want = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            want[i, j] = sum(xn[i, kk] * float(w[kk, j]) * sn[j] for kk in range(k))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw,match", [(dict(block_m=0), "block_m"), (dict(block_m=24), "block_m"),
                                      (dict(block_n=100), "block_n"), (dict(block_k=-128), "block_k"),
                                      (dict(block_k=256.0), "block_k")])
def test_block_sizes_validate_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        IM.BlockSizes(**kw)


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("x,w,s,match", [
    (_sds((4, 64)), _sds((32, 128), jnp.int8), _sds((128,), jnp.float32), "contraction"),
    (_sds((4, 64)), _sds((64, 128)), _sds((128,), jnp.float32), "int8"),
    (_sds((4, 64)), _sds((64, 128), jnp.int8), _sds((64,), jnp.float32), "scales"),
    (_sds((4, 2, 64)), _sds((64, 128), jnp.int8), _sds((128,), jnp.float32), r"\[M, K\]"),
    (_sds((4, 64), jnp.int32), _sds((64, 128), jnp.int8), _sds((128,), jnp.float32), "floating"),
])
def test_shape_errors_are_value_errors_before_tracing(x, w, s, match):
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(IM.int8_matmul, x, w, s)


def test_aot_compile_for_v5e_lowers_forward_and_dx_through_mosaic(tmp_path):
    m, k, n = 64, 512, 1024
    bs = IM.BlockSizes(block_m=64, block_n=256, block_k=256)
    args = (_sds((m, k)), _sds((k, n), jnp.int8), _sds((n,), jnp.float32))

    def int8_matmul_fwd_dx(x, w, s):
        out, vjp = jax.vjp(lambda x: IM.int8_matmul(x, w, s, block_sizes=bs), x)
        return out, vjp(jnp.ones_like(out))[0]

    res = tpudiag.compile(int8_matmul_fwd_dx, *args, target="v5e", out=tmp_path / "run",
                          static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    calls = {o["name"].split(".")[0]: o for o in mod["ops"] if o["opcode"] == "custom-call"}
    assert set(calls) == {"tpudiag_int8_matmul", "tpudiag_int8_matmul_dx"}
    # The forward's CostEstimate: M is one block and K spans 2 blocks, so x is re-read for each of
    # the 4 N blocks while w (and its scales) is read once; the output is written once.
    assert calls["tpudiag_int8_matmul"]["bytes_accessed"] == 4 * m * k * 2 + (k * n + 4 * n) + m * n * 2
    assert calls["tpudiag_int8_matmul"]["flops"] == 2 * m * k * n
