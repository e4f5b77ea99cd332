"""The fused residual RMSNorm: its verify cases (interpret mode against the reference and float64, gradients of
x, residual and weight included), the reference against a naive float64 loop, the errors raised before tracing,
leading batch dimensions, and one AOT compile for v5e of the forward and backward kernels proving both lower
through Mosaic with their CostEstimate bytes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import rmsnorm as RN
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(RN.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}
    # every case checks the gradients of x, residual and weight
    for c in res.cases:
        assert {k.what.split(" ")[0] for k in c.checks} >= {"grad[0]", "grad[1]", "grad[2]"}, c.label


def test_reference_matches_a_naive_float64_loop():
    rng = np.random.default_rng(4)
    n, d, eps = 5, 24, 1e-5
    x, r = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    w = 1.0 + 0.3 * rng.standard_normal(d)
    with jax.enable_x64():
        normed, h = RN.reference(jnp.asarray(x), jnp.asarray(r), jnp.asarray(w), eps=eps)
        assert normed.dtype == h.dtype == jnp.float64
    want_h = np.zeros((n, d))
    want = np.zeros((n, d))
    for i in range(n):
        row = [x[i, j] + r[i, j] for j in range(d)]
        scale = 1.0 / math.sqrt(sum(v * v for v in row) / d + eps)
        for j in range(d):
            want_h[i, j] = row[j]
            want[i, j] = row[j] * scale * w[j]
    np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(np.asarray(normed), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw,match", [(dict(block_rows=0), "block_rows"), (dict(block_rows=12), "multiple of 8"),
                                      (dict(block_rows_bwd=-8), "block_rows_bwd"),
                                      (dict(block_rows=64.0), "block_rows"), (dict(block_rows_bwd=True), "int")])
def test_block_sizes_validate_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        RN.BlockSizes(**kw)


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("x,r,w,kw,match", [
    (_sds((8, 128)), _sds((8, 64)), _sds((128,)), {}, "residual shape"),
    (_sds((8, 128)), _sds((8, 128), jnp.float32), _sds((128,)), {}, "residual dtype"),
    (_sds((8, 128)), _sds((8, 128)), _sds((64,)), {}, r"weight must be \[D\]"),
    (_sds((8, 128), jnp.int32), _sds((8, 128), jnp.int32), _sds((128,)), {}, "floating"),
    (_sds((8, 128)), _sds((8, 128)), _sds((128,)), {"eps": -1.0}, "eps"),
    (_sds((8, 128)), _sds((8, 128)), _sds((128,)), {"block_sizes": (64, 64)}, "BlockSizes"),
])
def test_shape_errors_are_value_errors_before_tracing(x, r, w, kw, match):
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda *a: RN.rmsnorm_residual(*a, **kw), x, r, w)


def test_leading_dimensions_are_rows():
    kx, kr, kw = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(kx, (2, 11, 128), jnp.float32)
    r = jax.random.normal(kr, (2, 11, 128), jnp.float32)
    w = jax.random.normal(kw, (128,), jnp.float32)
    got = RN.rmsnorm_residual(x, r, w, block_sizes=RN.BlockSizes(8, 8), interpret=True)
    want = RN.reference(x, r, w)
    for g, e in zip(got, want):
        assert g.shape == (2, 11, 128)
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=2e-5, atol=2e-5)


def test_aot_compile_for_v5e_lowers_forward_and_backward_through_mosaic(tmp_path):
    n, d = 200, 512  # 200 rows: a partial last block in both kernels
    bs = RN.BlockSizes(block_rows=64, block_rows_bwd=64)

    def rmsnorm_step(x, r, w, ct):
        (normed, h), vjp = jax.vjp(lambda x, r, w: RN.rmsnorm_residual(x, r, w, block_sizes=bs), x, r, w)
        dx, _, dw = vjp((ct, ct))
        return normed, h, dx, dw

    res = tpudiag.compile(rmsnorm_step, _sds((n, d)), _sds((n, d)), _sds((d,)), _sds((n, d)), target="v5e",
                          out=tmp_path / "run", static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    calls = {o["name"].split(".")[0]: o for o in mod["ops"] if o["opcode"] == "custom-call"}
    assert set(calls) == {"rmsnorm_residual_fwd", "rmsnorm_residual_bwd"}
    # CostEstimate: forward reads x, residual and writes normed, new_residual (plus weight once); backward reads
    # h, d(normed), d(new_residual), writes d(x) once, plus weight and one f32 dweight row per block (4 blocks).
    assert calls["rmsnorm_residual_fwd"]["bytes_accessed"] == 4 * n * d * 2 + d * 2
    assert calls["rmsnorm_residual_bwd"]["bytes_accessed"] == 4 * n * d * 2 + d * 2 + 4 * d * 4
