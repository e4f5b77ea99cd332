"""RoPE on Q and K in one pass: its verify cases (interpret mode against the reference and float64, gradients
included), the reference against a naive float64 loop, tables and positions agreeing, the errors raised before
tracing, and one AOT compile for v5e of the forward and backward kernels (positions and tables) proving they
lower through Mosaic with their CostEstimate bytes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import rope as RP
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(RP.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}
    graded = [c for c in res.cases if any(k.what.startswith("grad[1]") for k in c.checks)]
    assert {c.dtype for c in graded} == {"float32", "bfloat16"}
    # the tables case also checks the gradients of cos and sin
    assert any(any(k.what.startswith("grad[3]") for k in c.checks) for c in res.cases)


def test_reference_matches_a_naive_float64_loop():
    rng = np.random.default_rng(5)
    b, s, h, kvh, d, theta = 2, 3, 2, 1, 8, 10000.0
    q, k = rng.standard_normal((b, s, h, d)), rng.standard_normal((b, s, kvh, d))
    pos = rng.integers(0, 5000, (b, s)).astype(np.int32)
    with jax.enable_x64():
        got_q, got_k = RP.reference(jnp.asarray(q), jnp.asarray(k), jnp.asarray(pos), theta=theta)
        assert got_q.dtype == jnp.float64

    def naive(x):
        out = np.zeros_like(x)
        half = d // 2
        for bi in range(b):
            for si in range(s):
                for hi in range(x.shape[2]):
                    for i in range(half):  # rotate-half: lane i pairs with lane i + D/2
                        a = pos[bi, si] * theta ** (-2.0 * i / d)
                        x1, x2 = x[bi, si, hi, i], x[bi, si, hi, i + half]
                        out[bi, si, hi, i] = x1 * math.cos(a) - x2 * math.sin(a)
                        out[bi, si, hi, i + half] = x2 * math.cos(a) + x1 * math.sin(a)
        return out

    np.testing.assert_allclose(np.asarray(got_q), naive(q), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(got_k), naive(k), rtol=1e-11, atol=1e-11)


def test_tables_and_shared_positions_give_the_positions_result():
    kq, kk, kp = jax.random.split(jax.random.key(1), 3)
    b, s, h, kvh, d = 2, 24, 2, 1, 128
    q = jax.random.normal(kq, (b, s, h, d), jnp.float32)
    k = jax.random.normal(kk, (b, s, kvh, d), jnp.float32)
    pos = jax.random.randint(kp, (s,), 0, 256, jnp.int32)
    bs = RP.BlockSizes(8)
    by_pos = RP.rope(q, k, jnp.broadcast_to(pos, (b, s)), block_sizes=bs, interpret=True)
    by_shared = RP.rope(q, k, pos, block_sizes=bs, interpret=True)
    cos, sin = RP.rope_tables(pos, d)
    by_tables = RP.rope(q, k, cos, sin, block_sizes=bs, interpret=True)
    for a, b_, c in zip(by_pos, by_shared, by_tables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b_))
        # The tables come from another XLA computation, whose inv_freq (a pow) can differ by one f32 ulp from
        # the kernel's: at position 255 that moves an angle by ~1.5e-5 rad.
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw,match", [(dict(block_s=0), "block_s"), (dict(block_s=12), "multiple of 8"),
                                      (dict(block_s=256.0), "block_s"), (dict(block_s=False), "block_s")])
def test_block_sizes_validate_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        RP.BlockSizes(**kw)


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


Q, K, POS = _sds((2, 16, 4, 128)), _sds((2, 16, 2, 128)), _sds((2, 16), jnp.int32)


@pytest.mark.parametrize("args,kw,match", [
    ((_sds((2, 16, 4, 127)), _sds((2, 16, 2, 127)), POS), {}, "even"),
    ((_sds((2, 16, 512)), K, POS), {}, r"\[B, S, heads, D\]"),
    ((Q, _sds((2, 8, 2, 128)), POS), {}, "share B, S and D"),
    ((Q, _sds((2, 16, 2, 128), jnp.float32), POS), {}, "share a dtype"),
    ((Q, K, _sds((2, 16), jnp.float32)), {}, "integers"),
    ((Q, K, _sds((16, 2), jnp.int32)), {}, r"positions must be \[B, S\]"),
    ((Q, K, POS), {"theta": 1.0}, "theta"),
    ((Q, K, _sds((16, 128), jnp.float32), _sds((16, 64), jnp.float32)), {}, "same shape"),
    ((Q, K, _sds((8, 128), jnp.float32), _sds((8, 128), jnp.float32)), {}, r"tables must be \[S, D\]"),
    ((Q, K, POS), {"block_sizes": 256}, "BlockSizes"),
])
def test_shape_errors_are_value_errors_before_tracing(args, kw, match):
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda *a: RP.rope(*a, **kw), *args)


def test_aot_compile_for_v5e_lowers_every_kernel_through_mosaic(tmp_path):
    b, s, h, kvh, d = 2, 200, 8, 2, 128  # 200 positions: a partial last block
    bs = RP.BlockSizes(64)

    def rope_steps(q, k, pos, cos, sin, gq, gk):
        (qp, kp), vjp_pos = jax.vjp(lambda q, k: RP.rope(q, k, pos, block_sizes=bs), q, k)
        (qt, kt), vjp_tab = jax.vjp(lambda q, k: RP.rope(q, k, cos, sin, block_sizes=bs), q, k)
        return qp, kp, vjp_pos((gq, gk)), qt, kt, vjp_tab((gq, gk))

    args = (_sds((b, s, h, d)), _sds((b, s, kvh, d)), _sds((b, s), jnp.int32), _sds((s, d), jnp.float32),
            _sds((s, d), jnp.float32), _sds((b, s, h, d)), _sds((b, s, kvh, d)))
    res = tpudiag.compile(rope_steps, *args, target="v5e", out=tmp_path / "run", static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    calls = [o for o in mod["ops"] if o["opcode"] == "custom-call"]
    names = sorted(o["name"].split(".")[0] for o in calls)
    # positions: forward and the negated-sin backward are the same kernel; tables: forward and adjoint
    assert names == ["rope_qk", "rope_qk", "rope_qk", "rope_qk_adjoint"]
    qk_bytes = 2 * (b * s * h * d + b * s * kvh * d) * 2
    lane_bytes = 2 * d * 4
    got = sorted(o["bytes_accessed"] for o in calls)
    # CostEstimate: q and k read and written once, plus positions (int32) or both f32 tables per batch row
    assert got == sorted([qk_bytes + b * s * 4 + lane_bytes] * 2 + [qk_bytes + 2 * b * s * d * 4 + lane_bytes] * 2)
