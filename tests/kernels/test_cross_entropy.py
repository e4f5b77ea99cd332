"""The large-vocabulary cross-entropy kernel: its verify cases (interpret mode against the reference and
float64, dlogits included), the reference against a naive float64 loop, the errors raised before tracing,
and one AOT compile for v5e of the loss and its gradient proving both kernels lower through Mosaic with
their CostEstimate bytes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import cross_entropy as CE
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(CE.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}
    for c in res.cases:  # every case checks dlogits against the reference and float64
        assert {k.what for k in c.checks} >= {"grad[0] kernel vs reference", "grad[0] kernel vs float64"}, c.label


def test_reference_matches_a_naive_float64_loop():
    rng = np.random.default_rng(7)
    n, v = 6, 37
    x = 50.0 * rng.standard_normal((n, v))  # spread wide enough that a missing max-shift would overflow exp
    labels = rng.integers(0, v, n)
    labels[2] = -1  # ignored row
    with jax.enable_x64():
        got = CE.reference(jnp.asarray(x), jnp.asarray(labels, jnp.int32))
        assert got.dtype == jnp.float64
    want = np.zeros(n)
    for i in range(n):
        if labels[i] < 0:
            continue
        m = max(x[i])
        lse = m + math.log(sum(math.exp(x[i, j] - m) for j in range(v)))
        want[i] = lse - x[i, labels[i]]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-12)


def test_the_plain_version_and_the_kernel_agree_with_the_reference():
    k1, k2 = jax.random.split(jax.random.key(3))
    x = 4.0 * jax.random.normal(k1, (24, 640), jnp.float32)
    y = jax.random.randint(k2, (24,), 0, 640, jnp.int32)
    want = np.asarray(CE.reference(x, y))
    np.testing.assert_allclose(np.asarray(CE.xla_cross_entropy(x, y)), want, rtol=1e-5, atol=1e-5)
    got = CE.cross_entropy(x, y, block_sizes=CE.BlockSizes(16, 256, 16, 256), interpret=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kw,match", [(dict(block_rows=8), "multiple of 16"), (dict(block_rows=0), "block_rows"),
                                      (dict(block_vocab=1000), "multiple of 128"),
                                      (dict(block_vocab_bwd=64), "block_vocab_bwd"),
                                      (dict(block_rows_bwd=32.0), "block_rows_bwd")])
def test_block_sizes_validate_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        CE.BlockSizes(**kw)


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("x,y,kw,match", [
    (_sds((8, 128, 2)), _sds((8,), jnp.int32), {}, r"\[rows, vocab\]"),
    (_sds((8, 128), jnp.int32), _sds((8,), jnp.int32), {}, "floating"),
    (_sds((8, 128)), _sds((9,), jnp.int32), {}, r"labels must be \[rows=8\]"),
    (_sds((8, 128)), _sds((8,), jnp.float32), {}, "integers"),
    (_sds((8, 128)), _sds((8,), jnp.int32), {"block_sizes": (16, 128)}, "BlockSizes"),
])
def test_shape_errors_are_value_errors_before_tracing(x, y, kw, match):
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda a, b: CE.cross_entropy(a, b, **kw), x, y)


def test_aot_compile_for_v5e_lowers_forward_and_backward_through_mosaic(tmp_path):
    n, v = 200, 5000  # neither a block multiple: partial row blocks and a masked last vocab block
    bs = CE.BlockSizes(64, 2048, 64, 1024)

    def loss_and_grad(logits, labels, g):
        loss, vjp = jax.vjp(lambda x: CE.cross_entropy(x, labels, block_sizes=bs), logits)
        return loss, vjp(g)[0]

    res = tpudiag.compile(loss_and_grad, _sds((n, v)), _sds((n,), jnp.int32), _sds((n,), jnp.float32),
                          target="v5e", out=tmp_path / "run", static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    calls = {o["name"].split(".")[0]: o for o in mod["ops"] if o["opcode"] == "custom-call"}
    assert set(calls) == {"cross_entropy_fwd", "cross_entropy_bwd"}
    # CostEstimate: forward reads the logits once (+ labels in, loss/m/log l out); backward reads them
    # and writes dlogits (+ labels, m, log l, g in).
    assert calls["cross_entropy_fwd"]["bytes_accessed"] == n * v * 2 + 4 * n * 4
    assert calls["cross_entropy_bwd"]["bytes_accessed"] == 2 * n * v * 2 + 4 * n * 4
